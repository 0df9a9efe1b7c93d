"""`ksquad hello` (a smoke check of the Temporal side) works end to end and prints a Temporal UI address that answers."""

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from dev.binaries import find_binary


def test_demo_runs_a_workflow_and_prints_the_ui_address(tmp_path: Path) -> None:
    ksquad = Path(sys.executable).with_name("ksquad")
    done = subprocess.run(
        [str(ksquad), "--state-dir", str(tmp_path / "state"), "hello"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "returned: 'Hello, ksquad! (from activity attempt 1)'" in out
    assert "ACTIVITY_TASK_COMPLETED" in out
    assert "TIMER_FIRED" in out
    assert "a durable timer: survives a worker restart" in out, "summaries reach the history"
    assert 'KsquadPhase = "Succeeded": 1' in out
    ui = re.search(r"Temporal UI: (http://127\.0\.0\.1:\d+) \(HTTP 200\)", out)
    assert ui, out
    assert (tmp_path / "state" / "temporal.db").is_file(), "the dev server keeps its state in the state dir"


def test_demo_keep_leaves_the_ui_answering_until_interrupted(tmp_path: Path) -> None:
    ksquad = Path(sys.executable).with_name("ksquad")
    proc = subprocess.Popen(
        [str(ksquad), "--state-dir", str(tmp_path / "state"), "hello", "--keep"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ui = None
        for line in proc.stdout:
            match = re.match(r"Temporal UI: (\S+)", line)
            if match:
                ui = match.group(1)
            if "Ctrl-C stops it" in line:
                break
        assert ui, "no UI address printed"
        assert httpx.get(ui, timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        # Ctrl-C stops the dev server gracefully (up to 15 s); communicate() drains both pipes meanwhile.
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]


def test_binaries_come_from_the_wheels() -> None:
    for name in ("temporal", "temporal-test-server", "kubectl"):
        assert find_binary(name).parent == Path(sys.executable).parent
