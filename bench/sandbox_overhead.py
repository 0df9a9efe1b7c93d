"""bench.overhead with sandboxes: a ksquad Run whose agent runs in a warm sandbox against the fair limit with a warm
sandbox, on the test cluster (testbed.stack: the bridge and the worker as their own processes with the chart's
ServiceAccounts, the control plane's real node running the pods of the agent image under gVisor), taking turns:

- ksquad: a Run created through the API server (`spec.sandboxPolicy.pool` one warm pool the chart renders), until
  its workflow returns Succeeded: the bridge's start, references, claim (one guarded patch, the Run as the pod's
  owner), the A2A call to the pod's agent (which calls the scripted model), the pod deleted, status mirrored;
- fair: bench.fair_limit's workflow given the same contract (read from a ksquad Run's history) and a warm pool of
  its own, rendered from the same chart template in a namespace of its own: its one activity takes a ready pod
  with one guarded patch, sends the task to the pod's agent (the same image, the same model and answer) and
  deletes the pod: the least any workflow-per-Run design with warm sandboxes must do.

Pods are real: each run uses one, and its pool's ReplicaSet starts a replacement (an agent starting under gVisor,
seconds of CPU on this machine). So every measurement starts with both pools full and no pod terminating, and the
numbers are what a Run costs beside a quiet pool, not how fast this node refills one (bench.warm_claims). Kwok's
simulated pods (bench.sandbox_claims) run no container, so no agent would answer there.

Latency: one at a time (p50/p99 and the ratio). Throughput: `--batch` started at once (pools of that many pods).
Targets as bench.overhead's (issue 49): latency at most 1.15 times and throughput at least 85% of the fair limit's.

    python -m testbed.isolate python -m bench.sandbox_overhead [--runs 10] [--batch 6] [--rounds 2] [--temporal dev|production]
"""

import argparse
import asyncio
import logging
import time
import uuid
from typing import Any

import yaml
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.sandboxes.manifests import pod_ready
from agent.callers import read_key
from bench.fair_limit import (
    contract_of_a_run,
    fair_limit_worker_at,
)
from bench.histories import shape_of, timeline_of
from bench.overhead import fair_runs
from bench.stats import percentiles, report
from bench.warm_claims import acquisition, rendered_pools, stack_with_pools, unready_pods
from kube import Kube, path
from testbed.embedded import TemporalKind
from testbed.stack import RUN_API, Stack

POOL = "p0"
SIDES = ("ksquad", "fair")


async def fair_namespace(stack: Stack, replicas: int) -> str:
    """A namespace of the fair limit's own with the chart's pool template for it (on the stack's RuntimeClasses), the
    pods' ServiceAccount and the credential (the stack's model-key Secret): none of ksquad's RBAC, network or
    admission policies."""
    namespace = f"fair-{uuid.uuid4().hex[:8]}"
    stack.kubectl("create", "namespace", namespace)
    stack.kubectl("create", "serviceaccount", "ksquad-sandbox", "-n", namespace)
    (secret,) = [doc for doc in stack.resources(stack.model) if doc["kind"] == "Secret"]
    secret["metadata"]["namespace"] = namespace
    runtime_classes = stack.sandbox_settings.get("runtime_classes")
    rendered = rendered_pools(namespace, [POOL], replicas, runtime_classes)
    pool = [doc for doc in rendered if doc["kind"] == "ReplicaSet"]
    docs = [secret, *pool]
    stack.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    return namespace


async def quiet(kube: Kube, namespaces: list[str], replicas: int, within: float = 600) -> None:
    """Each namespace holds its pool's `replicas` pods, every one ready and warm, none terminating."""
    deadline = time.monotonic() + within
    while True:
        settled = True
        for namespace in namespaces:
            pods = (await kube.list(path("v1", "pods", namespace)))["items"]
            ready = [p for p in pods if pod_ready(p) and not p["metadata"].get("deletionTimestamp")]
            settled &= len(pods) == len(ready) == replicas
        if settled:
            return
        if time.monotonic() > deadline:
            reasons = [r for ns in namespaces for r in await unready_pods(kube, ns)]
            raise RuntimeError(f"the pools never settled at {replicas} ready pods: {'; '.join(reasons)}")
        await asyncio.sleep(0.25)


async def workflow_result(client: Client, workflow_id: str) -> Any:
    """The workflow's result, waiting for the bridge to start it."""
    while True:
        try:
            return await client.get_workflow_handle(workflow_id).result()
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            await asyncio.sleep(0.02)


