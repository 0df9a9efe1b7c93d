"""What a sandbox is made of: the settings, the cold Job's manifest, the labels and names, the outputs' shape."""

import hashlib
import importlib.metadata
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field
from temporalio.exceptions import ApplicationError

from agent.callers import POD_ANNOTATIONS_ENV, TOKEN_SHA256_ANNOTATION
from kube import Obj
from workflows.activity_types import (
    RunRef,
)
from workflows.contract import ExecutionContract, RunIdentity
from workflows.spec import Placement, SandboxPolicy

RUN_API = "ksquad.io/v1alpha1"
LABEL_RUN = "ksquad.io/run"
LABEL_RUN_UID = "ksquad.io/run-uid"
LABEL_ATTEMPT = "ksquad.io/attempt"
LABEL_STATE = "ksquad.io/state"
LABEL_POOL = "ksquad.io/pool"
LABEL_RUNTIME_CLASS = "ksquad.io/runtime-class"
ANNOTATION_TOKEN_SHA256 = TOKEN_SHA256_ANNOTATION  # the attempt's caller token's hash (agent.callers)
TOOLCHAINS_DIR = "/opt/ksquad/toolchains"
SECRETS_DIR = "/var/run/ksquad/secrets"
POD_INFO_DIR = (
    "/etc/ksquad/pod"  # a downward-API volume: the pod's annotations, which the kubelet keeps current
)
# What the agent reads its caller's hash from; the chart's pools mount the same (charts/ksquad/templates/pools.yaml).
POD_INFO_VOLUME: Obj = {
    "name": "pod-info",
    "downwardAPI": {"items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]},
}
POD_INFO_ENV: Obj = {"name": POD_ANNOTATIONS_ENV, "value": f"{POD_INFO_DIR}/annotations"}
POOL_PREFIX = "ksquad-pool-"  # a pool's ReplicaSet is ksquad-pool-<name> (charts/ksquad/templates/pools.yaml)
SANDBOX_FAILED = "SandboxFailed"
MAX_OUTPUTS_BYTES = 512 * 1024  # the outputs ConfigMap (Kubernetes allows 1 MiB per object)
STATUS_OUTPUT_KEYS = 16
STATUS_OUTPUT_CHARS = 256


class ContainerSpec(BaseModel):
    image: str
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class PoolRef(BaseModel):
    """A warm pool the chart deploys: the worker claims pods of these ReplicaSets only."""

    name: str
    namespace: str
    runtime_class: str = "gvisor"  # Run.spec.sandboxPolicy.runtimeClass its pods serve
    # Its pod template as the chart rendered it (ksquad.poolTemplate): the worker claims only pods of this template,
    # never what the live ReplicaSet says (an editor of the namespace could change that). None: no claims from it.
    template: dict[str, Any] | None = None
    # replicaset: the chart's ReplicaSet ksquad-pool-<name>, claimed by a guarded patch of a pod; agent-sandbox: a
    # SandboxWarmPool ksquad-pool-<name> of kubernetes-sigs/agent-sandbox, claimed by a SandboxClaim
    # (activities.sandboxes.agent_sandbox).
    backend: Literal["replicaset", "agent-sandbox"] = "replicaset"

    @property
    def replica_set(self) -> str:
        return POOL_PREFIX + self.name


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
    # More environment of every sandbox's agent: the chart's tracing.sandboxes (OTEL_EXPORTER_OTLP_ENDPOINT and the
    # like), so the agent's spans reach the collector. Never a credential: every sandbox's code reads it.
    agent_env: dict[str, str] = Field(default_factory=dict)
    pools: list[PoolRef] = Field(default_factory=list)  # the chart's warm pools (values `pools`)
    poll_seconds: float = 0.25
    # Also write each Run's full outputs into ConfigMap `<run>-outputs` (chart value sandbox.outputsConfigMap). Off
    # by default: the built-in `view` role reads ConfigMaps, and an answer is for those who may read the Run (its
    # status, and its artifacts through ksquad-api).
    outputs_config_map: bool = False

    def runtime_class_name(self, policy: SandboxPolicy) -> str | None:
        """The RuntimeClass object a Run's sandboxPolicy.runtimeClass means (None: the nodes' default runtime)."""
        return self.runtime_classes.get(policy.runtime_class, policy.runtime_class)

    @classmethod
    def from_env(cls) -> "SandboxSettings":
        file = os.environ.get("KSQUAD_SANDBOX_CONFIG")
        data = yaml.safe_load(Path(file).read_text()) if file else {}
        if os.environ.get("KSQUAD_SANDBOX_BACKEND"):
            data["backend"] = os.environ["KSQUAD_SANDBOX_BACKEND"]
        return cls.model_validate(data or {})


def sandbox_failed(message: str) -> ApplicationError:
    return ApplicationError(message[:2000], type=SANDBOX_FAILED, non_retryable=True)


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
    refs = [m.credential for m in contract.models() if m.credential]
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
    caller_token_sha256: str,
) -> Obj:
    """The attempt's Job. Its pod learns the hash of the attempt's caller token from its own annotation (a
    downward-API volume), never the token: only the worker can make that."""
    run = contract.run
    name = job_name(run.name, run.attempt)
    labels = {
        LABEL_RUN: run.name,
        LABEL_RUN_UID: run.uid,
        LABEL_ATTEMPT: str(run.attempt),
        "app.kubernetes.io/managed-by": "ksquad",
        "app.kubernetes.io/component": "sandbox",
    }
    volumes: list[Obj] = [{"name": "tmp", "emptyDir": {}}, POD_INFO_VOLUME]
    mounts: list[Obj] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "pod-info", "mountPath": POD_INFO_DIR, "readOnly": True},
    ]
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
            POD_INFO_ENV,
            *[{"name": k, "value": v} for k, v in sorted(settings.agent_env.items())],
            *credential_env(contract),
        ],
        "ports": [{"name": "a2a", "containerPort": settings.port}],
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": "a2a"},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "resources": agent_resources(settings, contract.agent.placement),
        "volumeMounts": mounts,
        "securityContext": secure,
    }
    pod_spec: Obj = {
        "restartPolicy": "Never",
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
    runtime_class = settings.runtime_class_name(policy)
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    pod_spec.update(placement_fields(settings, contract.agent.placement))
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
            "template": {
                "metadata": {"labels": labels, "annotations": {ANNOTATION_TOKEN_SHA256: caller_token_sha256}},
                "spec": pod_spec,
            },
        },
    }


