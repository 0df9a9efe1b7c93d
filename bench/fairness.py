"""Fair share on a rate-limited credential, on the embedded stack with one `ksquad-worker` process.

Two Teams share one credential. While Team A's burst of runs is in flight the model answers 429 with Retry-After:
every run on the credential pauses, and when the limit ends they call again one at a time, `resumePerSecond`
apart (store.ramps). Measured, each scenario on a limit of its own:

- baseline: Team B's runs alone, paused by the limit; B's time from the limit's end to each run's model call;
- fair: Team A's burst (--burst runs) pauses first, then B's arrive; the same figure for B, against the baseline
  (target: p95 at most twice it);
- pause order: the same two bursts, with neither run naming a Team: one tenant, so the ramp is pause order, as
  every release was before fair ramps (B waits behind all of A);
- weights: Teams heavy (weight 2) and light (weight 1), each with a backlog, on a ramp of --weights-rate; each
  60 s window of the time both still wait (sliding by 5 s): heavy's calls / light's (target: within 10% of 2)
  and Jain's index of the calls per unit of weight (target: >= 0.95).

    python -m bench.fairness [--burst 1000] [--small 10] [--heavy 240] [--light 120] [--temporal dev|production]
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.stats import percentiles, report
from dev.embedded import LOCAL_CREDENTIAL_SECRET
from dev.stack import DevStack
from testbed.embedded import AGENT, NAMESPACE, TemporalKind, bench_stack, start_workers, stop_workers, until

API = "ksquad.io/v1alpha1"
CHUNK = 250
# Well below what one worker completes here (5-7 runs/s), so the ramp, not the worker's queue, sets the pace: at
# 4/s the worker's backlog added half a second to each of B's calls beside A's burst, and none alone.
RAMP_PER_SECOND = 2.0
WINDOW_SECONDS = 60.0
POLL_SECONDS = 2.0  # each look reads every Run: more often would take CPU from the stack being measured
SCENARIOS = ("baseline", "fair", "pause_order", "weights")


def team(name: str, weight: float) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Team",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"agents": [AGENT], "weight": weight},
    }


def runs_of(
    prefix: str, count: int, model: str, team_ref: str | None, start: int = 0
) -> list[dict[str, Any]]:
    docs = []
    for i in range(start, start + count):
        name = f"{prefix}-{i:05d}"
        spec: dict[str, Any] = {"agents": [AGENT], "model": model, "inputs": {"task": f"[{name}]"}}
        if team_ref is not None:
            spec["teamRef"] = team_ref
        docs.append(
            {
                "apiVersion": API,
                "kind": "Run",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": spec,
            }
        )
    return docs


async def phases(dev: DevStack, prefix: str) -> Counter[str]:
    runs = await dev.runs.objects.of_kind("Run", NAMESPACE)
    return Counter((r.status or {}).get("phase", "") for r in runs if r.name.startswith(f"{prefix}-"))


async def apply_in_chunks(dev: DevStack, docs: list[dict[str, Any]]) -> None:
    for start in range(0, len(docs), CHUNK):
        await dev.runs.apply(docs[start : start + CHUNK])


async def limited_ramp(
    dev: DevStack, scenario: str, groups: list[tuple[str, int, str | None]], retry_after: int
) -> tuple[datetime, dict[str, float]]:
    """Runs of `groups` (prefix, count, Team) in that order on a model that answers the first call 429: each
    group applied once the one before is Paused. Returns the limit's end and, per run, its call's time (epoch
    seconds) after it."""
    assert dev.scripted is not None
    model = f"fair-{scenario}"
    dev.scripted.script[model] = [{"error": 429, "retry_after": str(retry_after)}, {"text": "ok"}]
    prefix, _, team_ref = groups[0]
    await dev.runs.apply(runs_of(prefix, 1, model, team_ref))

    async def first_paused() -> bool:
        return (await phases(dev, prefix)).get("Paused") == 1

    await until(first_paused, f"{scenario}: the first run to pause", within=120, every=0.5)
    first = await dev.runs.get(NAMESPACE, f"{prefix}-00000")
    opens = datetime.fromisoformat(str((first.status or {})["resumeAt"]))
    for i, (prefix, count, team_ref) in enumerate(groups):
        await apply_in_chunks(dev, runs_of(prefix, count - (i == 0), model, team_ref, start=int(i == 0)))

        async def paused(prefix: str = prefix, count: int = count) -> bool:
            # A run that called before it heard of the limit has Succeeded: it is not in the ramp.
            seen = await phases(dev, prefix)
            return seen.get("Paused", 0) + seen.get("Succeeded", 0) >= count

        await until(
            paused, f"{scenario}: {prefix}'s {count} runs to pause", within=retry_after, every=POLL_SECONDS
        )
    print(
        f"{scenario}: all paused {(opens - datetime.now(opens.tzinfo)).total_seconds():.0f} s before the limit ends",
        file=sys.stderr,
        flush=True,
    )
    total = sum(count for _, count, _ in groups)

    async def drained() -> bool:
        done: Counter[str] = Counter()
        for prefix, _, _ in groups:
            done.update(await phases(dev, prefix))
        return done.get("Succeeded", 0) == total

    wait = (opens - datetime.now(opens.tzinfo)).total_seconds() + total / RAMP_PER_SECOND * 2 + 300
    await until(drained, f"{scenario}: every run to succeed", within=wait, every=POLL_SECONDS)
    names = {
        doc["metadata"]["name"]
        for prefix, count, team_ref in groups
        for doc in runs_of(prefix, count, model, team_ref)
    }
    calls: dict[str, float] = {}
    for call in dev.scripted.calls:
        if call.model == model and call.at >= opens.timestamp() - 0.05 and "[" in call.task:
            name = call.task[call.task.index("[") + 1 : call.task.index("]")]
            if name in names:
                calls.setdefault(name, call.at)
    return opens, calls


def waits_ms(opens: datetime, calls: dict[str, float], prefix: str) -> list[float]:
    return [(at - opens.timestamp()) * 1000 for name, at in calls.items() if name.startswith(f"{prefix}-")]


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def windows(calls: dict[str, float], heavy: str, light: str) -> list[dict[str, float]]:
    """Heavy's and light's calls in each 60 s window while both still had runs waiting."""
    heavy_at = sorted(at for name, at in calls.items() if name.startswith(f"{heavy}-"))
    light_at = sorted(at for name, at in calls.items() if name.startswith(f"{light}-"))
    start, end = min(heavy_at[0], light_at[0]), min(heavy_at[-1], light_at[-1])
    out = []
    t = start
    while t + WINDOW_SECONDS <= end:
        h = sum(t <= at < t + WINDOW_SECONDS for at in heavy_at)
        lo = sum(t <= at < t + WINDOW_SECONDS for at in light_at)
        per_weight = (h / 2, lo / 1)
        jain = sum(per_weight) ** 2 / (2 * sum(x * x for x in per_weight)) if h or lo else 0.0
        out.append(
            {
                "from_s": round(t - start, 1),
                "heavy": h,
                "light": lo,
                "ratio": round(h / lo, 3) if lo else 0.0,
                "jain": round(jain, 4),
            }
        )
        t += 5
    return out


async def measure(
    dev: DevStack, burst: int, small: int, heavy: int, light: int, weights_rate: float
) -> dict[str, Any]:
    await dev.runs.apply([team("a", 1), team("b", 1), team("heavy", 2), team("light", 1)])
    await set_ramp(dev, RAMP_PER_SECOND)
    # Long enough for the whole burst to be applied and paused before the limit ends (about 0.15 s a run here).
    retry_after = int((burst + small) * 0.2) + 60
    results: dict[str, Any] = {"burst": burst, "small": small, "resume_per_second": RAMP_PER_SECOND}

    opens, calls = await limited_ramp(dev, "baseline", [("base-b", small, "b")], 30)
    baseline = waits_ms(opens, calls, "base-b")
    results["baseline"] = {"b_limit_end_to_call": percentiles(baseline), "b_p95_ms": round(p95(baseline), 1)}

    opens, calls = await limited_ramp(
        dev, "fair", [("fair-a", burst, "a"), ("fair-b", small, "b")], retry_after
    )
    fair = waits_ms(opens, calls, "fair-b")
    results["fair"] = {
        "b_limit_end_to_call": percentiles(fair),
        "b_p95_ms": round(p95(fair), 1),
        "a_limit_end_to_call": percentiles(waits_ms(opens, calls, "fair-a")),
        "b_p95_over_baseline": round(p95(fair) / p95(baseline), 3),
    }

    opens, calls = await limited_ramp(
        dev, "pause_order", [("fifo-a", burst, None), ("fifo-b", small, None)], retry_after
    )
    fifo = waits_ms(opens, calls, "fifo-b")
    results["pause_order"] = {
        "b_limit_end_to_call": percentiles(fifo),
        "b_p95_ms": round(p95(fifo), 1),
        "b_p95_over_baseline": round(p95(fifo) / p95(baseline), 3),
    }

    await set_ramp(dev, weights_rate)
    opens, calls = await limited_ramp(
        dev,
        "weights",
        [("w-heavy", heavy, "heavy"), ("w-light", light, "light")],
        int((heavy + light) * 0.2) + 60,
    )
    shares = windows(calls, "w-heavy", "w-light")
    ratios = [w["ratio"] for w in shares]
    results["weights"] = {
        "heavy": heavy,
        "light": light,
        "resume_per_second": weights_rate,
        "windows": len(shares),
        "ratio_min": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        "ratio_mean": round(statistics.fmean(ratios), 3) if ratios else None,
        "jain_min": min(w["jain"] for w in shares) if shares else None,
        "per_window": shares,
    }
    results["targets"] = {"b_p95_over_baseline": 2.0, "ratio_within": [1.8, 2.2], "jain_min": 0.95}
    return results


async def set_ramp(dev: DevStack, per_second: float) -> None:
    assert dev.scripted is not None
    await dev.runs.apply(
        [
            {
                "apiVersion": API,
                "kind": "ModelEndpoint",
                "metadata": {"name": "local", "namespace": NAMESPACE},
                "spec": {
                    "url": dev.model_url,
                    "credentialSecretRef": {"name": LOCAL_CREDENTIAL_SECRET},
                    "resumePerSecond": per_second,
                },
            }
        ]
    )


async def main(
    burst: int, small: int, heavy: int, light: int, weights_rate: float, temporal: TemporalKind
) -> dict[str, Any]:
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        async with bench_stack(Path(tmp), serve_worker=False, temporal=temporal) as (dev, _agent):
            [worker] = await start_workers(dev, 1)
            try:
                results = await measure(dev, burst, small, heavy, light, weights_rate)
            finally:
                stop_workers([worker])
    return {**results, "temporal": temporal, "seconds": round(time.perf_counter() - t0, 1)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--burst", type=int, default=1000, help="Team A's runs")
    parser.add_argument("--small", type=int, default=10, help="Team B's runs")
    parser.add_argument("--heavy", type=int, default=240, help="the weight-2 Team's runs")
    parser.add_argument("--light", type=int, default=120, help="the weight-1 Team's runs")
    parser.add_argument(
        "--weights-rate", type=float, default=RAMP_PER_SECOND, help="resumePerSecond, weights"
    )
    parser.add_argument("--temporal", choices=["dev", "production"], default="dev")
    args = parser.parse_args()
    report(
        "fairness",
        asyncio.run(main(args.burst, args.small, args.heavy, args.light, args.weights_rate, args.temporal)),
    )
