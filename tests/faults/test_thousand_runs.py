"""1,000 Runs applied at once (one manifest) on the embedded stack, one worker process: every one is taken,
runs once in one workflow and Succeeds; none is lost, doubled or left behind."""

import time
from collections import Counter
from pathlib import Path

import pytest

from testbed.embedded import bench_stack, start_workers, stop_workers, wait_terminal
from tests.faults.audit import audit, runs

RUNS = 1000


@pytest.mark.timeout(1500)  # its own bound on the runs is shorter
async def test_a_thousand_runs_created_at_once_all_finish_once(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    async with bench_stack(tmp_path, serve_worker=False) as (dev, _agent):
        docs = runs("burst", RUNS)
        names = {d["metadata"]["name"] for d in docs}
        [worker] = await start_workers(dev, 1)
        try:
            started = time.monotonic()
            await dev.runs.apply(docs)
            applied = time.monotonic() - started
            await wait_terminal(dev, sorted(names), within=1200)
            took = time.monotonic() - started
        finally:
            stop_workers([worker])
        result = await audit(dev, names)
        result.assert_nothing_lost_or_doubled(names, f"{RUNS} runs at once")
    print(
        f"{RUNS} runs: applied in {applied:.1f}s, all Succeeded after {took:.0f}s ({RUNS / took:.1f} runs/s)"
    )
    fault_counts["thousand_runs.runs"] += RUNS
