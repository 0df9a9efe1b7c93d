"""End-to-end overhead of a ksquad run against bare Temporal, on the embedded stack (one dev server, one worker
process), interleaved so both see the same machine:

- ksquad: a Run applied (validated, stored, its workflow started) with an instant agent (`testbed.embedded`),
  until its workflow returns Succeeded; everything a run does (references, gates, status mirroring, the A2A
  call to the agent and the agent's call to the model, payload encryption) is in the number;
- bare: `bench.bare.BareWorkflow` running as many trivial activities, one after another, and as many trivial
  local activities as a ksquad run schedules (both counted from a run's history), on the same Temporal: the dev
  server, or with `--temporal production` Temporal's production server on PostgreSQL (testbed.temporal_server).

Latency: one at a time (p50/p99 and the ratio). Throughput: batches started at once (runs per second and the
ratio). Targets (DESIGN.md): overhead at most 1.25 times bare, throughput at least 80% of bare.

    python -m bench.overhead [--runs 60] [--batch 20] [--rounds 3] [--temporal dev|production]
"""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from bench.bare import BARE_TASK_QUEUE, BareWorkflow, noop
from bench.stats import percentiles, report
from dev.stack import DevStack
from testbed.embedded import NAMESPACE, TemporalKind, bench_stack, run_docs

LOCAL_ACTIVITY_MARKER = "core_local_activity"  # the marker a local activity leaves in the history


async def ksquad_runs(dev: DevStack, prefix: str, count: int) -> tuple[list[float], float]:
    """Latency of each run (ms) and the batch's wall time (s)."""
    t0 = time.perf_counter()
    docs = run_docs(prefix, count)
    await dev.runs.apply(docs)

    async def finished(name: str) -> float:
        await dev.client.get_workflow_handle(f"{NAMESPACE}/{name}").result()
        return (time.perf_counter() - t0) * 1000

    latencies = await asyncio.gather(*(finished(d["metadata"]["name"]) for d in docs))
    return list(latencies), time.perf_counter() - t0


async def bare_runs(
    client: Client, prefix: str, count: int, shape: dict[str, int]
) -> tuple[list[float], float]:
    t0 = time.perf_counter()

    async def one(i: int) -> float:
        await client.execute_workflow(
            BareWorkflow.run,
            args=[shape["activities"], shape["local_activities"]],
            id=f"{prefix}-{i}",
            task_queue=BARE_TASK_QUEUE,
        )
        return (time.perf_counter() - t0) * 1000

    latencies = await asyncio.gather(*(one(i) for i in range(count)))
    return list(latencies), time.perf_counter() - t0


async def shape_of_a_run(dev: DevStack) -> dict[str, int]:
    await dev.runs.apply(run_docs("shape", 1))
    handle = dev.client.get_workflow_handle(f"{NAMESPACE}/shape-00000")
    await handle.result()
    counts: dict[str, int] = {}
    async for event in handle.fetch_history_events():
        name = EventType.Name(event.event_type)
        if name == "EVENT_TYPE_MARKER_RECORDED":
            name = event.marker_recorded_event_attributes.marker_name  # a local activity, a patch
        counts[name] = counts.get(name, 0) + 1
    return {
        "activities": counts.get("EVENT_TYPE_ACTIVITY_TASK_SCHEDULED", 0),
        "local_activities": counts.get(LOCAL_ACTIVITY_MARKER, 0),
        "workflow_tasks": counts.get("EVENT_TYPE_WORKFLOW_TASK_COMPLETED", 0),
        "history_events": sum(counts.values()),
    }


async def main(runs: int, batch: int, rounds: int, temporal: TemporalKind = "dev") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), temporal=temporal) as (dev, _agent):
            shape = await shape_of_a_run(dev)
            bare_client = await Client.connect(dev.server.target)
            async with Worker(
                bare_client, task_queue=BARE_TASK_QUEUE, workflows=[BareWorkflow], activities=[noop]
            ):
                await bare_runs(bare_client, "bare-warm", 1, shape)
                latency: dict[str, list[float]] = {"ksquad": [], "bare": []}
                for i in range(runs):  # one at a time, alternating
                    latency["ksquad"] += (await ksquad_runs(dev, f"lat-{i}", 1))[0]
                    latency["bare"] += (await bare_runs(bare_client, f"bare-lat-{i}", 1, shape))[0]
                wall = {"ksquad": 0.0, "bare": 0.0}
                for r in range(rounds):  # batches started at once, alternating
                    wall["ksquad"] += (await ksquad_runs(dev, f"thr-{r}", batch))[1]
                    wall["bare"] += (await bare_runs(bare_client, f"bare-thr-{r}", batch, shape))[1]
    lat = {k: percentiles(v) for k, v in latency.items()}
    rate = {k: round(batch * rounds / v, 2) for k, v in wall.items()}
    return {
        "what_a_run_does": shape,
        "latency_one_at_a_time": {
            **lat,
            "ratio_p50": round(lat["ksquad"]["p50_ms"] / lat["bare"]["p50_ms"], 2),
            "ratio_p99": round(lat["ksquad"]["p99_ms"] / lat["bare"]["p99_ms"], 2),
        },
        "throughput_batches": {
            "batch": batch,
            "rounds": rounds,
            "runs_per_second": rate,
            "ksquad_share_of_bare": round(rate["ksquad"] / rate["bare"], 2),
        },
        "temporal": temporal,
        "targets": {"overhead_ratio_max": 1.25, "throughput_share_min": 0.8},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=60, help="runs of each kind, one at a time")
    parser.add_argument("--batch", type=int, default=20, help="runs started at once in a throughput round")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds of each kind")
    parser.add_argument(
        "--temporal",
        choices=["dev", "production"],
        default="dev",
        help="the dev server, or the production server",
    )
    args = parser.parse_args()
    report("overhead", asyncio.run(main(args.runs, args.batch, args.rounds, args.temporal)))
