"""Warm sandbox claims against cold acquisitions, on the test cluster (pods in containers of the agent image).

    python -m testbed.isolate python -m bench.sandboxes [--runs N]     (make bench runs it so)

Warm: one guarded label patch on a ready pod of the chart's pool, as the worker's ServiceAccount (the pool's
ReplicaSet read, the pod taken from the worker's watch of the pool). Cold: create a Job, wait for
its pod to be scheduled, started and ready. Both measured in the same run on the same control plane; the
pool is refilled between warm claims so each finds a ready pod. Prints JSON with p50, p99 and cold/warm.
"""

import argparse
import asyncio
import json
import time

from activities.sandboxes import KubernetesSandboxes, pod_ready
from bench.bridge import CRDS
from bench.sandbox_claims import chart_pools, make_runs
from bench.stats import percentiles, report
from kube import Config, Kube, path
from testbed import warrants
from testbed.chart import worker_settings
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE
from workflows.contract import ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import SandboxPolicy

NS = "bench"
POOL = "b"


def contract(run: RunIdentity) -> ExecutionContract:
    model = ModelRef(name="m", url="http://127.0.0.1:9/v1")
    return ExecutionContract(run=run, agent=ResolvedAgent(name="a", model=model), model=model)


async def main(runs: int) -> None:
    plane = ControlPlane()
    plane.start()
    plane.start_node()
    try:
        plane.add_runtime_classes()
        plane.kubectl("apply", "--server-side", "-f", str(CRDS))
        plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
        # The chart's pool and RBAC: claims are checked against the pool's template, and the worker claims as
        # its ServiceAccount.
        values = {
            "sandbox": {"image": AGENT_IMAGE},
            "pools": [{"name": POOL, "namespace": NS, "replicas": 3}],
        }
        docs, worker = chart_pools(plane, NS, values)
        async with (
            Kube(Config.from_kubeconfig(plane.admin_kubeconfig)) as admin,
            Kube(Config.from_kubeconfig(worker)) as kube,
        ):
            owners = await make_runs(admin, "b", 2 * runs, NS)  # a sandbox is owned by its Run
            sandboxes = KubernetesSandboxes(kube, worker_settings(docs))
            warm, cold = [], []
            try:
                for i in range(runs):
                    await wait_warm(admin, 3)
                    warm_owner, cold_owner = owners[2 * i], owners[2 * i + 1]
                    t0 = time.perf_counter()
                    bound = await sandboxes.pools.bind_warm(contract(warm_owner), SandboxPolicy())
                    warm.append((time.perf_counter() - t0) * 1000)
                    assert bound is not None, f"no warm pod bound for claim {i}"
                    t0 = time.perf_counter()
                    made = await sandboxes.jobs.start_cold(
                        warrants.sandbox_request(
                            contract(cold_owner), 60, policy=SandboxPolicy(class_="batch")
                        )
                    )
                    cold.append((time.perf_counter() - t0) * 1000)
                    for sandbox, owner in ((bound, warm_owner), (made, cold_owner)):
                        release = warrants.sandbox_release(contract(owner), sandbox, confirm=False)
                        await sandboxes.release(release)
            finally:
                await sandboxes.close()
    finally:
        plane.stop()
    w, c_ = percentiles(warm), percentiles(cold)
    report(
        "sandboxes",
        {
            "runs": runs,
            "warm_claim": w,
            "cold_acquire": c_,
            "cold_over_warm_p50": round(c_["p50_ms"] / w["p50_ms"], 1),
            "cold_over_warm_p99": round(c_["p99_ms"] / w["p99_ms"], 1),
        },
    )


async def wait_warm(kube: Kube, count: int) -> None:
    for _ in range(600):
        pods = (await kube.list(path("v1", "pods", NS), labels="ksquad.io/state=warm"))["items"]
        if sum(pod_ready(p) for p in pods) >= count:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(json.dumps([p["status"] for p in pods])[:2000])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args().runs))
