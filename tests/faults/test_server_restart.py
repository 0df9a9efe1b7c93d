"""Temporal's dev server (file-backed, as `ksquad dev` runs it) stopped in the middle of 60 runs and started
again on the same address: the worker and the embedded bridge reconnect, every run finishes, once."""

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from testbed.embedded import MODEL, bench_stack, start_workers, stop_workers, wait_terminal
from tests.faults.audit import audit, runs

RUNS = 60
RESTARTS = 2
DOWN_SECONDS = 5


@pytest.mark.timeout(900)  # its own bound on the runs is shorter
async def test_a_restarted_temporal_server_loses_and_doubles_nothing(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    # Each model call outlasts both restarts (about 20 s in all), so runs are in flight at each of them however
    # fast the machine finishes runs (with 0.5 s, a faster stack had finished all 60 before the second one).
    script = {MODEL: [{"delay": 20, "text": "ok"}]}
    async with bench_stack(tmp_path, script, serve_worker=False) as (dev, _agent):
        assert dev.server.db_file is not None, "the embedded server keeps its state in a file"
        docs = runs("s", RUNS)
        names = {d["metadata"]["name"] for d in docs}
        [worker] = await start_workers(dev, 1)
        in_flight_at_restarts = []
        try:
            await dev.runs.apply(docs)
            for _ in range(RESTARTS):
                await asyncio.sleep(3)
                assert dev.scripted is not None
                in_flight_at_restarts.append(dev.scripted.in_flight)  # runs mid-call, not merely unstarted
                await dev.server.stop()
                await asyncio.sleep(DOWN_SECONDS)
                await dev.server.start()
            await wait_terminal(dev, sorted(names), within=600)
        finally:
            stop_workers([worker])
        print(f"{RESTARTS} restarts, with {in_flight_at_restarts} model calls in flight at each")
        assert all(in_flight_at_restarts), "each restart happened with runs mid-call"
        result = await audit(dev, names)
        result.assert_nothing_lost_or_doubled(names, "after server restarts")
    fault_counts["server_restart.runs"] += RUNS
    fault_counts["server_restart.restarts"] += RESTARTS
