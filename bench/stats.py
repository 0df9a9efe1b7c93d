"""Small helpers shared by the benchmarks."""

import json
import platform
import statistics
import sys
from datetime import UTC, datetime
from typing import Any


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]

    return {"n": len(ordered), "p50_ms": round(pct(50), 3), "p99_ms": round(pct(99), 3),
            "mean_ms": round(statistics.fmean(ordered), 3), "max_ms": round(ordered[-1], 3)}  # fmt: skip


def report(name: str, results: dict[str, Any]) -> None:
    """Print one JSON document: what ran, where, when, and the numbers."""
    doc = {
        "benchmark": name,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": _cpus()},
        **results,
    }
    print(json.dumps(doc, indent=2))


def _cpus() -> int:
    import os

    return os.cpu_count() or 0
