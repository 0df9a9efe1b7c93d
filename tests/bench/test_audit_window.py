"""bench.agent_sandbox_claims.AuditWindow: the writes of a measurement's window read from the API server's audit log,
across the log's rotations (at 100 MB the API server renames `audit.log` to `audit-<time>.log` and starts anew; the
full side-by-side run rotates several times a rate), and nothing from before the window."""

import json
from pathlib import Path

from bench.agent_sandbox_claims import AuditWindow

NS = "claims"


def write(log: Path, *names: str) -> None:
    with log.open("a") as f:
        for name in names:
            event = {
                "stage": "ResponseComplete",
                "verb": "create",
                "objectRef": {"namespace": NS, "resource": "pods", "name": name},
                "user": {"username": "kwok"},
            }
            f.write(json.dumps(event) + "\n")


def test_a_window_counts_its_writes_across_two_rotations_and_none_before_it(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    write(log, "before-1", "before-2")
    window = AuditWindow(log, NS)
    write(log, "in-1")
    log.rename(tmp_path / "audit-2026-12-06T16-00-00.000.log")  # rotated
    write(log, "in-2", "in-3")
    log.rename(tmp_path / "audit-2026-12-06T16-10-00.000.log")  # and again
    write(log, "in-4")
    names = [e["objectRef"]["name"] for e in window.events()]
    assert names == ["in-1", "in-2", "in-3", "in-4"]
    assert window.per_claim(4, lambda user: user)["writes_per_claim"] == 1.0


def test_a_window_opened_before_the_log_existed_reads_all_of_it(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    window = AuditWindow(log, NS)
    write(log, "in-1")
    assert [e["objectRef"]["name"] for e in window.events()] == ["in-1"]
