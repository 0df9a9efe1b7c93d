"""A provider answering 429 with Retry-After of three days, over real HTTP through the reference agent, on the
embedded stack: the run pauses for the cap (one hour), not three days, says so in its status, calls nothing
meanwhile, and a cancel still ends it at once. (Re-routing to another eligible agent when a limit is this long
is tests/workflows/test_run_rate_limits.py::test_a_very_long_retry_after_is_capped_and_rerouted.)"""

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from testbed.embedded import AGENT, MODEL, NAMESPACE, bench_stack, wait_terminal
from workflows.run.route import RATE_LIMITS
from workflows.signals import RunSignal

THREE_DAYS = 3 * 86400


async def test_a_three_day_retry_after_pauses_for_the_cap_and_calls_nothing_meanwhile(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    script: dict[str, list[dict[str, Any]]] = {
        MODEL: [{"error": 429, "retry_after": str(THREE_DAYS)}, {"text": "too early"}]
    }
    async with bench_stack(tmp_path, script) as (dev, _agent):
        assert dev.scripted is not None
        limited_at = datetime.now(UTC)
        await dev.runs.apply(
            [
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Run",
                    "metadata": {"name": "three-days", "namespace": NAMESPACE},
                    "spec": {"agents": [AGENT]},
                }
            ]
        )
        status: dict[str, object] = {}
        for _ in range(300):
            status = (await dev.runs.get(NAMESPACE, "three-days")).status or {}
            if status.get("phase") == "Paused":
                break
            await asyncio.sleep(0.1)
        assert (status.get("phase"), status.get("pauseReason")) == ("Paused", "RateLimited"), status
        resume_at = datetime.fromisoformat(str(status["resumeAt"]))
        cap = timedelta(seconds=RATE_LIMITS.cap_seconds)
        assert limited_at + cap - timedelta(seconds=5) <= resume_at <= datetime.now(UTC) + cap, (
            f"paused until {resume_at}: the cap ({cap}) from now, not three days"
        )
        await asyncio.sleep(3)
        assert len(dev.scripted.calls) == 1, "nothing is called while paused"

        await dev.runs.signal(NAMESPACE, "three-days", RunSignal.CANCEL, "the test is over")
        phases = await wait_terminal(dev, ["three-days"], within=60)
        assert phases == {"three-days": "Cancelled"}
    fault_counts["long_retry_after.runs"] += 1
