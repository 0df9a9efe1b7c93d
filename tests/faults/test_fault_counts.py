"""The fault counts tests/faults/README.md quotes are the whole run's: each pytest worker adds what it counted (it
wrote over the other's before: the cluster worker's zero embedded databases won), and an earlier run's are dropped."""

from pathlib import Path

import pytest

from tests.support import fault_counts


def test_the_workers_of_one_run_add_their_counts_and_a_new_run_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fault_counts, "LAST_RUN", tmp_path / "last-run.json")
    monkeypatch.setattr(fault_counts, "RUN_ID", "run-1")
    fault_counts.record_counts({"secret_scan.histories": 200, "secret_scan.embedded_temporal_databases": 61})
    fault_counts.record_counts({"secret_scan.histories": 110, "secret_scan.embedded_temporal_databases": 0})
    fault_counts.record_counts({"worker_kills.runs": 100})
    written = (tmp_path / "last-run.json").read_text()
    assert (
        '"secret_scan.histories": 310' in written
        and '"secret_scan.embedded_temporal_databases": 61' in written
    )
    assert '"worker_kills.runs": 100' in written

    monkeypatch.setattr(fault_counts, "RUN_ID", "run-2")
    fault_counts.record_counts({"worker_kills.runs": 100})
    written = (tmp_path / "last-run.json").read_text()
    assert '"worker_kills.runs": 100' in written and "secret_scan" not in written, written
