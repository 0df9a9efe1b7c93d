"""Print the digest of everything that goes into ksquad's images from this checkout.

build.sh stamps it on both images (label `io.ksquad.source-digest`); the test bed compares it with the
checkout's before it runs pods from them, so a test never runs yesterday's code in a container.

    python3 images/source_digest.py          # the checkout's digest
"""

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the wheel is built from, and how the images are put together.
INPUTS = [
    "pyproject.toml",
    "README.md",
    "workflows",
    "temporal_client",
    "activities",
    "worker",
    "dev",
    "cli",
    "crd-bridge",
    "agent",
    "kube",
    "images/Containerfile",
    "images/requirements.lock",
    "images/build-tools.lock",
]


def files() -> list[str]:
    """The inputs' files, tracked or not (but not ignored: no caches, no virtualenv)."""
    listed = subprocess.run(
        [
            "git",
            "-C",
            str(ROOT),
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
            "--",
            *INPUTS,
        ],
        capture_output=True,
        check=True,
    )
    return sorted({name for name in listed.stdout.decode().split("\0") if name and (ROOT / name).is_file()})


def digest() -> str:
    h = hashlib.sha256()
    for name in files():
        h.update(name.encode() + b"\0" + hashlib.sha256((ROOT / name).read_bytes()).digest())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    sys.stdout.write(digest() + "\n")