def placement_fields(settings: SandboxSettings, placement: Placement | None) -> Obj:
    """The pod spec's placement: the chart's ServiceAccount and node selector, with the resolved placement's
    fields over them (a cold Job's pod, and what a warm pool's template must have to serve the run)."""
    placement = placement or Placement()
    fields: Obj = {"serviceAccountName": placement.service_account_name or settings.service_account}
    node_selector = {**settings.node_selector, **placement.node_selector}
    if node_selector:
        fields["nodeSelector"] = node_selector
    if placement.tolerations:
        fields["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in placement.tolerations
        ]
    if placement.affinity:
        fields["affinity"] = placement.affinity
    if placement.priority_class_name:
        fields["priorityClassName"] = placement.priority_class_name
    return fields


def agent_resources(settings: SandboxSettings, placement: Placement | None) -> dict[str, dict[str, str]]:
    """The chart's requests and limits with the placement's over them, key by key (a GPU is a limit)."""
    wanted = placement.resources if placement is not None and placement.resources else None
    if wanted is None:
        return settings.resources
    merged = {kind: dict(values) for kind, values in settings.resources.items()}
    for kind, values in (("requests", wanted.requests), ("limits", wanted.limits)):
        if values:
            merged.setdefault(kind, {}).update(values)
    return merged


def _dns(name: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:40] or "x"


def small_outputs(outputs: dict[str, str]) -> dict[str, str]:
    """What fits in status.outputs: the first keys, each value shortened (the ConfigMap has them whole)."""
    small = {}
    for key in sorted(outputs)[:STATUS_OUTPUT_KEYS]:
        value = outputs[key]
        small[key] = value if len(value) <= STATUS_OUTPUT_CHARS else value[: STATUS_OUTPUT_CHARS - 1] + "…"
    return small


def config_key(key: str) -> str:
    return re.sub(r"[^-._a-zA-Z0-9]", "_", key)[:253] or "_"


def pod_ready(pod: Obj) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and bool(pod.get("status", {}).get("podIP")) and not pod["metadata"].get("deletionTimestamp")
