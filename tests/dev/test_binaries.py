"""dev.binaries.dying_with_parent: a child started with it is killed when the process that started it is, so a
killed `ksquad dev` or test run leaves no server behind; nothing of Python runs in the child before its exec."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dev.binaries import dying_with_parent

PARENT = """
import subprocess, sys, time
from dev.binaries import dying_with_parent
child = subprocess.Popen(dying_with_parent(["sleep", "300"]))
print(child.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return not stat.read().split(") ")[-1].startswith("Z")
    except (FileNotFoundError, ProcessLookupError):  # gone, or reaped between the open and the read
        return False


def test_a_child_dies_with_the_process_that_started_it() -> None:
    assert dying_with_parent(["sleep", "1"])[-2:] == ["sleep", "1"]
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{child}/cmdline").read_bytes().startswith(b"sleep"):
            assert time.monotonic() < deadline, "the child never became the command"
            time.sleep(0.02)
        assert alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while alive(child):
            assert time.monotonic() < deadline, f"child {child} outlived its parent"
            time.sleep(0.05)
    finally:
        parent.kill()
