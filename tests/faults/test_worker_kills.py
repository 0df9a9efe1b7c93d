"""The worker SIGKILLed ten times, each time mid model call, while 100 runs go through it (embedded stack:
Temporal's dev server, the store, the bridge and the model in this process; the worker its own process, killed and
started again): every run ends, once, in one workflow, and every attempt reached the model once."""

import asyncio
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from testbed.embedded import MODEL, bench_stack, start_workers, stop_workers, wait_terminal
from tests.faults.audit import audit, runs, unfinished

RUNS = 100
WAVE = 10
CALL_DELAY = 0.5


@pytest.mark.timeout(900)  # its own bound on the runs is shorter
async def test_sigkilled_workers_lose_and_double_nothing_over_100_runs(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    seed = int(os.environ.get("KSQUAD_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    # Each call takes a while, so the kills land mid-call.
    script = {MODEL: [{"delay": CALL_DELAY, "text": "ok"}]}
    async with bench_stack(tmp_path, script, serve_worker=False) as (dev, _agent):
        docs = runs("k", RUNS)
        names = {d["metadata"]["name"] for d in docs}
        # The runs go in in waves, one before each kill (all at once, 100 runs could finish within four kills).
        waves = [docs[i : i + WAVE] for i in range(0, RUNS, WAVE)]
        assert dev.scripted is not None
        [worker] = await start_workers(dev, 1)
        unfinished_at_kills: list[int] = []
        try:
            for wave in waves:
                calls = len(dev.scripted.calls)
                await dev.runs.apply(wave)
                # Kill while a model call is in flight, so every kill finds a run mid-attempt however fast the
                # machine: wait for the wave's first call (this worker is up and working), then kill within the
                # call's delay. Waiting for runs to finish instead raced them (CI: a wave done before the kill).
                for _ in range(600):
                    if len(dev.scripted.calls) > calls:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(
                        f"no model call in 60 s after kill {len(unfinished_at_kills)} (seed {seed})"
                    )
                await asyncio.sleep(rng.uniform(0, CALL_DELAY))
                unfinished_at_kills.append(await unfinished(dev, names))
                worker.kill()
                worker.wait(10)
                await asyncio.sleep(rng.uniform(0, 1.0))
                [worker] = await start_workers(dev, 1)
            await wait_terminal(dev, sorted(names), within=600)
        finally:
            stop_workers([worker])
        kills = len(unfinished_at_kills)
        print(f"seed {seed}: {kills} SIGKILLs, with {unfinished_at_kills} runs unfinished at each")
        assert min(unfinished_at_kills) > 0, (
            f"a kill found no run in flight (seed {seed}): {unfinished_at_kills}"
        )
        result = await audit(dev, names)
        result.assert_nothing_lost_or_doubled(names, f"seed {seed}")
    fault_counts["worker_kills.runs"] += RUNS
    fault_counts["worker_kills.sigkills"] += kills
    fault_counts["worker_kills.retried_attempts"] += result.model_calls - RUNS
