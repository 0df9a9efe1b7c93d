"""Fault tests count what they did (runs, kills, faults injected, inputs tried) and what was lost or doubled;
the counts of the last session go to tests/faults/last-run.json (tests.support.fault_counts)."""

from collections import Counter
from collections.abc import Iterator

import pytest

# ksquad on the control plane, as the chart does it
from tests.crd_bridge.conftest import start_stack as start_stack
from tests.support.fault_counts import record_counts


@pytest.fixture(scope="session")
def fault_counts() -> Iterator[Counter[str]]:
    counts: Counter[str] = Counter()
    yield counts
    if counts:
        record_counts(counts)
