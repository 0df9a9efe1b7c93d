"""The test session's namespaces (testbed/isolate.py): nothing a session starts outlives it, however it
ends, and its network leads nowhere but to itself. Checked with a session of its own, nested in this one."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from testbed.controlplane import LOCK, ROOT_PREFIX, hold_lock, sweep_abandoned
from testbed.isolate import MARKER, NODE_ADDRESS

ROOT = Path(__file__).parents[2]


def nested(script: str) -> subprocess.Popen[str]:
    """`script` (sh) as a session of its own: the wrapper, not told it already runs in one."""
    env = {k: v for k, v in os.environ.items() if k != MARKER}
    return subprocess.Popen(
        [sys.executable, "-m", "testbed.isolate", "sh", "-c", script],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def pids_running(command: str, exact: bool = True) -> list[int]:
    """Processes whose command line is `command` (or, not exact, contains it)."""
    wanted = command.replace(" ", "\0").encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().rstrip(b"\0")
            except OSError:
                continue
            if cmdline == wanted or (not exact and wanted in cmdline):
                found.append(int(proc.name))
    return found


def test_a_killed_session_takes_every_process_it_started_with_it() -> None:
    # A daemon that left its parent (setsid, like containerd's shims) and a plain child; then the session is
    # SIGKILLed from outside, as a CI timeout does.
    marker = f"sleep {3000 + uuid.uuid4().int % 1000}"
    session = nested(f"setsid {marker} & {marker} & echo started; wait")
    assert session.stdout is not None
    assert session.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 10
    while len(pids_running(marker)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids_running(marker)) == 2
    (init,) = [p for p in pids_running("testbed.isolate --inside", exact=False) if _parent(p) == session.pid]
    os.kill(session.pid, signal.SIGKILL)  # the `unshare` process...
    os.kill(init, signal.SIGKILL)  # ...and the namespace's PID 1, which ends the namespace
    session.wait(10)
    deadline = time.monotonic() + 10
    while pids_running(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pids_running(marker) == [], "the daemon died with its session"


def test_the_sessions_network_is_loopback_and_the_node_bridge_only() -> None:
    session = nested("ip -o -4 addr show | awk '{print $2, $4}'; echo routes; ip -4 route show")
    output, _ = session.communicate(timeout=30)
    addresses, _, routes = output.partition("routes\n")
    assert sorted(addresses.split("\n")[:-1]) == ["ksq0 10.244.0.1/16", "lo 127.0.0.1/8"]
    assert routes.split() == [
        "10.244.0.0/16",
        "dev",
        "ksq0",
        "proto",
        "kernel",
        "scope",
        "link",
        "src",
        NODE_ADDRESS,
    ]


def test_a_killed_sessions_cluster_directory_is_swept(tmp_path: Path) -> None:
    abandoned, live, kept = (tmp_path / f"{ROOT_PREFIX}{n}" for n in ("dead", "live", "kept"))
    for root in (abandoned, live, kept):
        root.mkdir()
        (root / LOCK).touch()
    (kept / "keep").touch()
    lock = hold_lock(live)
    try:
        sweep_abandoned(tmp_path)
    finally:
        os.close(lock)
    assert not abandoned.exists()
    assert live.exists() and kept.exists()


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
