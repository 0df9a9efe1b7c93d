"""A 429 on a credential reaches the runs that start right after it, before their first call. On the embedded
stack (a `ksquad-worker` process, the store, Temporal's dev server, the reference agent over HTTP and the scripted
model), 250 Runs applied at once the moment one run is paused by a limit all pause without calling the model.

Found by bench.paused: a subscribing run read the limit from the credential's throttle workflow's memo, which
changes only with that workflow's next task; under a burst of new runs that task came seconds late, and 175 of
1,000 runs called the provider during the limit. The run that gets the 429 now writes it to the store before it
tells the throttle, and a subscriber reads it there."""

from collections import Counter
from pathlib import Path
from typing import Any

from testbed.embedded import MODEL, NAMESPACE, bench_stack, run_docs, start_workers, stop_workers, until

BURST = 250


async def test_runs_started_just_after_a_limit_pause_before_their_first_call(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    script: dict[str, list[dict[str, Any]]] = {
        MODEL: [{"error": 429, "retry_after": "900"}, {"text": "called during the limit"}]
    }
    async with bench_stack(tmp_path, script, serve_worker=False) as (dev, _agent):
        assert dev.scripted is not None
        workers = await start_workers(dev, 1)
        try:

            async def phases() -> dict[str, tuple[str, str]]:
                return {
                    r.name: ((r.status or {}).get("phase", ""), (r.status or {}).get("pauseReason", ""))
                    for r in await dev.runs.objects.of_kind("Run", NAMESPACE)
                }

            await dev.runs.apply(run_docs("first", 1))

            async def first_paused() -> bool:
                return (await phases()).get("first-00000", ("", ""))[0] == "Paused"

            await until(first_paused, "the first run to pause on its 429", within=120)
            assert len(dev.scripted.calls) == 1

            await dev.runs.apply(run_docs("next", BURST))

            async def burst_settled() -> bool:
                mine = [p for name, (p, _) in (await phases()).items() if name.startswith("next-")]
                return len(mine) == BURST and all(p in ("Paused", "Succeeded", "Failed") for p in mine)

            await until(burst_settled, f"the {BURST} runs to pause", within=600, every=1)
            burst = Counter(v for name, v in (await phases()).items() if name.startswith("next-"))
            assert burst == {("Paused", "RateLimited"): BURST}, burst
            assert len(dev.scripted.calls) == 1, (
                f"{len(dev.scripted.calls) - 1} runs called the rate-limited model during its limit"
            )
        finally:
            stop_workers(workers)
    fault_counts["limit_reaches_new_runs.runs"] += BURST + 1
