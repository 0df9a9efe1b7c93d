"""ksquad's warm pools as the worker claims from them: which pool serves a Run (its RuntimeClass, placement and
credentials, in the template the chart rendered), and the guarded patch that claims a ready pod of a pool's
ReplicaSet for the attempt. A pod is claimed only when the pool's ReplicaSet controls it and it runs that template
(activities.sandboxes.ownership); the pods are picked from the worker's watched copy (activities.sandboxes.warm). A
pool of backend agent-sandbox is claimed through a SandboxClaim (activities.sandboxes.agent_sandbox)."""

import logging
import random
import time
from typing import TYPE_CHECKING

from activities.metrics import SANDBOX_ACQUIRE_FAILURES
from activities.sandboxes.agent_sandbox import AgentSandboxClaims
from activities.sandboxes.manifests import (
    ANNOTATION_TOKEN_SHA256,
    LABEL_ATTEMPT,
    LABEL_POOL,
    LABEL_RUN,
    LABEL_RUN_UID,
    LABEL_STATE,
    PoolRef,
    agent_resources,
    credential_env,
    owner_reference,
    placement_fields,
    pod_ready,
)
from activities.sandboxes.ownership import (
    controlled_by,
    mounted_secrets,
    placed_as,
    spec_difference,
    template_difference,
)
from activities.sandboxes.warm import MAX_KEPT_PER_POOL, WarmPods
from kube import ApiError, Obj, path
from workflows.activity_types import Sandbox
from workflows.contract import ExecutionContract
from workflows.spec import SandboxPolicy

if TYPE_CHECKING:
    from activities.sandboxes.kubernetes import KubernetesSandboxes

log = logging.getLogger(__name__)
CLAIM_TRIES = 3  # guarded patches of one warm pod, each after reading it again
POOL_CACHE_SECONDS = 10.0  # a pool's ReplicaSet is read again after this long, or when a pod differs from it


class WarmPools:
    """The warm pools of one worker's Kubernetes backend (its client, settings and keys)."""

    def __init__(self, sandboxes: "KubernetesSandboxes") -> None:
        self.sandboxes = sandboxes
        self._pools: dict[tuple[str, str], tuple[float, Obj]] = {}  # (namespace, ReplicaSet) -> (read at, it)
        # (namespace, pool) -> its template as the chart rendered it, with the API server's defaults (a dry run)
        self._pinned: dict[tuple[str, str], Obj] = {}
        # The pools' warm pods, watched from the first claim on (activities.sandboxes.warm).
        self.warm_pods = WarmPods(
            sandboxes.kube,
            ((p.namespace, p.name) for p in sandboxes.settings.pools if p.backend == "replicaset"),
        )
        self.claims = AgentSandboxClaims(sandboxes)  # the pools of backend agent-sandbox

    async def close(self) -> None:
        await self.warm_pods.close()

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
            for p in self.sandboxes.settings.pools
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
                listed = await self.sandboxes.kube.list(
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
                    return Sandbox(
                        name=bound["metadata"]["name"], kind="warm", endpoint=self.sandboxes.endpoint(bound)
                    )
        return None

    async def _pool(self, pool: PoolRef, fresh: bool = False) -> Obj | None:
        """The pool's ReplicaSet, as the cluster has it now (cached briefly: one read per claim costs latency)."""
        key = (pool.namespace, pool.replica_set)
        cached = self._pools.get(key)
        if cached is not None and not fresh and time.monotonic() - cached[0] < POOL_CACHE_SECONDS:
            return cached[1]
        try:
            replica_set = await self.sandboxes.kube.get(
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
            made = await self.sandboxes.kube.create(
                path("apps/v1", "replicasets", pool.namespace), body, dry_run=True
            )
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
            template.get("runtimeClassName") == self.sandboxes.settings.runtime_class_name(policy)
            and placed_as(
                template,
                placement_fields(self.sandboxes.settings, placement),
                agent_resources(self.sandboxes.settings, placement),
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
        await self.sandboxes.kube.delete(path("v1", "pods", pool.namespace, name), grace_seconds=0)
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
        annotations = {ANNOTATION_TOKEN_SHA256: self.sandboxes.keys.sandbox_token_sha256(contract.run)}
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
                return await self.sandboxes.kube.patch(url, patch)
            except ApiError as err:
                if err.status == 404:
                    return None  # it went away
                if err.status != 409:
                    raise
            try:
                pod = await self.sandboxes.kube.get(url)
            except ApiError as err:
                if err.status == 404:
                    return None
                raise
            still_free = pod["metadata"].get("labels", {}).get(LABEL_STATE) == "warm"
            if not (still_free and pod_ready(pod) and await self._of_pool(pod, pool, pinned)):
                return None  # someone else took it: try the next one
        return None
