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

What trust by construction costs a run (`envelope`): every seal and check the bridge and the worker make for one
run (its envelope sealed and checked, its warrant sealed, checked by each activity that acts, each signal's proof
made and verified), timed in this process on that run's own envelope and warrants read back from its history,
against the run's latency measured here.

    python -m bench.overhead [--runs 60] [--batch 20] [--rounds 3] [--temporal dev|production]
"""

import argparse
import asyncio
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from bench.bare import BARE_TASK_QUEUE, BareWorkflow, noop
from bench.stats import percentiles, report
from dev.stack import DevStack
from temporal_client.proofs import Signing
from testbed.embedded import NAMESPACE, TemporalKind, bench_stack, run_docs
from workflows.activity_types import ACTING
from workflows.envelope import Warrant
from workflows.inbox import Sender
from workflows.run.state import RunInput

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


async def envelope_cost(dev: DevStack, workflow_id: str, repeat: int = 500) -> dict[str, Any]:
    """CPU microseconds of a run's seals and checks (see the module's doc), from the run's own history."""
    sealer = dev.runs.workflows.sealer
    assert sealer is not None, "the embedded stack seals its Runs"
    converter = dev.client.data_converter
    envelope: RunInput | None = None
    warrants: list[Warrant] = []
    checks = signals = 0
    async for event in dev.client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            (start,) = await converter.decode(
                event.workflow_execution_started_event_attributes.input.payloads
            )
            envelope = RunInput.model_validate(start)
        elif event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name in ACTING:
                (request,) = await converter.decode(scheduled.input.payloads)
                warrants.append(Warrant.model_validate(request["warrant"]))
                checks += 1
        elif event.HasField("marker_recorded_event_attributes"):
            checks += event.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER
        elif event.HasField("workflow_execution_signaled_event_attributes"):
            signals += 1
    assert envelope is not None and warrants, f"{workflow_id}: no envelope or no warrant in its history"
    warrant = warrants[0]
    chain = warrant.resolution.chain or ""

    def micros(work: Any) -> float:
        return timeit.timeit(work, number=repeat) / repeat * 1e6

    key = sealer.signals
    signing = Signing(Sender.BRIDGE, "", "", chain)
    wrapped = key.wrap(workflow_id, "pause", "a reason", True, signing, "nonce")
    each = {
        "seal_envelope": micros(lambda: sealer.seal_envelope(envelope)),
        "seal_warrant": micros(lambda: sealer.seal_warrant(envelope, chain, warrant.resolution)),
        "check_warrant": micros(lambda: sealer.check_warrant(warrant, workflow_id)),
        "prove_signal": micros(lambda: key.wrap(workflow_id, "pause", "a reason", True, signing, "nonce")),
        "verify_signal": micros(lambda: key._verified(workflow_id, chain, "pause", wrapped)),
    }
    per_run = (
        each["seal_envelope"]
        + each["seal_warrant"]
        + (1 + checks) * each["check_warrant"]  # the bridge's check at resolving, then each acting activity's
        + signals * (each["prove_signal"] + each["verify_signal"])
    )
    return {
        "us_each": {k: round(v, 1) for k, v in each.items()},
        "acting_activities": checks,
        "signals": signals,
        "warrant_bytes": len(warrant.model_dump_json()),
        "cpu_us_per_run": round(per_run, 1),
    }


async def main(runs: int, batch: int, rounds: int, temporal: TemporalKind = "dev") -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), temporal=temporal) as (dev, _agent):
            shape = await shape_of_a_run(dev)
            envelope = await envelope_cost(dev, f"{NAMESPACE}/shape-00000")
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
        "envelope": {
            **envelope,
            "share_of_run_latency_p50": round(envelope["cpu_us_per_run"] / 1000 / lat["ksquad"]["p50_ms"], 4),
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
