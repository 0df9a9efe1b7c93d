"""Sandboxes: where an attempt's agent runs. Backends `kubernetes` (warm pods from pools, else cold Jobs) and
`local` (the reference agent as a local process, for the embedded default).

Kubernetes:
- warm: a pool is a ReplicaSet of ready agent pods labelled `ksquad.io/state=warm`. Claiming one is a single
  merge patch guarded by the pod's resourceVersion (`state=bound`, `run=<run>`, owner = the Run): the pod
  leaves the ReplicaSet's selector, the ReplicaSet makes a replacement, and a second claimer of the same pod
  gets 409 Conflict and moves to the next pod. A warm pod gets its contract in the first A2A message.
- cold: a Job `<run>-exec-<attempt>` owned by the Run: no prompt or input in its spec (the contract comes in the
  first A2A message), credentials by secretKeyRef only,
  non-root, no service-account token, runtimeClassName, resources, a deadline and a TTL. Skills with
  requirements force cold: init containers stage toolchains into a shared volume, sidecars run beside.
- readiness is awaited while heartbeating; pod failures (image pull, unschedulable, OOMKilled, crash,
  refused by admission) end the acquisition with their reason.
- release deletes; with `confirm` (the fence step) it waits until the pod is gone, and fails when it
  cannot tell.
"""

import asyncio
import contextlib
import hashlib
import importlib.metadata
import logging
import os
import random
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.exceptions import ApplicationError

from kube import ApiError, Kube, Obj, Unreachable, path
from workflows.activity_types import (
    SANDBOX_MISCONFIGURED,
    Activity,
    OutputsRequest,
    PublishedOutputs,
    RunRef,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
)
from workflows.contract import CredentialRef, ExecutionContract, ModelRef, RunIdentity
from workflows.spec import SandboxPolicy

log = logging.getLogger(__name__)

RUN_API = "ksquad.io/v1alpha1"
LABEL_RUN = "ksquad.io/run"
LABEL_RUN_UID = "ksquad.io/run-uid"
LABEL_ATTEMPT = "ksquad.io/attempt"
LABEL_STATE = "ksquad.io/state"
LABEL_POOL = "ksquad.io/pool"
LABEL_RUNTIME_CLASS = "ksquad.io/runtime-class"
ANNOTATION_CREDENTIALS = "ksquad.io/credentials"  # the Secrets a warm pool's pods have mounted
TOOLCHAINS_DIR = "/opt/ksquad/toolchains"
SECRETS_DIR = "/var/run/ksquad/secrets"
SANDBOX_FAILED = "SandboxFailed"
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}
MAX_OUTPUTS_BYTES = 512 * 1024  # the outputs ConfigMap (Kubernetes allows 1 MiB per object)
STATUS_OUTPUT_KEYS = 16
STATUS_OUTPUT_CHARS = 256


class ContainerSpec(BaseModel):
    image: str
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class SandboxSettings(BaseModel):
    """How the worker makes sandboxes (chart values -> a ConfigMap -> KSQUAD_SANDBOX_CONFIG)."""

    backend: Literal["kubernetes", "local"] = "kubernetes"
    image: str = f"ghcr.io/ksquad/ksquad-agent:{importlib.metadata.version('ksquad')}"  # the chart sets it
    command: list[str] = Field(default_factory=lambda: ["ksquad-agent"])
    port: int = 8080
    service_account: str = "ksquad-sandbox"
    # Run.spec.sandboxPolicy.runtimeClass -> the RuntimeClass object to use (None: the node's default runtime)
    runtime_classes: dict[str, str | None] = Field(
        default_factory=lambda: {"gvisor": "gvisor", "kata": "kata", "runc": None}
    )
    resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    )
    run_as_user: int = 65532
    node_selector: dict[str, str] = Field(default_factory=dict)
    ttl_seconds_after_finished: int = 300
    unschedulable_grace_seconds: float = 60.0
    pod_creation_grace_seconds: float = 15.0  # a Job with no pod after this long: look for why (FailedCreate)
    release_timeout_seconds: float = 120.0
    termination_grace_seconds: int = 10
    toolchains: dict[str, ContainerSpec] = Field(default_factory=dict)  # staged into TOOLCHAINS_DIR/<name>
    sidecars: dict[str, ContainerSpec] = Field(default_factory=dict)
    poll_seconds: float = 0.25

    @classmethod
    def from_env(cls) -> "SandboxSettings":
        file = os.environ.get("KSQUAD_SANDBOX_CONFIG")
        data = yaml.safe_load(Path(file).read_text()) if file else {}
        if os.environ.get("KSQUAD_SANDBOX_BACKEND"):
            data["backend"] = os.environ["KSQUAD_SANDBOX_BACKEND"]
        return cls.model_validate(data or {})


