"""The Kubernetes backend: warm pods claimed from pools, else cold Jobs; released and confirmed gone. The agent in a
sandbox answers only the caller holding the attempt's token: its hash goes into the pod's annotations."""

import asyncio
import logging
import random
from collections.abc import Callable

from temporalio.exceptions import ApplicationError

from activities.agents.callers import CallerKeys, process_keys
from activities.sandboxes.manifests import (
    ANNOTATION_CREDENTIALS,
    ANNOTATION_TOKEN_SHA256,
    FATAL_WAITING,
    LABEL_ATTEMPT,
    LABEL_POOL,
    LABEL_RUN,
    LABEL_RUN_UID,
    LABEL_RUNTIME_CLASS,
    LABEL_STATE,
    MAX_OUTPUTS_BYTES,
    SandboxSettings,
    config_key,
    credential_env,
    job_manifest,
    missing_runtime_class,
    owner_reference,
    sandbox_failed,
    small_outputs,
)
from kube import ApiError, Kube, Obj, path
from workflows.activity_types import (
    SANDBOX_MISCONFIGURED,
    OutputsRequest,
    PublishedOutputs,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
)
from workflows.contract import ExecutionContract
from workflows.spec import SandboxPolicy

log = logging.getLogger(__name__)
CLAIM_TRIES = 3  # guarded patches of one warm pod, each after reading it again


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
        self,
        kube: Kube,
        settings: SandboxSettings,
        heartbeat: Callable[..., None] = lambda *_: None,
        keys: CallerKeys | None = None,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.heartbeat = heartbeat
        self.keys = keys or process_keys()

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
            bound = await self._claim(pod, contract, needed)
            if bound is not None:
                log.info("%s: bound warm pod %s", contract.run.name, bound["metadata"]["name"])
                return Sandbox(name=bound["metadata"]["name"], kind="warm", endpoint=self._endpoint(bound))
        return None

    async def _claim(self, pod: Obj, contract: ExecutionContract, needed: set[str]) -> Obj | None:
        """The guarded label patch: 409 when the pod changed since it was read. A kubelet's status update or a
        controller's touch changes it too, so read it again and try while it is still warm, ready and free.
        The patch also gives the pod the hash of the attempt's caller token, which its agent reads (agent.callers)."""
        url = path("v1", "pods", contract.run.namespace, pod["metadata"]["name"])
        labels = {
            LABEL_STATE: "bound",
            LABEL_RUN: contract.run.name,
            LABEL_RUN_UID: contract.run.uid,
            LABEL_ATTEMPT: str(contract.run.attempt),
        }
        annotations = {ANNOTATION_TOKEN_SHA256: self.keys.sandbox_token_sha256(contract.run)}
        for _ in range(CLAIM_TRIES):
            patch = {
                "metadata": {
                    "resourceVersion": pod["metadata"]["resourceVersion"],
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [owner_reference(contract.run)],
                }
            }
            try:
                return await self.kube.patch(url, patch)
            except ApiError as err:
                if err.status == 404:
                    return None  # it went away
                if err.status != 409:
                    raise
            try:
                pod = await self.kube.get(url)
            except ApiError as err:
                if err.status == 404:
                    return None
                raise
            still_free = pod["metadata"].get("labels", {}).get(LABEL_STATE) == "warm"
            if not (still_free and pod_ready(pod) and needed <= _mounted_credentials(pod)):
                return None  # someone else took it: try the next one
        return None

    async def start_cold(self, req: SandboxRequest) -> Sandbox:
        contract = req.contract
        ns = contract.run.namespace
        deadline = req.run_seconds + req.timeout_seconds + 60
        token_sha256 = self.keys.sandbox_token_sha256(contract.run)
        manifest = job_manifest(contract, req.policy, self.settings, deadline, token_sha256)
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
            "data": {config_key(k): v for k, v in req.outputs.items()},
        }
        try:
            await self.kube.create(path("v1", "configmaps", ns), body)
        except ApiError as err:
            if err.status != 409:
                raise
            await self.kube.replace(path("v1", "configmaps", ns, name), body)
        return PublishedOutputs(outputs=small_outputs(req.outputs), config_map=name)


def _mounted_credentials(pod: Obj) -> set[str]:
    annotation = pod["metadata"].get("annotations", {}).get(ANNOTATION_CREDENTIALS, "")
    return {s.strip() for s in annotation.split(",") if s.strip()}
