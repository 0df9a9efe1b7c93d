"""The embedded Temporal server's SQLite journal: ksquad's (write-ahead log, synced at checkpoints) against the
Temporal CLI's default for a file (a rollback journal synced on every commit) and against its state in memory,
the same workflows on each.

    python -m bench.devserver_journal [--workflows N] [--rounds R]

Each round starts one dev server of each kind on a fresh file (in turn, so none shares the CPU with another)
and runs N workflows of two activities each, 50 at a time, through a worker in this process. Prints, per kind,
the wall time and the server's CPU seconds (the medians over the rounds) and their ratio. The embedded stack
(`ksquad dev`) and the test bed's stacks keep their Temporal state this way.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module: not these
    from bench.stats import cpu_seconds, report
    from dev.devserver import SQLITE_PRAGMAS, DevServer


@activity.defn
async def step(n: int) -> int:
    return n + 1


@workflow.defn
class TwoSteps:
    @workflow.run
    async def run(self, n: int) -> int:
        n = await workflow.execute_activity(step, n, start_to_close_timeout=timedelta(seconds=30))
        return await workflow.execute_activity(step, n, start_to_close_timeout=timedelta(seconds=30))


async def one_round(db_file: Path | None, pragmas: list[str], workflows: int) -> dict[str, float]:
    async with DevServer(db_file=db_file, ui=False, sqlite_pragmas=pragmas) as server:
        client = await Client.connect(server.target)
        assert server.process is not None
        cpu_before, started = cpu_seconds(server.process.pid), time.perf_counter()
        async with Worker(client, task_queue="journal", workflows=[TwoSteps], activities=[step]):
            at_once = asyncio.Semaphore(50)

            async def one(i: int) -> int:
                async with at_once:
                    return await client.execute_workflow(TwoSteps.run, i, id=f"w-{i}", task_queue="journal")

            await asyncio.gather(*(one(i) for i in range(workflows)))
        return {
            "wall_s": time.perf_counter() - started,
            "server_cpu_s": cpu_seconds(server.process.pid) - cpu_before,
        }


async def main(workflows: int, rounds: int) -> None:
    kinds = {"ksquad_wal_normal": SQLITE_PRAGMAS, "cli_default_rollback_full": [], "in_memory": None}
    samples: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for kind, pragmas in kinds.items():
                db_file = None if pragmas is None else Path(tmp) / f"{kind}-{r}.db"
                samples[kind].append(await one_round(db_file, pragmas or [], workflows))
    medians: dict[str, Any] = {
        kind: {key: round(statistics.median(s[key] for s in runs), 2) for key in ("wall_s", "server_cpu_s")}
        for kind, runs in samples.items()
    }
    ours = medians["ksquad_wal_normal"]
    report(
        "devserver_journal",
        {
            "workflows": workflows,
            "rounds": rounds,
            **medians,
            **{
                f"{kind}_over_ours": {key: round(medians[kind][key] / ours[key], 2) for key in ours}
                for kind in ("cli_default_rollback_full", "in_memory")
            },
        },
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workflows", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.workflows, args.rounds))
