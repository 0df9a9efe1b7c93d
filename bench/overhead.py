"""End-to-end overhead of a ksquad run against the fair limit and against bare Temporal, on the embedded stack (one
Temporal server, one worker process), taking turns so all three see the same machine:

- ksquad: a Run applied (validated, stored, its workflow started) with an instant agent (`testbed.embedded`),
  until its workflow returns Succeeded; everything a run does (references, gates, status mirroring, the A2A
  call to the agent and the agent's call to the model, payload encryption) is in the number;
- fair: the fair limit (`bench.fair_limit`): one workflow whose one activity sends the same A2A task to the same
  agent (the contract read from a ksquad Run's history: same model, same answer) and returns the answer, on the
  same server: the least any workflow-per-Run design must do for that Run;
- bare: `bench.bare.BareWorkflow` running as many trivial activities, one after another, and as many trivial
  local activities as a ksquad run schedules (both counted from a run's history), with no agent call at all: the
  earlier comparator, kept for continuity.

On the dev server, or with `--temporal production` Temporal's production server on PostgreSQL
(testbed.temporal_server). Latency: one at a time (p50/p99 and the ratios). Throughput: batches started at once
(runs per second and the shares). Targets: against the fair limit, latency at most 1.15 times and throughput at
least 85% (issue 49); against bare (DESIGN.md), at most 1.25 times and at least 80%. The histories of a ksquad Run
and of the fair limit (bench.histories: events, bytes, Temporal Cloud actions) are reported beside them.

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

from temporalio.client import Client
from temporalio.worker import Worker

from bench.bare import BARE_TASK_QUEUE, BareWorkflow, noop
from bench.fair_limit import (
    FAIR_TASK_QUEUE,
    FairLimitWorkflow,
    FairTask,
    contract_of_a_run,
    fair_limit_worker,
    fair_task_for,
)
from bench.histories import LOCAL_ACTIVITY_MARKER, shape_of, timeline_of
from bench.stats import percentiles, report
from dev.stack import DevStack
from temporal_client.proofs import Signing
from testbed.embedded import NAMESPACE, TemporalKind, bench_stack, run_docs
from workflows.activity_types import ACTING
from workflows.envelope import Warrant
from workflows.inbox import Sender
from workflows.run.state import RunInput


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


async def fair_runs(client: Client, prefix: str, count: int, template: FairTask) -> tuple[list[float], float]:
    """The fair limit (bench.fair_limit): each run the same A2A task as a ksquad Run's, as another run's."""
    t0 = time.perf_counter()

    async def one(i: int) -> float:
        name = f"{prefix}-{i}"
        await client.execute_workflow(
            FairLimitWorkflow.run, fair_task_for(template, name), id=name, task_queue=FAIR_TASK_QUEUE
        )
        return (time.perf_counter() - t0) * 1000

    latencies = await asyncio.gather(*(one(i) for i in range(count)))
    return list(latencies), time.perf_counter() - t0


async def shape_of_a_run(dev: DevStack) -> dict[str, Any]:
    await dev.runs.apply(run_docs("shape", 1))
    handle = dev.client.get_workflow_handle(f"{NAMESPACE}/shape-00000")
    await handle.result()
    return await shape_of(handle)


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
    sides = ("ksquad", "fair", "bare")
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), temporal=temporal) as (dev, _agent):
            shape = await shape_of_a_run(dev)
            envelope = await envelope_cost(dev, f"{NAMESPACE}/shape-00000")
            template, _answer = await contract_of_a_run(dev.client, f"{NAMESPACE}/shape-00000")
            bare_client = await Client.connect(dev.server.target)
            async with (
                Worker(bare_client, task_queue=BARE_TASK_QUEUE, workflows=[BareWorkflow], activities=[noop]),
                fair_limit_worker(dev) as fair_client,
            ):

                async def one_round(side: str, prefix: str, count: int) -> tuple[list[float], float]:
                    if side == "ksquad":
                        return await ksquad_runs(dev, prefix, count)
                    if side == "fair":
                        return await fair_runs(fair_client, f"fair-{prefix}", count, template)
                    return await bare_runs(bare_client, f"bare-{prefix}", count, shape)

                for side in sides[1:]:  # the first of each warms its worker (connections, the agent card)
                    await one_round(side, "warm", 1)
                fair_shape = await shape_of(fair_client.get_workflow_handle("fair-warm-0"))
                timelines = {
                    "ksquad": await timeline_of(dev.client.get_workflow_handle(f"{NAMESPACE}/shape-00000")),
                    "fair": await timeline_of(fair_client.get_workflow_handle("fair-warm-0")),
                }
                latency: dict[str, list[float]] = {side: [] for side in sides}
                for i in range(runs):  # one at a time, taking turns
                    for side in sides:
                        latency[side] += (await one_round(side, f"lat-{i}", 1))[0]
                wall = dict.fromkeys(sides, 0.0)
                for r in range(rounds):  # batches started at once, taking turns
                    for side in sides:
                        wall[side] += (await one_round(side, f"thr-{r}", batch))[1]
    lat = {k: percentiles(v) for k, v in latency.items()}
    rate = {k: round(batch * rounds / v, 2) for k, v in wall.items()}

    def against(limit: str) -> dict[str, float]:
        return {
            "latency_ratio_p50": round(lat["ksquad"]["p50_ms"] / lat[limit]["p50_ms"], 2),
            "latency_ratio_p99": round(lat["ksquad"]["p99_ms"] / lat[limit]["p99_ms"], 2),
            "throughput_share": round(rate["ksquad"] / rate[limit], 2),
        }

    return {
        "what_a_run_does": shape,
        "what_the_fair_limit_does": fair_shape,
        "latency_one_at_a_time": lat,
        # the first of each, from its history (the Run's, before the fair limit's worker started)
        "where_the_first_ones_time_went": timelines,
        "throughput_batches": {"batch": batch, "rounds": rounds, "runs_per_second": rate},
        "against_the_fair_limit": against("fair"),
        "against_bare": against("bare"),
        "envelope": {
            **envelope,
            "share_of_run_latency_p50": round(envelope["cpu_us_per_run"] / 1000 / lat["ksquad"]["p50_ms"], 4),
        },
        "temporal": temporal,
        "targets": {
            "fair_limit": {"latency_ratio_max": 1.15, "throughput_share_min": 0.85},
            "bare": {"overhead_ratio_max": 1.25, "throughput_share_min": 0.8},
        },
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