def sandbox_failed(message: str) -> ApplicationError:
    return ApplicationError(message[:2000], type=SANDBOX_FAILED, non_retryable=True)


def missing_runtime_class(policy: SandboxPolicy, refused: str) -> str | None:
    """The reason to give when a sandbox pod was refused for want of its RuntimeClass, else None."""
    found = re.search(r'RuntimeClass "([^"]+)" not found', refused)
    if not found:
        return None
    name = found.group(1)
    return (
        f'RuntimeClass "{name}" does not exist in this cluster (Run spec.sandboxPolicy.runtimeClass '
        f"{policy.runtime_class} -> chart value sandbox.runtimeClasses.{policy.runtime_class}): install it "
        f'(docs/operating.md, "Sandbox runtimes"), or set sandbox.runtimeClasses.{policy.runtime_class} to a '
        f"RuntimeClass the cluster has (null: the nodes' default runtime)"
    )


def job_name(run: str, attempt: int) -> str:
    """`<run>-exec-<attempt>`, shortened with a hash when the name would pass 63 characters (a label value)."""
    name = f"{run}-exec-{attempt}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(run.encode()).hexdigest()[:8]
    suffix = f"-{digest}-exec-{attempt}"
    return run[: 63 - len(suffix)].rstrip("-") + suffix


