"""The warm pools' pods as a watch sees them: a claim picks its pod from this copy instead of listing the pool.
Listing every warm pod of the pool for each claim cost the worker ~40 ms of CPU a claim with 60 pods a pool,
more than 2 cores hold at agent-sandbox's 45 claims/s (bench/sandbox_claims.py).

The copy may be stale by a few milliseconds; the claim's guarded patch (the pod's resourceVersion) is what keeps
it right: a pod that changed since the copy saw it is refused with 409, read again, and claimed only if it is
still warm, ready and its pool's. A pod claimed here leaves the copy at once; one claimed by another worker leaves
it when its watch says so (the pod no longer matches ksquad.io/state=warm). Until a namespace's pods are listed,
and after a watch fails until they are listed again, the claim lists them itself."""

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterable

from prometheus_client import Counter as Counted
from prometheus_client import Gauge

from activities.sandboxes.manifests import LABEL_POOL, LABEL_STATE
from kube import Kube, Obj, path, reflect

# Pods kept a pool: a pool's replicas, and room to spare. Past it (someone made pods that look like a pool's, on a
# cluster without ksquad's admission policy) a pod is not kept: the copy, and the worker's memory, stay bounded.
MAX_KEPT_PER_POOL = 512
KEPT = Gauge("ksquad_worker_warm_pods_kept", "warm pool pods the worker's copy holds", ["namespace", "pool"])
NOT_KEPT = Counted(
    "ksquad_worker_warm_pods_not_kept",
    "warm-looking pods past a pool's bound, not kept",
    ["namespace", "pool"],
)


class WarmPods:
    def __init__(self, kube: Kube, pools: Iterable[tuple[str, str]], most: int = MAX_KEPT_PER_POOL) -> None:
        """`pools`: (namespace, pool name) of every pool the worker claims from."""
        self.kube = kube
        self.most = most
        self.pools: dict[str, set[str]] = {}
        for namespace, pool in pools:
            self.pools.setdefault(namespace, set()).add(pool)
        self.namespaces = sorted(self.pools)
        self._pods: dict[str, dict[str, Obj]] = {ns: {} for ns in self.namespaces}  # namespace -> name -> pod
        self._kept: dict[str, Counter[str]] = {
            ns: Counter() for ns in self.namespaces
        }  # namespace -> pool -> n
        self._synced: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Watch the namespaces from now on, in the running event loop (once)."""
        if self._task is None and self.namespaces:
            self._task = asyncio.create_task(self._run(), name="warm-pods")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        await asyncio.gather(*(self._reflect(ns) for ns in self.namespaces))

    def _pool_of(self, namespace: str, pod: Obj) -> str | None:
        pool = (pod["metadata"].get("labels") or {}).get(LABEL_POOL)
        return pool if pool in self.pools[namespace] else None

    def _keep(self, namespace: str, pod: Obj, kept: Counter[str]) -> bool:
        """Whether a pod not yet in the copy goes in: one of our pools', while the pool is under its bound."""
        pool = self._pool_of(namespace, pod)
        if pool is None:
            return False
        if kept[pool] >= self.most:
            NOT_KEPT.labels(namespace, pool).inc()
            return False
        kept[pool] += 1
        return True

    async def _reflect(self, namespace: str) -> None:
        pods, kept = self._pods[namespace], self._kept[namespace]
        listing: Counter[str] = Counter()  # what the list under way keeps, a pool

        def listed(items: list[Obj]) -> None:
            pods.clear()
            pods.update((pod["metadata"]["name"], pod) for pod in items)
            kept.clear()
            kept.update(listing)
            listing.clear()
            self._synced.add(namespace)
            self._count(namespace)

        def changed(kind: str, pod: Obj) -> None:
            name = pod["metadata"]["name"]
            if kind == "DELETED":  # deleted, or no longer warm: bound by a claim
                if pods.pop(name, None) is not None:
                    kept[self._pool_of(namespace, pod) or ""] -= 1
            elif name in pods or self._keep(namespace, pod, kept):
                pods[name] = pod
            self._count(namespace)

        def lost() -> None:
            listing.clear()
            self._synced.discard(namespace)

        selector = f"{LABEL_STATE}=warm,{LABEL_POOL} in ({','.join(sorted(self.pools[namespace]))})"
        await reflect(
            self.kube,
            path("v1", "pods", namespace),
            listed,
            changed,
            lost=lost,
            labels=selector,
            keep=lambda pod: self._keep(namespace, pod, listing),
        )

    def _count(self, namespace: str) -> None:
        for pool in self.pools[namespace]:
            KEPT.labels(namespace, pool).set(self._kept[namespace][pool])

    def of_pool(self, namespace: str, pool: str) -> list[Obj] | None:
        """The warm pods of `pool` as last seen, or None while the namespace's are not known (list them)."""
        if namespace not in self._synced:
            return None
        return [
            pod
            for pod in self._pods[namespace].values()
            if pod["metadata"].get("labels", {}).get(LABEL_POOL) == pool
        ]

    def taken(self, namespace: str, name: str) -> None:
        """The pod is warm no more (claimed here, or found taken): no claim of this worker tries it again."""
        pod = self._pods.get(namespace, {}).pop(name, None)
        if pod is not None:
            self._kept[namespace][self._pool_of(namespace, pod) or ""] -= 1
