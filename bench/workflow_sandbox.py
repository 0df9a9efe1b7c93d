"""What Temporal's workflow sandbox would cost ksquad: the worker's workflow CPU of a Run with the runner the
worker uses (unsandboxed) against the SDK's SandboxedWorkflowRunner, set up as Temporal advises (its default
restrictions, pydantic passed through), and as ksquad ran it until 2026-12-04 (the core passed through too, which
restricts nothing at run time), each over the same real Runs' histories.

Runs `--runs` one-attempt Runs on the embedded stack (testbed.embedded: the bridge, the worker, the instant agent
and the scripted model; CPU per Run of every process measured meanwhile), then replays each Run's history
`--times` times with each runner: a replay is what the worker's workflow tasks spend on that Run (its workflow
code, the payload codec, the SDK's work on the history) and, sandboxed, a fresh sandbox per Run as a new run gets.
A history that fails to replay in the sandbox says which restriction the workflow code hit.

`throughput_cost` is the share of a Run's CPU the sandbox would add (its extra CPU over all the CPU a Run takes on
this machine with it: ksquad's, Temporal's, the agent's, PostgreSQL's): on a machine whose cores the Runs keep busy,
throughput drops by that share. The worker keeps the unsandboxed runner while it is over 10% (issue 50);
tests/workflows/test_determinism.py is the guard in the sandbox's place.

    python -m bench.workflow_sandbox [--runs 20] [--times 10] [--temporal dev|production]
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from bench.stats import cpu_by_role, cpu_ms_per_run, report
from testbed.embedded import NAMESPACE, TemporalKind, bench_stack, run_docs
from worker.registry import RUN_WORKFLOWS, WORKFLOW_RUNNER

PYDANTIC = ("pydantic", "pydantic_core", "annotated_types")
RUNNERS: dict[str, WorkflowRunner] = {
    "unsandboxed (the worker's)": WORKFLOW_RUNNER,
    "sandboxed, pydantic passed through (Temporal's advice)": SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PYDANTIC)
    ),
    "sandboxed, the core passed through too (ksquad until 2026-12-04)": SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(*PYDANTIC, "workflows")
    ),
}
assert isinstance(WORKFLOW_RUNNER, UnsandboxedWorkflowRunner), (
    "the comparison's baseline is the worker's runner"
)


async def replay_cpu_ms(
    histories: list[WorkflowHistory], converter: DataConverter, runner: WorkflowRunner, times: int
) -> dict[str, Any]:
    """This process's CPU per Run replaying `histories` with `runner` (after one untimed pass that loads what it
    needs), or the first failure."""
    replayer = Replayer(workflows=list(RUN_WORKFLOWS), data_converter=converter, workflow_runner=runner)
    try:
        for history in histories:
            await replayer.replay_workflow(history)
        per_run: list[float] = []
        for _ in range(times):
            start = time.process_time()
            for history in histories:
                await replayer.replay_workflow(history)
            per_run.append((time.process_time() - start) * 1000 / len(histories))
    except Exception as err:  # the answer for this runner: it cannot run ksquad's workflows, and why
        return {"replays": False, "error": f"{type(err).__name__}: {err}"[:2000]}
    return {"replays": True, "ms_per_run": round(statistics.median(per_run), 2), "passes": times}


async def main(runs: int, times: int, temporal: TemporalKind) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), temporal=temporal) as (dev, _agent):
            warm = run_docs("warm", 3)
            await dev.runs.apply(warm)
            for doc in warm:
                await dev.client.get_workflow_handle(f"{NAMESPACE}/{doc['metadata']['name']}").result()
            cpu_before = cpu_by_role()
            docs = run_docs("one", runs)
            for doc in docs:
                await dev.runs.apply([doc])
                await dev.client.get_workflow_handle(f"{NAMESPACE}/{doc['metadata']['name']}").result()
            cpu_after = cpu_by_role()
            histories = [
                await dev.client.get_workflow_handle(f"{NAMESPACE}/{doc['metadata']['name']}").fetch_history()
                for doc in docs
            ]
            converter = dev.client.data_converter
    cpu = cpu_ms_per_run(cpu_before, cpu_after, runs)
    all_cpu = round(sum(cpu.values()), 1)
    runners = {
        name: await replay_cpu_ms(histories, converter, runner, times) for name, runner in RUNNERS.items()
    }
    baseline = runners["unsandboxed (the worker's)"]["ms_per_run"]
    for result in runners.values():
        if result["replays"]:
            extra = result["ms_per_run"] - baseline
            result["extra_ms_per_run"] = round(extra, 2)
            result["throughput_cost"] = round(extra / (all_cpu + extra), 3)
    return {
        "runs": runs,
        "times": times,
        "temporal": temporal,
        "history_events_per_run": round(sum(len(h.events) for h in histories) / len(histories), 1),
        "cpu_ms_per_run": cpu,
        "all_cpu_ms_per_run": all_cpu,
        "runners": runners,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="one-attempt Runs, one at a time")
    parser.add_argument("--times", type=int, default=10, help="timed replays of every history, per runner")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    report("workflow_sandbox", asyncio.run(main(args.runs, args.times, args.temporal)))