async def ksquad_runs(stack: Stack, prefix: str, count: int) -> tuple[list[float], float]:
    """Latency of each Run (ms, from its create request to its workflow's end) and the batch's wall time (s)."""
    url = path(RUN_API, "runs", stack.namespace)
    t0 = time.perf_counter()

    async def one(i: int) -> float:
        name = f"{prefix}-{i}"
        body = {
            "apiVersion": RUN_API,
            "kind": "Run",
            "metadata": {"name": name},
            "spec": {"agents": ["dev-1"], "sandboxPolicy": {"class": "interactive", "pool": POOL}},
        }
        await stack.kube.create(url, body)
        result = await workflow_result(stack.temporal, f"{stack.namespace}/{name}")
        assert result["phase"] == "Succeeded", f"{name}: {result}"
        took = (time.perf_counter() - t0) * 1000
        acquired = await acquisition(stack, f"{stack.namespace}/{name}")
        if acquired is None or acquired[2].kind != "warm":
            raise RuntimeError(
                f"{name} ran in no warm sandbox: {acquired}\nworker: {stack.log('worker')[-3000:]}"
            )
        return took

    latencies = await asyncio.gather(*(one(i) for i in range(count)))
    return list(latencies), time.perf_counter() - t0


async def main(runs: int, batch: int, rounds: int, temporal: TemporalKind = "dev") -> dict[str, Any]:
    async with stack_with_pools(temporal, batch, pools=1) as (stack, admin):
        return await measure(stack, admin, runs, batch, rounds, temporal)


async def measure(
    stack: Stack, admin: Kube, runs: int, batch: int, rounds: int, temporal: TemporalKind
) -> dict[str, Any]:
    fair_ns = await fair_namespace(stack, batch)
    namespaces = [stack.namespace, fair_ns]
    await quiet(admin, namespaces, batch)
    await ksquad_runs(stack, "shape", 1)
    run_id = f"{stack.namespace}/shape-0"
    shape = await shape_of(stack.temporal.get_workflow_handle(run_id))
    template, _answer = await contract_of_a_run(stack.temporal, run_id)
    template = template.model_copy(update={"pool": f"{fair_ns}/{POOL}"})
    async with fair_limit_worker_at(
        stack.dev_server.target, read_key(stack.endpoint_key), admin, [(fair_ns, POOL)]
    ) as fair_client:

        async def one_round(side: str, prefix: str, count: int) -> tuple[list[float], float]:
            await quiet(admin, namespaces, batch)
            if side == "ksquad":
                return await ksquad_runs(stack, prefix, count)
            return await fair_runs(fair_client, f"fair-{prefix}", count, template)

        await one_round("fair", "warm", 1)  # its worker's first task: connections, the pool's watch
        fair_shape = await shape_of(fair_client.get_workflow_handle("fair-warm-0"))
        latency: dict[str, list[float]] = {side: [] for side in SIDES}
        for i in range(runs):  # one at a time, taking turns
            for side in SIDES:
                latency[side] += (await one_round(side, f"lat-{i}", 1))[0]
        timelines = {
            "ksquad": await timeline_of(stack.temporal.get_workflow_handle(f"{stack.namespace}/lat-0-0")),
            "fair": await timeline_of(fair_client.get_workflow_handle("fair-lat-0-0")),
        }
        wall = dict.fromkeys(SIDES, 0.0)
        for r in range(rounds):  # batches started at once, taking turns
            for side in SIDES:
                wall[side] += (await one_round(side, f"thr-{r}", batch))[1]
    lat = {k: percentiles(v) for k, v in latency.items()}
    rate = {k: round(batch * rounds / v, 2) for k, v in wall.items()}
    return {
        "temporal": temporal,
        "what_a_run_does": shape,
        "what_the_fair_limit_does": fair_shape,
        "latency_one_at_a_time": lat,
        "where_the_first_ones_time_went": timelines,
        "throughput_batches": {"batch": batch, "rounds": rounds, "runs_per_second": rate},
        "against_the_fair_limit": {
            "latency_ratio_p50": round(lat["ksquad"]["p50_ms"] / lat["fair"]["p50_ms"], 2),
            "latency_ratio_p99": round(lat["ksquad"]["p99_ms"] / lat["fair"]["p99_ms"], 2),
            "throughput_share": round(rate["ksquad"] / rate["fair"], 2),
        },
        "pods_per_pool": batch,
        "targets": {"fair_limit": {"latency_ratio_max": 1.15, "throughput_share_min": 0.85}},
    }


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("temporalio.activity").setLevel(
        logging.INFO
    )  # the fair limit's steps (bench.fair_limit)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10, help="runs of each kind, one at a time")
    parser.add_argument("--batch", type=int, default=6, help="runs started at once (and pods per pool)")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds of each kind")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    report("sandbox_overhead", asyncio.run(main(args.runs, args.batch, args.rounds, args.temporal)))