def owner_reference(run: RunRef | RunIdentity) -> Obj:
    """The Run owns what is made for it: deleting the Run deletes it."""
    return {
        "apiVersion": RUN_API,
        "kind": "Run",
        "name": run.name,
        "uid": run.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def credential_env(contract: ExecutionContract) -> list[Obj]:
    """Every credential the agent may use, by secretKeyRef: the values never enter the Job's spec."""
    refs = [
        m.credential
        for m in (contract.model, contract.agent.model, contract.agent.fallback_model)
        if isinstance(m, ModelRef) and m.credential
    ]
    if contract.agent.credential:
        refs.append(contract.agent.credential)
    env, seen = [], set()
    for ref in refs:
        if ref.env in seen:
            continue
        seen.add(ref.env)
        env.append(
            {"name": ref.env, "valueFrom": {"secretKeyRef": {"name": ref.secret_name, "key": ref.key}}}
        )
    return env


def job_manifest(
    contract: ExecutionContract,
    policy: SandboxPolicy,
    settings: SandboxSettings,
    active_deadline_seconds: int,
) -> Obj:
    run = contract.run
    name = job_name(run.name, run.attempt)
    labels = {
        LABEL_RUN: run.name,
        LABEL_RUN_UID: run.uid,
        LABEL_ATTEMPT: str(run.attempt),
        "app.kubernetes.io/managed-by": "ksquad",
        "app.kubernetes.io/component": "sandbox",
    }
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[Obj] = [{"name": "tmp", "mountPath": "/tmp"}]
    # Credentials are also mounted (the kubelet keeps mounted Secrets current): a rotated key reaches a
    # running agent, which reads the file before the environment.
    for secret in sorted({e["valueFrom"]["secretKeyRef"]["name"] for e in credential_env(contract)}):
        volumes.append({"name": f"credential-{_dns(secret)}", "secret": {"secretName": secret}})
        mounts.append(
            {"name": f"credential-{_dns(secret)}", "mountPath": f"{SECRETS_DIR}/{secret}", "readOnly": True}
        )
    init_containers: list[Obj] = []
    skills_need = {t for s in contract.agent.skills for t in s.requires.toolchains}
    sidecars_need = {t for s in contract.agent.skills for t in s.requires.sidecars}
    secure = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    if skills_need:
        volumes.append({"name": "toolchains", "emptyDir": {}})
        mounts.append({"name": "toolchains", "mountPath": TOOLCHAINS_DIR, "readOnly": True})
        for toolchain in sorted(skills_need):
            spec = settings.toolchains.get(toolchain)
            if spec is None:
                raise sandbox_failed(
                    f"skill toolchain {toolchain!r} is not configured (sandbox toolchains: "
                    f"{', '.join(sorted(settings.toolchains)) or 'none'})"
                )
            init_containers.append(
                {
                    "name": f"toolchain-{_dns(toolchain)}",
                    "image": spec.image,
                    "command": spec.command,
                    "args": spec.args,
                    "env": [
                        {"name": "KSQUAD_TOOLCHAIN_DIR", "value": f"{TOOLCHAINS_DIR}/{toolchain}"},
                        *[{"name": k, "value": v} for k, v in spec.env.items()],
                    ],
                    "volumeMounts": [{"name": "toolchains", "mountPath": TOOLCHAINS_DIR}],
                    "securityContext": secure,
                }
            )
    for sidecar in sorted(sidecars_need):
        spec = settings.sidecars.get(sidecar)
        if spec is None:
            raise sandbox_failed(f"skill sidecar {sidecar!r} is not configured")
        init_containers.append(
            {  # a native sidecar: starts before the agent, runs beside it, ends with it
                "name": f"sidecar-{_dns(sidecar)}",
                "image": spec.image,
                "command": spec.command,
                "args": spec.args,
                "restartPolicy": "Always",
                "env": [{"name": k, "value": v} for k, v in spec.env.items()],
                "securityContext": secure,
            }
        )
    agent = {
        "name": "agent",
        "image": contract.agent.image or settings.image,
        "command": settings.command,
        "args": ["--host", "$(POD_IP)", "--port", str(settings.port)],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "KSQUAD_TOOLCHAINS_DIR", "value": TOOLCHAINS_DIR},
            {"name": "KSQUAD_SECRETS_DIR", "value": SECRETS_DIR},
            *credential_env(contract),
        ],
        "ports": [{"name": "a2a", "containerPort": settings.port}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "a2a"},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "resources": settings.resources,
        "volumeMounts": mounts,
        "securityContext": secure,
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
        "serviceAccountName": settings.service_account,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": init_containers,
        "containers": [agent],
        "volumes": volumes,
    }
    runtime_class = settings.runtime_classes.get(policy.runtime_class, policy.runtime_class)
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    if settings.node_selector:
        pod_spec["nodeSelector"] = settings.node_selector
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": run.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(contract.run)],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": active_deadline_seconds,
            "ttlSecondsAfterFinished": settings.ttl_seconds_after_finished,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _dns(name: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:40] or "x"


