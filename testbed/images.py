"""The container images pods of the test cluster run: ksquad's own (built by `make images`) and the pod
sandbox ("pause") image containerd needs, in one archive containerd imports.

Nothing is pulled: no registry is reachable here. The images must have been built from this checkout: build.sh
tags them `<version>-src.<digest of the sources>` as well, the test bed takes those (so a test never runs stale
code in a container, and two checkouts side by side each get their own), and containerd knows them by the
names the chart uses. Without them the test bed fails and says to run `make images`.
"""

import hashlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def built_from_checkout() -> dict[str, str]:
    """{the name the chart uses: the image built from this checkout}; fails unless both exist."""
    digest = source_digest()
    images = {name: f"{name}-src.{digest}" for name in (KSQUAD_IMAGE, AGENT_IMAGE)}
    for built in images.values():
        try:
            _podman("image", "exists", built)
        except ImagesError:
            raise ImagesError(f"no image {built} (built from this checkout): run `make images`") from None
    return images


def archive() -> tuple[Path, dict[str, str]]:
    """One archive with the ksquad, agent and pause images built from this checkout (cached by their ids),
    and {the name each gets in the cluster: its name in the archive}."""
    names = built_from_checkout()
    pause = PAUSE_CONTAINERFILE.replace(KSQUAD_IMAGE, names[KSQUAD_IMAGE])
    _podman("build", "--quiet", "--network", "none", "-t", PAUSE_IMAGE, "-f", "-", str(ROOT), input=pause)
    names[PAUSE_IMAGE] = PAUSE_IMAGE
    ids = [_podman("image", "inspect", "--format", "{{.Id}}", image) for image in names.values()]
    key = hashlib.sha256(" ".join(ids).encode()).hexdigest()[:16]
    path = CACHE / f"testbed-{key}.tar"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        save = ["save", "--quiet", "--multi-image-archive", "--format", "docker-archive", "-o", str(partial)]
        _podman(*save, *names.values())
        partial.rename(path)
        for old in sorted(CACHE.glob("testbed-*.tar"), key=lambda p: p.stat().st_mtime)[:-3]:
            old.unlink(missing_ok=True)  # the newest three stay: checkouts side by side
    return path, names
