"""The worker SIGKILLed at random points while 100 runs go through it (embedded stack: Temporal's dev server,
the store, the bridge and the model in this process; the worker its own process, killed and started again):
every run ends, once, in one workflow, and every attempt reached the model once."""

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
KILLS = 12


@pytest.mark.timeout(900)  # its own bound on the runs is shorter
async def test_sigkilled_workers_lose_and_double_nothing_over_100_runs(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    seed = int(os.environ.get("KSQUAD_FAULT_SEED") or random.SystemRandom().randrange(1 << 30))
    rng = random.Random(seed)
    script = {MODEL: [{"delay": 0.5, "text": "ok"}]}  # each call takes a while: kills land mid-call too
    async with bench_stack(tmp_path, script, serve_worker=False) as (dev, _agent):
        docs = runs("k", RUNS)
        names = {d["metadata"]["name"] for d in docs}
        # The runs go in in waves, one before each kill: every kill finds fresh runs in flight, however fast the
        # machine (all at once, 100 runs could finish within four kills).
        waves = [docs[i : i + WAVE] for i in range(0, RUNS, WAVE)]
        [worker] = await start_workers(dev, 1)
        kills, unfinished_at_kills = 0, []
        try:
            await dev.runs.apply(waves.pop(0))
            left = WAVE
            while kills < KILLS and left:
                # Let each new worker get going (some run finishes), then kill it at a random moment.
                for _ in range(600):
                    if await unfinished(dev, names) < left:
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError(f"no run finished in 60 s after kill {kills} (seed {seed})")
                if waves:
                    await dev.runs.apply(waves.pop(0))
                await asyncio.sleep(rng.uniform(0, 2.0))
                left = await unfinished(dev, names)
                if not left:
                    break
                worker.kill()
                worker.wait(10)
                kills += 1
                unfinished_at_kills.append(left)
                await asyncio.sleep(rng.uniform(0, 1.0))
                [worker] = await start_workers(dev, 1)
            for wave in waves:  # past the last kill, the rest go in to the last worker
                await dev.runs.apply(wave)
            await wait_terminal(dev, sorted(names), within=600)
        finally:
            stop_workers([worker])
        print(f"seed {seed}: {kills} SIGKILLs, with {unfinished_at_kills} runs unfinished at each")
        assert kills >= 5, f"the runs outpaced the killer (seed {seed}): only {kills} kills"
        result = await audit(dev, names)
        result.assert_nothing_lost_or_doubled(names, f"seed {seed}")
    fault_counts["worker_kills.runs"] += RUNS
    fault_counts["worker_kills.sigkills"] += kills
    fault_counts["worker_kills.retried_attempts"] += result.model_calls - RUNS
