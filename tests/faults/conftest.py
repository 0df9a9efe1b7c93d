"""Fault tests count what they did (runs, kills, faults injected, inputs tried) and what was lost or doubled;
the counts of the last session are written to `tests/faults/last-run.json` (not committed) and quoted in
README.md."""

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crd_bridge.conftest import (
    start_stack as start_stack,
)  # ksquad on the control plane, as the chart does it

LAST_RUN = Path(__file__).with_name("last-run.json")


@pytest.fixture(scope="session")
def fault_counts() -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    if counts:
        previous = json.loads(LAST_RUN.read_text()) if LAST_RUN.is_file() else {}
        LAST_RUN.write_text(json.dumps({**previous, **counts}, indent=2, sort_keys=True) + "\n")
