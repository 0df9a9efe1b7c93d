"""Where ksquad's time goes on one Run's path: the embedded stack (the bridge, the worker's workflow tasks and
activities, the store, in this process) profiled with cProfile over `--runs` Runs one at a time and `--batch`
Runs at once, with the instant agent and the scripted model (testbed.embedded).

Times are this thread's CPU (the event loop's: a store's or Temporal's own threads are outside, and so is the
workflow's own code, which the SDK runs on its workflow-task threads: `workflow_code_cpu_ms_per_run` is that,
measured apart by replaying a profiled Run's history), with cProfile's overhead in them; a coroutine's calls count each time it is resumed. Reported: the ten functions with the most
own time and the ten of ksquad's own with the most time under them (per Run), this process's own time by the
package it is spent in (ksquad's modules, temporalio, pydantic, httpx, the event loop...), and the CPU each process
spent per Run (bench.stats' roles: this one, the agent's, the Temporal server's, PostgreSQL's): the agent and the
server are outside the profile.

    python -m bench.run_profile [--runs 40] [--batch 20] [--temporal dev|production]
"""

import argparse
import asyncio
import cProfile
import pstats
import sysconfig
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.worker import Replayer

from bench.stats import cpu_by_role, cpu_ms_per_run, report
from testbed.embedded import NAMESPACE, TemporalKind, bench_stack, run_docs
from worker.registry import RUN_WORKFLOWS, WORKFLOW_RUNNER

ROOT = Path(__file__).parents[1]
PRODUCT = (
    "activities",
    "agent",
    "api",
    "crd-bridge",
    "dev",
    "store",
    "temporal_client",
    "tracing",
    "worker",
    "workflows",
)
SITE = Path(sysconfig.get_paths()["purelib"])
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def owner(filename: str) -> str:
    """Who a profiled function belongs to: ksquad's package, a dependency's, the standard library's."""
    path = Path(filename)
    if filename.startswith("<") or filename == "~":
        return "builtins"
    for base, prefix in ((SITE, ""), (STDLIB, "stdlib:"), (ROOT, "ksquad:")):  # the venv may be in ROOT
        if path.is_relative_to(base):
            top = path.relative_to(base).parts[0]
            if base == ROOT and top not in PRODUCT:
                return f"ksquad-testbed:{top}"  # bench/, testbed/: the driver, not the product
            return f"{prefix}{top.removesuffix('.py')}"
    return "other"


def where(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    path = Path(filename)
    for base in (SITE, STDLIB, ROOT):
        if path.is_relative_to(base):
            return f"{path.relative_to(base)}:{line} {name}"
    return f"{filename}:{line} {name}"


def summary(stats: pstats.Stats, runs: int) -> dict[str, Any]:
    table: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    total = sum(own for _, _, own, _, _ in table.values())
    by_owner: dict[str, float] = defaultdict(float)
    for key, (_, _, own, _, _) in table.items():
        by_owner[owner(key[0])] += own
    own_top = sorted(table.items(), key=lambda item: item[1][2], reverse=True)[:10]
    ours = [item for item in table.items() if owner(item[0][0]).startswith("ksquad:")]
    cumulative_top = sorted(ours, key=lambda item: item[1][3], reverse=True)[:10]

    def ms(seconds: float) -> float:
        return round(seconds * 1000 / runs, 3)

    return {
        "profiled_ms_per_run": ms(total),
        "by_owner_ms_per_run": {k: ms(v) for k, v in sorted(by_owner.items(), key=lambda kv: -kv[1])[:15]},
        "top_own_time": [
            {"function": where(key), "calls_per_run": round(calls / runs, 1), "own_ms_per_run": ms(own)}
            for key, (_, calls, own, _, _) in own_top
        ],
        "top_ksquad_cumulative": [
            {
                "function": where(key),
                "calls_per_run": round(calls / runs, 1),
                "cumulative_ms_per_run": ms(cum),
            }
            for key, (_, calls, _, cum, _) in cumulative_top
        ],
    }


async def replayed_cpu_ms(client: Client, workflow_id: str, times: int = 20) -> float:
    """The CPU (this process's, no profiler) of replaying a Run's history: its workflow code, the payload codec
    and the SDK's own work on the history, which is what the worker's workflow tasks spend on that Run."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(
        workflows=list(RUN_WORKFLOWS), data_converter=client.data_converter, workflow_runner=WORKFLOW_RUNNER
    )
    await replayer.replay_workflow(history)  # the first replay loads what it needs
    start = time.process_time()
    for _ in range(times):
        await replayer.replay_workflow(history)
    return round((time.process_time() - start) * 1000 / times, 2)


async def main(runs: int, batch: int, temporal: TemporalKind) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), temporal=temporal) as (dev, _agent):

            async def finished(names: list[str]) -> None:
                await asyncio.gather(
                    *(dev.client.get_workflow_handle(f"{NAMESPACE}/{name}").result() for name in names)
                )

            warm = run_docs("warm", 3)
            for doc in warm:  # connections, caches, the agent card
                await dev.runs.apply([doc])
                await finished([doc["metadata"]["name"]])
            cpu_before = cpu_by_role()
            profile = cProfile.Profile(time.process_time)  # CPU, not the loop's waits
            profile.enable()
            for doc in run_docs("one", runs):
                await dev.runs.apply([doc])
                await finished([doc["metadata"]["name"]])
            docs = run_docs("batch", batch)
            await dev.runs.apply(docs)
            await finished([d["metadata"]["name"] for d in docs])
            profile.disable()
            cpu_after = cpu_by_role()
            workflow_code = await replayed_cpu_ms(dev.client, f"{NAMESPACE}/one-00000")
    total = runs + batch
    return {
        "runs": runs,
        "batch": batch,
        "temporal": temporal,
        # "stack" is this process (the bridge, the worker, the store, the scripted model): with cProfile's overhead
        "cpu_ms_per_run": cpu_ms_per_run(cpu_before, cpu_after, total),
        "workflow_code_cpu_ms_per_run": workflow_code,
        **summary(pstats.Stats(profile), total),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=40, help="runs one at a time")
    parser.add_argument("--batch", type=int, default=20, help="runs started at once, after them")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    report("run_profile", asyncio.run(main(args.runs, args.batch, args.temporal)))
