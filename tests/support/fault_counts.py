"""Counts of what the fault tests did (runs, kills, faults injected, inputs tried, objects scanned), kept from
the last session in tests/faults/last-run.json (not committed) and quoted in tests/faults/README.md."""

import fcntl
import json
from collections.abc import Mapping
from pathlib import Path

LAST_RUN = Path(__file__).parents[1] / "faults" / "last-run.json"


def record_counts(counts: Mapping[str, int]) -> None:
    """Merge `counts` into the file; under a lock, as make test's pytest workers each end their session."""
    with LAST_RUN.with_suffix(".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous = json.loads(LAST_RUN.read_text()) if LAST_RUN.is_file() else {}
        LAST_RUN.write_text(json.dumps({**previous, **counts}, indent=2, sort_keys=True) + "\n")
