"""The container images pods of the test cluster run: ksquad's own (built by `make images`) and the pod
sandbox ("pause") image containerd needs, in one archive containerd imports.

Nothing is pulled: no registry is reachable here. The images must have been built from this checkout (their
label `io.ksquad.source-digest` equals images/source_digest.py's answer), so a test never runs stale code in
a container; otherwise the test bed fails and says to run `make images`.
"""

import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
REPOSITORY = os.environ.get("KSQUAD_IMAGE_REPOSITORY", "ghcr.io/ksquad")
KSQUAD_IMAGE = f"{REPOSITORY}/ksquad:{VERSION}"
AGENT_IMAGE = f"{REPOSITORY}/ksquad-agent:{VERSION}"
# containerd's pod sandbox image: the ksquad image (no layer of its own) holding the network namespace open.
PAUSE_IMAGE = "localhost/ksquad-testbed/pause:1"
PAUSE_CONTAINERFILE = f"""FROM {KSQUAD_IMAGE}
ENTRYPOINT ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"]
CMD []
"""
CONTAINERS_CONF = ROOT / "images" / "containers.conf"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ksquad-images" / "archives"


class ImagesError(RuntimeError):
    pass


def _podman(*args: str, input: str | None = None) -> str:
    env = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}
    try:
        done = subprocess.run(
            ["podman", *args], input=input, capture_output=True, text=True, env=env, timeout=600
        )
    except FileNotFoundError:
        raise ImagesError(
            "podman not found: run `make test` (it installs it) or apt-get install podman"
        ) from None
    if done.returncode != 0:
        raise ImagesError(f"podman {' '.join(args)} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip()


def source_digest() -> str:
    done = subprocess.run(
        [sys.executable, str(ROOT / "images" / "source_digest.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def check_current() -> None:
    """Fail unless both images exist and were built from this checkout."""
    want = source_digest()
    for image in (KSQUAD_IMAGE, AGENT_IMAGE):
        try:
            label = _podman(
                "image", "inspect", "--format", '{{index .Labels "io.ksquad.source-digest"}}', image
            )
        except ImagesError as err:
            raise ImagesError(f"image {image} is missing: run `make images` ({err})") from None
        if label != want:
            raise ImagesError(
                f"image {image} was built from other sources ({label}, the checkout is {want}): "
                f"run `make images`"
            )


def archive() -> Path:
    """One archive with the ksquad, agent and pause images, cached by their ids (a rebuild makes a new one)."""
    check_current()
    _podman(
        "build",
        "--quiet",
        "--network",
        "none",
        "-t",
        PAUSE_IMAGE,
        "-f",
        "-",
        str(ROOT / "images"),
        input=PAUSE_CONTAINERFILE,
    )
    images = (KSQUAD_IMAGE, AGENT_IMAGE, PAUSE_IMAGE)
    ids = [_podman("image", "inspect", "--format", "{{.Id}}", image) for image in images]
    key = hashlib.sha256(" ".join(ids).encode()).hexdigest()[:16]
    path = CACHE / f"testbed-{key}.tar"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        for old in CACHE.glob("testbed-*.tar"):
            old.unlink(missing_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        _podman(
            "save",
            "--quiet",
            "--multi-image-archive",
            "--format",
            "docker-archive",
            "-o",
            str(partial),
            *images,
        )
        partial.rename(path)
    return path