def pod_failure(pod: Obj) -> str | None:
    """Why this pod will not become ready, or None while it still may."""
    status = pod.get("status", {})
    name = pod["metadata"]["name"]
    statuses = status.get("initContainerStatuses", []) + status.get("containerStatuses", [])
    for cs in statuses:
        state = cs.get("state", {})
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return f"pod {name}: container {cs['name']}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(
                ": "
            )
        terminated = state.get("terminated") or cs.get("lastState", {}).get("terminated") or {}
        if terminated.get("reason") == "OOMKilled":
            return f"pod {name}: container {cs['name']} was OOMKilled (raise its memory limit)"
        if terminated and terminated.get("exitCode", 0) != 0:
            return f"pod {name}: container {cs['name']} exited with code {terminated['exitCode']} ({terminated.get('reason', 'Error')})"
    if status.get("phase") in ("Failed", "Succeeded"):
        return f"pod {name} ended ({status.get('phase')}: {status.get('reason', '')} {status.get('message', '')})".strip()
    return None


def unschedulable(pod: Obj) -> str | None:
    for condition in pod.get("status", {}).get("conditions", []):
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"pod {pod['metadata']['name']} cannot be scheduled: {condition.get('message', condition.get('reason'))}"
    return None


def pod_ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and bool(pod.get("status", {}).get("podIP")) and not pod["metadata"].get("deletionTimestamp")


