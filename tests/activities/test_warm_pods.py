"""The worker's copy of the warm pools' pods stays bounded whatever a namespace holds, tried as a tenant would on a
cluster without ksquad's admission policy (which refuses such pods outright: tests/chart/test_trust.py): 5,000
decoy pods made to look like a pool's warm pods, and as many of a pool the worker does not claim from. The copy
keeps only pods of its own pools, at most its bound a pool; the decoys past it are counted, not kept; the pool's
own pods are still there to claim from the copy, and a claim that must list reads one page."""

import asyncio
import uuid
from typing import Any

from prometheus_client import REGISTRY

from activities.sandboxes.warm import WarmPods
from kube import ApiError, Config, Kube, path
from testbed.controlplane import ControlPlane

DECOYS = 1000  # ten times the bound (bench.noisy measures the worker's copy under 5,000)
BOUND = 100  # the worker's is MAX_KEPT_PER_POOL; smaller here, so the pool's own pods come after it is full


def warm_pod(name: str, pool: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"ksquad.io/state": "warm", "ksquad.io/pool": pool}},
        # No scheduler takes it: the decoys cost the API server and etcd only, as a tenant's would.
        # Shaped as safely as a sandbox (the test bed's audit holds every pod that looks like one to that).
        "spec": {
            "schedulerName": "nobody",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "c",
                    "image": "decoy:1",
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


async def make_pods(kube: Kube, namespace: str, pods: list[dict[str, Any]]) -> None:
    queue = list(pods)

    async def maker() -> None:
        while queue:
            pod = queue.pop()
            try:
                await kube.create(path("v1", "pods", namespace), pod)
            except ApiError as err:
                if err.status != 409:
                    raise

    await asyncio.gather(*(maker() for _ in range(16)))


def not_kept(namespace: str, pool: str) -> float:
    found = REGISTRY.get_sample_value(
        "ksquad_worker_warm_pods_not_kept_total", {"namespace": namespace, "pool": pool}
    )
    return found or 0.0


async def test_decoy_pods_past_a_pools_bound_are_not_kept(cluster: ControlPlane, namespace: str) -> None:
    # Deleting the 1,100 pods at the end is one request the API server answers when all are gone: past the
    # client's usual 30 s on a busy CI machine (it timed out there once).
    async with Kube(Config.from_kubeconfig(cluster.admin_kubeconfig), timeout=300) as kube:
        tag = uuid.uuid4().hex[:6]
        decoys = [warm_pod(f"decoy-{tag}-{i}", "p1") for i in range(DECOYS)]
        elsewhere = [warm_pod(f"other-{tag}-{i}", "not-ours") for i in range(DECOYS // 10)]
        await make_pods(kube, namespace, decoys + elsewhere)

        copy = WarmPods(kube, [(namespace, "p1")], most=BOUND)
        copy.start()
        try:
            for _ in range(300):
                if copy.of_pool(namespace, "p1") is not None:
                    break
                await asyncio.sleep(0.1)
            kept = copy.of_pool(namespace, "p1")
            assert kept is not None, "the copy listed the namespace"
            assert len(kept) == BOUND, f"the copy holds {len(kept)} of the pool's {DECOYS} warm-looking pods"
            assert copy.of_pool(namespace, "not-ours") == [], (
                "a pool the worker does not claim from is not kept"
            )
            assert not_kept(namespace, "p1") >= DECOYS - BOUND

            # A pod claimed or deleted leaves room: the next one seen is kept, up to the bound again.
            gone = kept[0]["metadata"]["name"]
            copy.taken(namespace, gone)
            await kube.delete(path("v1", "pods", namespace, gone))
            newcomer = warm_pod(f"newcomer-{tag}", "p1")
            await make_pods(kube, namespace, [newcomer])
            for _ in range(100):
                names = {p["metadata"]["name"] for p in copy.of_pool(namespace, "p1") or []}
                if f"newcomer-{tag}" in names:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("a pod seen once the pool had room was not kept")
            await make_pods(kube, namespace, [warm_pod(f"past-{tag}", "p1")])
            await asyncio.sleep(1)
            held = copy.of_pool(namespace, "p1") or []
            assert len(held) == BOUND, f"the copy holds {len(held)}, past its bound of {BOUND}"
        finally:
            await copy.close()
            await kube._call(
                "DELETE", path("v1", "pods", namespace), params={"labelSelector": "ksquad.io/state"}
            )
