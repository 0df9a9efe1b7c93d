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
from collections.abc import Iterable

from activities.sandboxes.manifests import LABEL_POOL, LABEL_STATE
from kube import Kube, Obj, path, reflect


class WarmPods:
    def __init__(self, kube: Kube, namespaces: Iterable[str]) -> None:
        self.kube = kube
        self.namespaces = sorted(set(namespaces))
        self._pods: dict[str, dict[str, Obj]] = {ns: {} for ns in self.namespaces}  # namespace -> name -> pod
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

    async def _reflect(self, namespace: str) -> None:
        pods = self._pods[namespace]

        def listed(items: list[Obj]) -> None:
            pods.clear()
            pods.update((pod["metadata"]["name"], pod) for pod in items)
            self._synced.add(namespace)

        def changed(kind: str, pod: Obj) -> None:
            if kind == "DELETED":  # deleted, or no longer warm: bound by a claim
                pods.pop(pod["metadata"]["name"], None)
            else:
                pods[pod["metadata"]["name"]] = pod

        await reflect(
            self.kube,
            path("v1", "pods", namespace),
            listed,
            changed,
            lost=lambda: self._synced.discard(namespace),
            labels=f"{LABEL_STATE}=warm",
        )

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
        self._pods.get(namespace, {}).pop(name, None)