class KubernetesSandboxes:
    def __init__(
        self, kube: Kube, settings: SandboxSettings, heartbeat: Callable[..., None] = lambda *_: None
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.heartbeat = heartbeat

    # --- acquire ------------------------------------------------------------------------------------------

    async def acquire(self, req: SandboxRequest) -> Sandbox:
        contract, policy = req.contract, req.policy
        if policy.class_ == "interactive" and not contract.agent.forces_cold and not contract.agent.image:
            warm = await self.bind_warm(contract, policy)
            if warm is not None:
                return warm
        return await self.start_cold(req)

    async def bind_warm(self, contract: ExecutionContract, policy: SandboxPolicy) -> Sandbox | None:
        """Take one ready warm pod of a matching pool, or None. One guarded label patch per pod tried."""
        selector = {LABEL_STATE: "warm", LABEL_RUNTIME_CLASS: policy.runtime_class}
        if policy.pool:
            selector[LABEL_POOL] = policy.pool
        needed = {e["valueFrom"]["secretKeyRef"]["name"] for e in credential_env(contract)}
        pods = (await self.kube.list(path("v1", "pods", contract.run.namespace), labels=selector))["items"]
        candidates = [p for p in pods if pod_ready(p) and needed <= _mounted_credentials(p)]
        random.shuffle(candidates)  # concurrent claimers spread over the pool instead of racing for one pod
        for pod in candidates:
            meta = pod["metadata"]
            patch = {
                "metadata": {
                    # the guard: fails with 409 if anyone else got there
                    "resourceVersion": meta["resourceVersion"],
                    "labels": {
                        LABEL_STATE: "bound",
                        LABEL_RUN: contract.run.name,
                        LABEL_RUN_UID: contract.run.uid,
                        LABEL_ATTEMPT: str(contract.run.attempt),
                    },
                    "ownerReferences": [owner_reference(contract.run)],
                }
            }
            try:
                bound = await self.kube.patch(path("v1", "pods", contract.run.namespace, meta["name"]), patch)
            except ApiError as err:
                if err.status in (409, 404):
                    continue  # someone else took it, or it went away: try the next one
                raise
            log.info("%s: bound warm pod %s", contract.run.name, meta["name"])
            return Sandbox(name=meta["name"], kind="warm", endpoint=self._endpoint(bound))
        return None

    async def start_cold(self, req: SandboxRequest) -> Sandbox:
        contract = req.contract
        ns = contract.run.namespace
        deadline = req.run_seconds + req.timeout_seconds + 60
        manifest = job_manifest(contract, req.policy, self.settings, deadline)
        name = manifest["metadata"]["name"]
        try:
            await self.kube.create(path("batch/v1", "jobs", ns), manifest)
        except ApiError as err:
            if err.status != 409:  # 409: a retried activity made it already
                raise sandbox_failed(f"cannot create Job {ns}/{name}: {err.message}") from None
        pod = await self.wait_ready(ns, name, req.timeout_seconds, req.policy)
        return Sandbox(name=name, kind="cold", endpoint=self._endpoint(pod))

    async def wait_ready(self, namespace: str, job: str, within: float, policy: SandboxPolicy) -> Obj:
        loop = asyncio.get_running_loop()
        start = loop.time()
        unschedulable_since: float | None = None
        last = "no pod yet"
        while loop.time() - start < within:
            self.heartbeat(f"waiting for Job {job}: {last}")
            pods = (await self.kube.list(path("v1", "pods", namespace), labels={"job-name": job}))["items"]
            live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
            for pod in live:
                if pod_ready(pod):
                    ready: Obj = pod
                    return ready
                failure = pod_failure(pod)
                if failure:
                    raise sandbox_failed(failure)
                why = unschedulable(pod)
                if why:
                    unschedulable_since = unschedulable_since or loop.time()
                    if loop.time() - unschedulable_since > self.settings.unschedulable_grace_seconds:
                        raise sandbox_failed(why)
                    last = why
                else:
                    last = f"pod {pod['metadata']['name']} {pod.get('status', {}).get('phase', 'Pending')}"
            if not live:
                await self._job_failure(namespace, job, loop.time() - start, policy)
            await asyncio.sleep(self.settings.poll_seconds)
        raise sandbox_failed(f"Job {namespace}/{job} not ready within {within:.0f}s ({last})")

    async def _job_failure(self, namespace: str, job: str, waited: float, policy: SandboxPolicy) -> None:
        """No pod: the Job failed, or the pod was refused (admission, quota, missing ServiceAccount). A missing
        RuntimeClass fails the run at once; other refusals get a grace period (a ServiceAccount may be coming)."""
        try:
            obj = await self.kube.get(path("batch/v1", "jobs", namespace, job))
        except ApiError as err:
            if err.status == 404:
                raise sandbox_failed(f"Job {namespace}/{job} is gone") from None
            raise
        for condition in obj.get("status", {}).get("conditions", []):
            if condition.get("type") == "Failed" and condition.get("status") == "True":
                raise sandbox_failed(
                    f"Job {namespace}/{job} failed: {condition.get('reason')}: {condition.get('message', '')}"
                )
        if waited < min(1.0, self.settings.pod_creation_grace_seconds):
            return  # the Job controller makes the pod within milliseconds; look at events only when it did not
        events = await self.kube.list(
            path("v1", "events", namespace), fields=f"involvedObject.name={job},involvedObject.kind=Job"
        )
        refused = [e for e in events["items"] if e.get("reason") == "FailedCreate"]
        for event in refused:
            misconfigured = missing_runtime_class(policy, event.get("message", ""))
            if misconfigured:
                raise ApplicationError(misconfigured, type=SANDBOX_MISCONFIGURED, non_retryable=True)
        if refused and waited >= self.settings.pod_creation_grace_seconds:
            raise sandbox_failed(
                f"Job {namespace}/{job} cannot create its pod: {refused[-1].get('message', '')}"
            )

    def _endpoint(self, pod: Obj) -> str:
        return f"http://{pod['status']['podIP']}:{self.settings.port}/"

    # --- release ------------------------------------------------------------------------------------------

    async def release(self, rel: SandboxRelease) -> None:
        ns, name = rel.run.namespace, rel.sandbox.name
        if rel.sandbox.kind == "warm":
            await self.kube.delete(
                path("v1", "pods", ns, name), grace_seconds=self.settings.termination_grace_seconds
            )
            selector = None
        else:
            await self.kube.delete(path("batch/v1", "jobs", ns, name), propagation="Background")
            selector = f"job-name={name}"
        if not rel.confirm:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.release_timeout_seconds
        while loop.time() < deadline:
            self.heartbeat(f"waiting for sandbox {name} to be gone")
            if selector is None:
                try:
                    await self.kube.get(path("v1", "pods", ns, name))
                    gone = False
                except ApiError as err:
                    if err.status != 404:
                        raise
                    gone = True
            else:
                gone = not (await self.kube.list(path("v1", "pods", ns), labels=selector))["items"]
            if gone:
                return
            await asyncio.sleep(self.settings.poll_seconds)
        # Fail closed: a retry must not start while the old sandbox may still act.
        raise ApplicationError(
            f"sandbox {ns}/{name} still exists after {self.settings.release_timeout_seconds:.0f}s",
            type="SandboxNotGone",
        )

    # --- outputs ------------------------------------------------------------------------------------------

    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        """The full outputs in ConfigMap `<run>-outputs` (owned by the Run), a small map for status."""
        size = sum(len(k) + len(v.encode()) for k, v in req.outputs.items())
        if size > MAX_OUTPUTS_BYTES:
            raise ApplicationError(
                f"outputs are {size} bytes, more than the {MAX_OUTPUTS_BYTES} allowed",
                type="OutputsTooLarge",
                non_retryable=True,
            )
        name = f"{req.run.name}-outputs"
        ns = req.run.namespace
        owner = owner_reference(req.run)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "namespace": ns,
                "ownerReferences": [owner],
                "labels": {
                    LABEL_RUN: req.run.name,
                    LABEL_RUN_UID: req.run.uid,
                    LABEL_ATTEMPT: str(req.attempt),
                },
            },
            "data": {_config_key(k): v for k, v in req.outputs.items()},
        }
        try:
            await self.kube.create(path("v1", "configmaps", ns), body)
        except ApiError as err:
            if err.status != 409:
                raise
            await self.kube.replace(path("v1", "configmaps", ns, name), body)
        return PublishedOutputs(outputs=small_outputs(req.outputs), config_map=name)


