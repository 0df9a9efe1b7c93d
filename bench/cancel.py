"""Cancel latency: how long a user waits, after `ksquad runs cancel`, for a run to be Cancelled, on the embedded
stack with the instant agent (so the figure is ksquad's: no sandbox to boot or tear down).

A Running run's agent call is an activity: the worker learns the cancel from Temporal only in the answer to the
activity's next heartbeat, then cancels the agent's task (A2A tasks/cancel), and the workflow, which waits for
the activity's cancellation to complete (the agent has stopped), writes Cancelled. A Paused run has no agent
call: its cancel is the workflow's own. Measured for each, one run at a time, a few seconds into it: from the signal sent to the phase
Cancelled in the Run's status (the store, polled every POLL_SECONDS).

    python -m bench.cancel [--runs 10] [--temporal dev|production]
"""

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.stats import percentiles, report
from dev.stack import DevStack
from testbed.embedded import NAMESPACE, TemporalKind, bench_stack, run_docs, until
from workflows.signals import RunSignal

SLOW = "slow"  # the model the runs call: it thinks for ten minutes, so a run stays Running until cancelled
POLL_SECONDS = 0.01
# A user cancels at any moment of a run, not right as it starts (when the agent's first progress has a heartbeat
# on its way): each cancel comes this long after Running, spread evenly (seeded: the same moments every time).
SPREAD_SECONDS = (0.5, 6.0)


async def phase(dev: DevStack, name: str) -> str:
    run = await dev.runs.objects.get("Run", NAMESPACE, name)
    return str(((run.status if run else None) or {}).get("phase", ""))


async def cancel_one(dev: DevStack, name: str, pause_first: bool, rng: random.Random) -> float:
    """Seconds from the cancel signal to the run's status saying Cancelled."""
    doc = run_docs(name, 1)[0]
    doc["metadata"]["name"] = name
    doc["spec"]["model"] = SLOW
    await dev.runs.apply([doc])

    async def running() -> bool:
        return await phase(dev, name) == "Running"

    await until(running, f"{name} to run", within=120, every=POLL_SECONDS)
    await asyncio.sleep(rng.uniform(*SPREAD_SECONDS))
    if pause_first:
        await dev.runs.signal(NAMESPACE, name, RunSignal.PAUSE, "bench")

        async def paused() -> bool:
            return await phase(dev, name) == "Paused"

        await until(paused, f"{name} to pause", within=120, every=POLL_SECONDS)
        await asyncio.sleep(0.5)  # settled: the agent call's cancellation is done
    started = time.perf_counter()
    await dev.runs.signal(NAMESPACE, name, RunSignal.CANCEL, "bench")

    async def cancelled() -> bool:
        return await phase(dev, name) == "Cancelled"

    await until(cancelled, f"{name} to be cancelled", within=120, every=POLL_SECONDS)
    return (time.perf_counter() - started) * 1000


async def main(runs: int, temporal: TemporalKind) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        script = {SLOW: [{"delay": 600, "text": "never"}]}
        async with bench_stack(Path(tmp), script, temporal=temporal) as (dev, _agent):
            rng = random.Random(runs)
            await cancel_one(dev, "warmup", False, rng)
            running = [await cancel_one(dev, f"running-{i}", False, rng) for i in range(runs)]
            paused = [await cancel_one(dev, f"paused-{i}", True, rng) for i in range(runs)]
    return {
        "runs": runs,
        "temporal": temporal,
        "running_to_cancelled_ms": percentiles(running),
        "paused_to_cancelled_ms": percentiles(paused),
        "targets": {"running_to_cancelled_p50_ms": 1000},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    report("cancel", asyncio.run(main(args.runs, args.temporal)))
