"""The Kubernetes backend: warm pods claimed from pools, else cold Jobs; released and confirmed gone. A pod is
used only when Kubernetes says it is the attempt's Job's or a pool's (activities.sandboxes.ownership), and the
agent in it answers only the caller holding the attempt's token (its hash goes into the pod's annotations)."""

import asyncio
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.agents.callers import CallerKeys, process_keys
from activities.metrics import SANDBOX_ACQUIRE_FAILURES
from activities.sandboxes.agent_sandbox import AgentSandboxClaims
from activities.sandboxes.manifests import (
    ANNOTATION_TOKEN_SHA256,
    FATAL_WAITING,
    LABEL_ATTEMPT,
    LABEL_POOL,
    LABEL_RUN,
    LABEL_RUN_UID,
    LABEL_STATE,
    MAX_OUTPUTS_BYTES,
    PoolRef,
    SandboxSettings,
    agent_resources,
    config_key,
    credential_env,
    job_manifest,
    missing_runtime_class,
    owner_reference,
    placement_fields,
    pod_ready,
    sandbox_failed,
    small_outputs,
)
from activities.sandboxes.ownership import (
    controlled_by,
    mounted_secrets,
    not_the_attempts_job,
    placed_as,
    spec_difference,
    template_difference,
)
from activities.sandboxes.warm import MAX_KEPT_PER_POOL, WarmPods
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
POOL_CACHE_SECONDS = 10.0  # a pool's ReplicaSet is read again after this long, or when a pod differs from it
# Answers to a delete that say no (Forbidden: RBAC or an admission policy; Invalid; BadRequest), not "not now".
REFUSALS = frozenset({400, 403, 422})
RBAC_SETTLING_SECONDS = (1, 2, 4, 8)  # a 403 from RBAC is asked again after these (see release)


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
        # What an earlier try of this activity recorded in its heartbeat (the Job it made), {} when none.
        self.earlier: Callable[[], dict[str, Any]] = dict
        self.keys = keys or process_keys()
        self._pools: dict[tuple[str, str], tuple[float, Obj]] = {}  # (namespace, ReplicaSet) -> (read at, it)
        # (namespace, pool) -> its template as the chart rendered it, with the API server's defaults (a dry run)
        self._pinned: dict[tuple[str, str], Obj] = {}
        # The pools' warm pods, watched from the first claim on (activities.sandboxes.warm).
        self.warm_pods = WarmPods(
            kube, ((p.namespace, p.name) for p in settings.pools if p.backend == "replicaset")
        )
        self.claims = AgentSandboxClaims(self)  # the pools of backend agent-sandbox

    async def close(self) -> None:
        await self.warm_pods.close()

    # --- acquire ------------------------------------------------------------------------------------------

    async def acquire(self, req: SandboxRequest) -> Sandbox:
        contract, policy = req.contract, req.policy
        if policy.class_ == "interactive" and not contract.agent.forces_cold and not contract.agent.image:
            warm = await self.bind_warm(contract, policy, req.timeout_seconds)
            if warm is not None:
                return warm
        return await self.start_cold(req)

    async def bind_warm(
        self, contract: ExecutionContract, policy: SandboxPolicy, within: float = 120.0
    ) -> Sandbox | None:
        """Take one ready pod of a matching pool, or None. A pool is one of the chart's (the worker's settings):
        its ReplicaSet is read, and only pods it controls, running its template, on the Run's RuntimeClass, with
        the credentials the run needs in that template, are claimed. One guarded patch per pod tried. A pool of
        backend agent-sandbox is claimed through a SandboxClaim (activities.sandboxes.agent_sandbox), waiting at
        most `within` seconds for its sandbox."""
        ns = contract.run.namespace
        pools = [
            p
            for p in self.settings.pools
            if p.namespace == ns
            and p.runtime_class == policy.runtime_class
            and (not policy.pool or p.name == policy.pool)
        ]
        needed = {e["valueFrom"]["secretKeyRef"]["name"] for e in credential_env(contract)}
        random.shuffle(pools)
        self.warm_pods.start()
        for pool in pools:
            pinned = await self._pinned_template(pool)
            if pinned is None or not self._fits(pinned, contract, policy, needed):
                continue
            if pool.backend == "agent-sandbox":
                claimed = await self.claims.bind(pool, pinned, contract, within)
                if claimed is not None:
                    return claimed
                continue
            replica_set = await self._pool(pool)
            if replica_set is None or not self._unchanged(pool, replica_set, pinned):
                continue
            pods = self.warm_pods.of_pool(ns, pool.name)
            if pods is None:  # not watched yet, or the watch is down: ask the API server
                selector = {LABEL_STATE: "warm", LABEL_POOL: pool.name}
                listed = await self.kube.list(
                    path("v1", "pods", ns), labels=selector, limit=MAX_KEPT_PER_POOL
                )
                pods = listed["items"]  # a page: as many as the watch's copy keeps a pool
            candidates = [pod for pod in pods if pod_ready(pod)]
            # Concurrent claimers spread over the pool instead of racing for one pod.
            random.shuffle(candidates)
            for pod in candidates:
                # Compared with the template only when it is next (comparing every pod of the pool on each
                # claim was most of the claim's CPU).
                if not await self._of_pool(pod, pool, pinned):
                    continue
                bound = await self._claim(pod, pool, pinned, contract)
                self.warm_pods.taken(ns, pod["metadata"]["name"])  # bound now, or found taken or gone
                if bound is not None:
                    log.info("%s: bound warm pod %s", contract.run.name, bound["metadata"]["name"])
                    return Sandbox(name=bound["metadata"]["name"], kind="warm", endpoint=self.endpoint(bound))
        return None

    async def _pool(self, pool: PoolRef, fresh: bool = False) -> Obj | None:
        """The pool's ReplicaSet, as the cluster has it now (cached briefly: one read per claim costs latency)."""
        key = (pool.namespace, pool.replica_set)
        cached = self._pools.get(key)
        if cached is not None and not fresh and time.monotonic() - cached[0] < POOL_CACHE_SECONDS:
            return cached[1]
        try:
            replica_set = await self.kube.get(
                path("apps/v1", "replicasets", pool.namespace, pool.replica_set)
            )
        except ApiError as err:
            if err.status == 404:
                self._pools.pop(key, None)
                return None
            raise
        self._pools[key] = (time.monotonic(), replica_set)
        return replica_set

    async def _pinned_template(self, pool: PoolRef) -> Obj | None:
        """The pool's pod template as the chart rendered it (the worker's settings), with the defaults the API
        server gives a ReplicaSet's template: a dry-run create of that ReplicaSet, once per pool (admission lets the
        worker create a ReplicaSet no other way). None: the settings hold no template, or admission refused it; the
        pool is then not claimed from. ApiError 403: the worker may not create ReplicaSets (its Role is not the
        chart's)."""
        key = (pool.namespace, pool.name)
        if key in self._pinned:
            return self._pinned[key]
        if pool.template is None:
            log.warning(
                "pool %s has no template in the worker's settings: no pod of it is claimed", pool.name
            )
            return None
        body = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"generateName": f"{pool.replica_set}-", "labels": {LABEL_POOL: pool.name}},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {LABEL_POOL: pool.name, LABEL_STATE: "warm"}},
                "template": pool.template,
            },
        }
        try:
            made = await self.kube.create(path("apps/v1", "replicasets", pool.namespace), body, dry_run=True)
        except ApiError as err:
            if (
                err.status == 403
            ):  # the worker's Role lacks what the chart gives it: say so, not "no warm pod"
                raise
            log.warning(
                "pool %s: the API server would not default its template (%s): not claimed from",
                pool.name,
                err,
            )
            return None
        pinned: Obj = made["spec"]["template"]
        self._pinned[key] = pinned
        return pinned

    def _unchanged(self, pool: PoolRef, replica_set: Obj, pinned: Obj) -> bool:
        """Whether the pool's ReplicaSet still makes the template the chart rendered (anyone who changed it is
        refused: its pods are not claimed)."""
        live = replica_set["spec"]["template"]
        difference = template_difference(live, pinned)
        if difference is not None:
            SANDBOX_ACQUIRE_FAILURES.labels("pool-template-changed").inc()
            log.warning(
                "pool %s/%s: its ReplicaSet's template is not the one the chart rendered (%s): not claimed from",
                pool.namespace,
                pool.name,
                difference,
            )
            return False
        return True

    def _fits(
        self, pinned: Obj, contract: ExecutionContract, policy: SandboxPolicy, needed: set[str]
    ) -> bool:
        """Whether the pool's template runs on the Run's RuntimeClass, is placed as the Run's sandbox would be (a
        pool per placement), and mounts every credential it needs."""
        template = pinned["spec"]
        placement = contract.agent.placement
        return (
            template.get("runtimeClassName") == self.settings.runtime_class_name(policy)
            and placed_as(
                template,
                placement_fields(self.settings, placement),
                agent_resources(self.settings, placement),
            )
            and needed <= mounted_secrets(template)
        )

    async def _of_pool(self, pod: Obj, pool: PoolRef, pinned: Obj) -> bool:
        """Whether the pool's ReplicaSet controls the pod and the pod runs the pinned template. A pod it controls
        that differs (adopted, or changed since) is deleted, so the ReplicaSet makes one of the template."""
        replica_set = await self._pool(pool)
        if replica_set is None or not controlled_by(pod, "ReplicaSet", replica_set):
            return False
        difference = spec_difference(pod["spec"], pinned["spec"])
        if difference is None:
            return True
        name = pod["metadata"]["name"]
        log.warning(
            "pod %s/%s of pool %s is not its template (%s): deleted",
            pool.namespace,
            name,
            pool.name,
            difference,
        )
        # Never claimed, so it serves nothing: no grace (an adopted pod's own code gets none either).
        await self.kube.delete(path("v1", "pods", pool.namespace, name), grace_seconds=0)
        return False

    async def _claim(self, pod: Obj, pool: PoolRef, pinned: Obj, contract: ExecutionContract) -> Obj | None:
        """The guarded patch: 409 when the pod changed since it was read. A kubelet's status update or a
        controller's touch changes it too, so read it again and try while it is still warm, ready and the pool's.
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
            if not (still_free and pod_ready(pod) and await self._of_pool(pod, pool, pinned)):
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
            job = await self.kube.create(path("batch/v1", "jobs", ns), manifest)
        except ApiError as err:
            if err.status != 409:
                raise sandbox_failed(f"cannot create Job {ns}/{name}: {err.message}") from None
            job = await self._made_earlier(ns, name, contract, token_sha256)
        self.heartbeat({"job": name, "uid": job["metadata"]["uid"]})  # a retried try finds its Job by this
        pod = await self.wait_ready(job, req.timeout_seconds, req.policy)
        return Sandbox(name=name, kind="cold", endpoint=self.endpoint(pod))

    async def _made_earlier(self, ns: str, name: str, contract: ExecutionContract, token_sha256: str) -> Obj:
        """The Job already under the attempt's name: an earlier try of this activity made it, or it is not ours."""
        try:
            job = await self.kube.get(path("batch/v1", "jobs", ns, name))
        except ApiError as err:
            raise sandbox_failed(f"Job {ns}/{name} exists but cannot be read: {err.message}") from None
        recorded = self.earlier().get("uid")
        why = not_the_attempts_job(
            job, contract.run.uid, contract.run.attempt, token_sha256, str(recorded) if recorded else None
        )
        if why:
            raise sandbox_failed(f"Job {ns}/{name} exists and is not this attempt's ({why}): it is not used")
        return job

    async def wait_ready(self, job: Obj, within: float, policy: SandboxPolicy) -> Obj:
        """The Job's pod, once ready: a pod it controls, running its template. A pod that only says so (labelled
        for the Job, or adopted by it, running something else) fails the attempt."""
        namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
        template = job["spec"]["template"]["spec"]
        loop = asyncio.get_running_loop()
        start = loop.time()
        unschedulable_since: float | None = None
        last = "no pod yet"
        while loop.time() - start < within:
            self.heartbeat({"job": name, "uid": job["metadata"]["uid"], "waiting": last})
            pods = (await self.kube.list(path("v1", "pods", namespace), labels={"job-name": name}))["items"]
            live = [
                p for p in pods if not p["metadata"].get("deletionTimestamp") and controlled_by(p, "Job", job)
            ]
            for pod in live:
                difference = spec_difference(pod["spec"], template)
                if difference:
                    raise sandbox_failed(
                        f"pod {pod['metadata']['name']} is controlled by Job {name} but does not run its template "
                        f"({difference}): not used"
                    )
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
                await self._job_failure(namespace, name, loop.time() - start, policy)
            await asyncio.sleep(self.settings.poll_seconds)
        raise sandbox_failed(f"Job {namespace}/{name} not ready within {within:.0f}s ({last})")

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

    def endpoint(self, pod: Obj) -> str:
        return f"http://{pod['status']['podIP']}:{self.settings.port}/"

    # --- release ------------------------------------------------------------------------------------------

    async def release(self, rel: SandboxRelease) -> None:
        if rel.sandbox.kind == "claimed":
            await self.claims.release(rel)
            return
        ns, name = rel.run.namespace, rel.sandbox.name
        for wait in (*RBAC_SETTLING_SECONDS, None):
            try:
                if rel.sandbox.kind == "warm":
                    await self.kube.delete(
                        path("v1", "pods", ns, name), grace_seconds=self.settings.termination_grace_seconds
                    )
                    selector = None
                else:
                    await self.kube.delete(path("batch/v1", "jobs", ns, name), propagation="Background")
                    selector = f"job-name={name}"
                break
            except ApiError as err:
                if err.status not in REFUSALS:
                    raise
                if err.status == 403 and "admission" not in err.message.lower() and wait is not None:
                    # An API server that just started answers before its RBAC caches are filled: RBAC's
                    # "cannot delete" then is not yet its last word. Asked again a few times.
                    self.heartbeat(
                        f"the API server refused to delete sandbox {name}: asking again in {wait} s"
                    )
                    await asyncio.sleep(wait)
                    continue
                # RBAC or an admission policy said no: asking again gets the same answer; the run fails closed.
                raise ApplicationError(
                    f"the API server refused to delete sandbox {ns}/{name}: {err}"[:2000],
                    type="SandboxDeleteRefused",
                    non_retryable=True,
                ) from None
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
                pods = (await self.kube.list(path("v1", "pods", ns), labels=selector))["items"]
                gone = not [p for p in pods if _job_of(p) == name]
            if gone:
                return
            await asyncio.sleep(self.settings.poll_seconds)
        # Fail closed: a retry must not start while the old sandbox may still act. Not retried: this already
        # waited the operator's release timeout, and ten more would keep the Run in a phase that lies for an
        # hour (a Job's pod held by a finalizer or a stuck node does not go by being asked again).
        raise ApplicationError(
            f"sandbox {ns}/{name} still exists after {self.settings.release_timeout_seconds:.0f}s",
            type="SandboxNotGone",
            non_retryable=True,
        )

    # --- outputs ------------------------------------------------------------------------------------------

    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        """A small map for status; with `outputs_config_map`, also the full outputs in ConfigMap `<run>-outputs`
        (owned by the Run)."""
        size = sum(len(k) + len(v.encode()) for k, v in req.outputs.items())
        if size > MAX_OUTPUTS_BYTES:
            raise ApplicationError(
                f"outputs are {size} bytes, more than the {MAX_OUTPUTS_BYTES} allowed",
                type="OutputsTooLarge",
                non_retryable=True,
            )
        if not self.settings.outputs_config_map:
            return PublishedOutputs(outputs=small_outputs(req.outputs))
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


def _job_of(pod: Obj) -> str | None:
    """The Job a pod's controller reference names (a pod anyone labelled job-name=<name> does not count)."""
    for ref in pod["metadata"].get("ownerReferences", []):
        if ref.get("controller") and ref.get("kind") == "Job":
            return str(ref.get("name"))
    return None