def small_outputs(outputs: dict[str, str]) -> dict[str, str]:
    """What fits in status.outputs: the first keys, each value shortened (the ConfigMap has them whole)."""
    small = {}
    for key in sorted(outputs)[:STATUS_OUTPUT_KEYS]:
        value = outputs[key]
        small[key] = value if len(value) <= STATUS_OUTPUT_CHARS else value[: STATUS_OUTPUT_CHARS - 1] + "…"
    return small


def _config_key(key: str) -> str:
    return re.sub(r"[^-._a-zA-Z0-9]", "_", key)[:253] or "_"


def _mounted_credentials(pod: Obj) -> set[str]:
    annotation = pod["metadata"].get("annotations", {}).get(ANNOTATION_CREDENTIALS, "")
    return {s.strip() for s in annotation.split(",") if s.strip()}


def _agent_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` while it is a live local agent (not a pid recycled for something else)."""
    try:
        pid = int(pid_file.read_text())
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ")[-1].startswith("Z"):
                return None  # exited, not yet reaped
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return pid if b"agent.server" in cmdline.read() else None
    except (OSError, ValueError):
        return None


# What a local agent inherits from the process that starts it: how to run and reach TLS endpoints, nothing
# else (no API key, cloud credential or token of the developer's environment).
LOCAL_AGENT_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)


@dataclass(frozen=True)
class LocalModel:
    """The model the developer configured for the embedded default, and the key only it may receive."""

    url: str
    credential: CredentialRef
    api_key: str


class LocalSandboxes:
    """The embedded default: the reference agent as a local process on its own loopback address, with a minimal
    environment: the local model's key goes to an agent only when every model of its contract that names that
    key is the local model itself (a ModelEndpoint pointing elsewhere never receives it)."""

    def __init__(
        self,
        settings: SandboxSettings,
        local_model: LocalModel | None = None,
        log_dir: Path | None = None,
        heartbeat: Callable[..., None] = lambda *_: None,
    ) -> None:
        self.settings = settings
        self.local_model = local_model
        self.log_dir = log_dir or Path(".ksquad/sandboxes")
        self.heartbeat = heartbeat
        self.processes: dict[str, asyncio.subprocess.Process] = {}

    def environment(self, contract: ExecutionContract) -> dict[str, str]:
        env = {k: os.environ[k] for k in LOCAL_AGENT_ENV if k in os.environ}
        env["PYTHONUNBUFFERED"] = "1"
        local = self.local_model
        if local is not None:
            models = [
                m
                for m in (contract.model, contract.agent.model, contract.agent.fallback_model)
                if isinstance(m, ModelRef) and m.credential and m.credential.env == local.credential.env
            ]
            if models and all((m.url or "").rstrip("/") == local.url.rstrip("/") for m in models):
                env[local.credential.env] = local.api_key
            elif models:
                log.warning(
                    "%s: the local model's key is not given to a model at %s",
                    contract.run.name,
                    ", ".join(sorted({m.url or "-" for m in models})),
                )
        return env

    async def acquire(self, req: SandboxRequest) -> Sandbox:
        contract = req.contract
        name = job_name(contract.run.name, contract.run.attempt)
        host = "127.0.0.1"
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{contract.run.namespace}_{name}.log").open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent.server",
                "--host",
                host,
                "--port",
                str(port),
                env=self.environment(contract),
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        # The agent outlives this worker (as a Job outlives a worker pod): a restarted worker finds it by this
        # file to stop it at release, and the retried agent activity resubscribes to its task meanwhile.
        self._pid_file(name).write_text(str(process.pid))
        endpoint = f"http://{host}:{port}/"
        deadline = time.monotonic() + req.timeout_seconds
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    raise sandbox_failed(f"local agent {name} exited with {process.returncode}")
                try:
                    if (await http.get(f"{endpoint}readyz", timeout=1)).status_code == 200:
                        return Sandbox(name=name, kind="local", endpoint=endpoint)
                except httpx.TransportError:
                    pass
                self.heartbeat(f"waiting for local agent {name}")
                await asyncio.sleep(0.05)
        process.kill()
        raise sandbox_failed(f"local agent {name} not ready within {req.timeout_seconds}s")

    def _pid_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.pid"

    async def release(self, rel: SandboxRelease) -> None:
        name = rel.sandbox.name
        process = self.processes.pop(name, None)
        pid_file = self._pid_file(name)
        if process is None:
            await self._release_orphan(pid_file)
            return
        pid_file.unlink(missing_ok=True)
        if process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.settings.termination_grace_seconds)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def _release_orphan(self, pid_file: Path) -> None:
        """An agent started by an earlier worker process: SIGTERM, then SIGKILL after the grace period."""
        pid = _agent_pid(pid_file)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                for _ in range(int(self.settings.termination_grace_seconds * 10)):
                    if _agent_pid(pid_file) is None:
                        break
                    await asyncio.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)  # noqa: ASYNC240 (a small local file)

    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        return PublishedOutputs(outputs=small_outputs(req.outputs))


Backend = KubernetesSandboxes | LocalSandboxes


class SandboxActivities:
    """The sandbox activities of the Run workflow, over one backend."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.backend.heartbeat = self._heartbeat

    @staticmethod
    def _heartbeat(*details: Any) -> None:
        if activity.in_activity():
            activity.heartbeat(*details)

    @activity.defn(name=Activity.ACQUIRE_SANDBOX)
    async def acquire_sandbox(self, req: SandboxRequest) -> Sandbox:
        try:
            return await self.backend.acquire(req)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    @activity.defn(name=Activity.RELEASE_SANDBOX)
    async def release_sandbox(self, rel: SandboxRelease) -> None:
        try:
            await self.backend.release(rel)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    @activity.defn(name=Activity.PUBLISH_OUTPUTS)
    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        try:
            return await self.backend.publish_outputs(req)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    def all(self) -> list[Callable[..., Any]]:
        return [self.acquire_sandbox, self.release_sandbox, self.publish_outputs]
