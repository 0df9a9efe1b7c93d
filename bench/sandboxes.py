"""Warm sandbox claims against cold acquisitions, on the test cluster (pods in containers of the agent image).

    python -m testbed.isolate python -m bench.sandboxes [--runs N]     (make bench runs it so)

Warm: one guarded label patch on a ready pool pod (plus the list that finds it). Cold: create a Job, wait for
its pod to be scheduled, started and ready. Both measured in the same run on the same control plane; the
pool is refilled between warm claims so each finds a ready pod. Prints JSON with p50, p99 and cold/warm.
"""

import argparse
import asyncio
import json
import time

import yaml

from activities.sandboxes import KubernetesSandboxes, PoolRef, SandboxSettings, pod_ready
from bench.stats import percentiles, report
from kube import Config, Kube, path
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE
from workflows.activity_types import RunRef, SandboxRelease, SandboxRequest
from workflows.contract import ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import SandboxPolicy

NS = "bench"


def contract(i: int) -> ExecutionContract:
    model = ModelRef(name="m", url="http://127.0.0.1:9/v1")
    return ExecutionContract(
        run=RunIdentity(namespace=NS, name=f"b{i}", uid=f"uid-b{i}", attempt=1, fence=1),
        agent=ResolvedAgent(name="a", model=model),
        model=model,
    )


async def main(runs: int) -> None:
    plane = ControlPlane()
    plane.start()
    plane.start_node()
    try:
        plane.kubectl("create", "namespace", NS)
        plane.wait_for_default_service_account(NS)
        plane.kubectl("create", "serviceaccount", "ksquad-sandbox", "-n", NS)
        plane.add_runtime_classes()
        pool = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": "ksquad-pool-b",
                "namespace": NS,
            },  # a pool the worker knows (settings.pools)
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"ksquad.io/state": "warm", "ksquad.io/pool": "b"}},
                "template": {
                    "metadata": {
                        "labels": {
                            "ksquad.io/state": "warm",
                            "ksquad.io/pool": "b",
                            "ksquad.io/runtime-class": "gvisor",
                        }
                    },
                    "spec": {
                        "runtimeClassName": "gvisor",  # what the label says, and the Run asks for
                        "containers": [
                            {
                                "name": "agent",
                                "image": AGENT_IMAGE,
                                "command": ["ksquad-agent"],
                                "args": ["--host", "$(POD_IP)", "--port", "8080"],
                                "env": [
                                    {
                                        "name": "POD_IP",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                    }
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/readyz", "port": 8080},
                                    "periodSeconds": 1,
                                },
                            }
                        ],
                    },
                },
            },
        }
        plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(pool))
        async with Kube(Config.from_kubeconfig(plane.admin_kubeconfig)) as kube:
            sandboxes = KubernetesSandboxes(
                kube,
                SandboxSettings(
                    image=AGENT_IMAGE,
                    poll_seconds=0.05,
                    run_as_user=65532,
                    pools=[PoolRef(name="b", namespace=NS)],
                ),
            )
            warm, cold = [], []
            for i in range(runs):
                await wait_warm(kube, 3)
                c = contract(i)
                t0 = time.perf_counter()
                bound = await sandboxes.bind_warm(c, SandboxPolicy())
                warm.append((time.perf_counter() - t0) * 1000)
                assert bound is not None
                t0 = time.perf_counter()
                made = await sandboxes.start_cold(
                    SandboxRequest(
                        contract=contract(runs + i), policy=SandboxPolicy(class_="batch"), timeout_seconds=60
                    )
                )
                cold.append((time.perf_counter() - t0) * 1000)
                for sandbox, owner in ((bound, c), (made, contract(runs + i))):
                    run = RunRef(namespace=NS, name=owner.run.name, uid=owner.run.uid)
                    await sandboxes.release(SandboxRelease(run=run, sandbox=sandbox, confirm=False))
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
