"""Counts of what the fault tests did (runs, kills, faults injected, inputs tried, objects scanned), kept from
the last session in tests/faults/last-run.json (not committed) and quoted in tests/faults/README.md."""

import fcntl
import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path

LAST_RUN = Path(__file__).parents[1] / "faults" / "last-run.json"
# One id for the whole test run: xdist gives its workers the same one; a run without workers makes its own.
RUN_ID = os.environ.get("PYTEST_XDIST_TESTRUNUID") or uuid.uuid4().hex


def record_counts(counts: Mapping[str, int]) -> None:
    """Add `counts` to this run's in the file (a count of an earlier run is dropped); under a lock, as make
    test's pytest workers each end their session: each counts what it did, the run's count is their sum."""
    with LAST_RUN.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous = json.loads(LAST_RUN.read_text()) if LAST_RUN.is_file() else {}
        totals: dict[str, int] = previous.get("counts", {}) if previous.get("run") == RUN_ID else {}
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
        LAST_RUN.write_text(json.dumps({"run": RUN_ID, "counts": totals}, indent=2, sort_keys=True) + "\n")
