"""Throughput ceiling: Runs completed per second on the embedded stack with one and with two `ksquad-worker`
processes (separate processes, as on a cluster; the stack's bridge, model and instant agent shared).

Each measurement applies a burst of Runs at once and times them from the first apply until the last is
Succeeded; the dev server, the workers, the agent and the model share the machine (`cpus` in the report).
Each measurement also reports the CPU milliseconds per run of every process by role (`bench.stats.ROLES`): the
workers, the stack's own process (the embedded bridge, API, store and model), the agent, Temporal and, on the
production server, its PostgreSQL; `ksquad_cpu_ms_per_run` is the workers' and the stack's.

    python -m bench.throughput [--runs 200] [--workers 1,2] [--temporal dev|production]
"""

import argparse
import asyncio
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.stats import cpu_by_role, cpu_ms_per_run, cpu_seconds, report
from testbed.embedded import TemporalKind, bench_stack, run_docs, start_workers, stop_workers, wait_terminal


async def main(runs: int, worker_counts: list[int], temporal: TemporalKind = "dev") -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), serve_worker=False, temporal=temporal) as (dev, _agent):
            for count in worker_counts:
                workers = await start_workers(dev, count)
                try:
                    warm = run_docs(f"warm{count}", 5)
                    await dev.runs.apply(warm)
                    await wait_terminal(dev, [d["metadata"]["name"] for d in warm], 120)
                    cpu_before = sum(cpu_seconds(w.pid) for w in workers)
                    roles_before = cpu_by_role()
                    docs = run_docs(f"w{count}", runs)
                    t0 = time.perf_counter()
                    await dev.runs.apply(docs)
                    phases = await wait_terminal(dev, [d["metadata"]["name"] for d in docs], 900)
                    wall = time.perf_counter() - t0
                    per_run = cpu_ms_per_run(roles_before, cpu_by_role(), runs)
                    results[f"{count}_worker{'s' if count > 1 else ''}"] = {
                        "runs": runs,
                        "wall_seconds": round(wall, 2),
                        "runs_per_second": round(runs / wall, 2),
                        "worker_cpu_seconds": round(sum(cpu_seconds(w.pid) for w in workers) - cpu_before, 2),
                        "phases": dict(Counter(phases.values())),
                        "cpu_ms_per_run": per_run,
                        # what is ksquad's own: the workers, and the bridge with the API in the stack's process
                        "ksquad_cpu_ms_per_run": round(per_run.get("worker", 0) + per_run.get("stack", 0), 1),
                        # issue 49's standing figure: at most half of what Temporal and its database spend
                        "ksquad_over_temporal_and_database": round(
                            (per_run.get("worker", 0) + per_run.get("stack", 0))
                            / max(0.1, per_run.get("temporal", 0) + per_run.get("postgresql", 0)),
                            2,
                        ),
                    }
                finally:
                    stop_workers(workers)
    results["temporal"] = temporal
    one, two = results.get("1_worker"), results.get("2_workers")
    if one and two:
        results["scaling_2_over_1"] = round(two["runs_per_second"] / one["runs_per_second"], 2)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", default="1,2", help="worker process counts, one measurement each")
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    report("throughput", asyncio.run(main(args.runs, counts, args.temporal)))
