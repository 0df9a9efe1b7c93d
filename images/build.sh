#!/usr/bin/env bash
# Builds ksquad's two container images from this checkout (`make images`):
#
#   ${KSQUAD_IMAGE_REPOSITORY}/ksquad:<version>        ksquad-bridge, ksquad-worker, ksquad
#   ${KSQUAD_IMAGE_REPOSITORY}/ksquad-agent:<version>  ksquad-agent, the reference sandbox agent
#
# <version> is pyproject.toml's (the chart's default tag); KSQUAD_IMAGE_REPOSITORY defaults to ghcr.io/ksquad.
# Both run as user 65532 with a read-only root filesystem, hold no compiler and no pip, and install the
# project from its wheel over the locked dependency set (images/requirements.lock, hashes checked).
#
#   images/build.sh                                        # base made here from Debian's packages
#   BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm images/build.sh   # base from a registry
#   KSQUAD_IMAGE_REPOSITORY=registry.example.com/platform images/build.sh && podman push ...
#
# Without BASE_IMAGE the base is a minimal Debian bookworm root filesystem with Python 3.11, made by mmdebstrap
# (no registry needed) and kept as localhost/ksquad-base:<key>. Builds are offline (`--network none`): the
# wheels are downloaded first, by hash, into a cache outside the clone. SOURCE_DATE_EPOCH is the commit's time,
# so the same commit and base give the same image digests. Each image is also tagged <version>-src.<digest of
# the sources> (images/source_digest.py): the test bed runs exactly the images of its checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-.venv/bin/python}"
TOOL="${CONTAINER_TOOL:-podman}"
REPOSITORY="${KSQUAD_IMAGE_REPOSITORY:-ghcr.io/ksquad}"
cache="${KSQUAD_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-images}"
# One build at a time (of any checkout): builds share the wheel cache and the build context below, and a second
# one emptied the context under the first ("No such file or directory: /wheels/deps/...").
mkdir -p "$cache"
exec 9>"$cache/build.lock"
flock 9
# Podman's default ulimits are more than a machine without CAP_SYS_RESOURCE may set ("error setting rlimit
# type 7"); an empty list keeps the engine's own. Only when the caller has no containers.conf of their own.
if [ "$TOOL" = podman ] && [ -z "${CONTAINERS_CONF:-}" ]; then export CONTAINERS_CONF="$PWD/images/containers.conf"; fi

log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
need() { command -v "$1" >/dev/null || { echo "images/build.sh: $1 not found: $2" >&2; exit 1; }; }
need "$TOOL" "install podman (Debian: apt-get install podman) or set CONTAINER_TOOL"
[ -x "$PYTHON" ] || PYTHON=python3

version="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
source_digest="$("$PYTHON" images/source_digest.py)"
t0=$SECONDS

# --- base: Debian bookworm + Python 3.11, from Debian's packages ---------------------------------------------
base_packages="python3,ca-certificates"
# No documentation, manual pages or translations (copyright files stay): about 50 MB less.
base_options=(--variant=minbase --include="$base_packages"
              --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
              --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
              --dpkgopt='path-exclude=/usr/share/info/*'
              --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/* "$1"/var/log/*')
suites=("deb http://deb.debian.org/debian bookworm main"
        "deb http://deb.debian.org/debian bookworm-updates main"
        "deb http://deb.debian.org/debian-security bookworm-security main")
if [ -z "${BASE_IMAGE:-}" ]; then
  key="$(printf '%s\n' "${base_options[@]}" "${suites[@]}" | sha256sum | cut -c1-12)"
  BASE_IMAGE="localhost/ksquad-base:bookworm-$key"
  if "$TOOL" image exists "$BASE_IMAGE" 2>/dev/null; then
    log "base: $BASE_IMAGE (cached)"
  else
    need mmdebstrap "install it (Debian: apt-get install mmdebstrap), or set BASE_IMAGE to an image with Python 3.11"
    work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
    log "base: mmdebstrap bookworm ($base_packages) -> $BASE_IMAGE"
    SOURCE_DATE_EPOCH="$epoch" mmdebstrap --quiet "${base_options[@]}" bookworm "$work/rootfs.tar" "${suites[@]}"
    printf 'FROM scratch\nADD rootfs.tar /\nCMD ["python3"]\n' > "$work/Containerfile"
    "$TOOL" build --quiet --network none --timestamp "$epoch" -t "$BASE_IMAGE" -f "$work/Containerfile" "$work" >/dev/null
    rm -rf "$work"; trap - EXIT
  fi
fi

# --- the build context: the wheels, checked against the lock's hashes ------------------------------------------
context="$cache/context"
rm -rf "$context" && mkdir -p "$context/wheels/deps" "$context/wheels/ksquad" "$context/wheels/pip" "$cache/wheels"
cp images/requirements.lock "$context/wheels/requirements.lock"
# CPython 3.11 on x86_64 with glibc 2.36 (bookworm) takes every manylinux wheel up to glibc 2.36.
platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for minor in $(seq 5 36); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
download() {  # download LOCK: every wheel of LOCK for that interpreter, into the cache
  "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary=:all: \
    "${platforms[@]}" --python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none \
    --dest "$cache/wheels" -r "$1"
}
log "wheels: the locked dependencies"
download images/requirements.lock
download images/build-tools.lock
# Only the locked files go into the context (the cache may hold other versions).
"$PYTHON" - "$cache/wheels" "$context/wheels" <<'EOF'
import re, shutil, sys
from pathlib import Path
cache, out = Path(sys.argv[1]), Path(sys.argv[2])
def pins(lock):
    return {m.group(1).lower().replace("_", "-").replace(".", "-"): m.group(2)
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", Path(lock).read_text(), re.M)}
def dest(lock, folder, rename=None):
    for name, version in pins(lock).items():
        found = [w for w in cache.glob("*.whl")
                 if w.name.split("-")[0].lower().replace("_", "-").replace(".", "-") == name
                 and w.name.split("-")[1] == version]
        if not found:
            sys.exit(f"no wheel of {name}=={version} in {cache}")
        for wheel in found:
            shutil.copy2(wheel, out / folder / (rename or wheel.name))
dest("images/requirements.lock", "deps")
dest("images/build-tools.lock", "pip", rename="pip.whl")
EOF
log "wheel: ksquad $version (source $source_digest)"
SOURCE_DATE_EPOCH="$epoch" "$PYTHON" -m pip wheel --quiet --disable-pip-version-check --no-deps \
  --wheel-dir "$context/wheels/ksquad" . >/dev/null
rm -rf build ./*.egg-info crd-bridge/*.egg-info

# --- the two images --------------------------------------------------------------------------------------------
# NO_CACHE=1 rebuilds every layer (the same digests come out: a check that the build is reproducible).
cache_flag=--layers; [ -n "${NO_CACHE:-}" ] && cache_flag=--no-cache
build() {  # build TARGET
  "$TOOL" build --quiet --network none --timestamp "$epoch" "$cache_flag" \
    --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg SOURCE_DATE_EPOCH="$epoch" --build-arg VERSION="$version" \
    --build-arg SOURCE_DIGEST="$source_digest" \
    --build-arg DEPENDENCIES_DIGEST="$(cat images/requirements.lock images/build-tools.lock | sha256sum | cut -c1-16)" \
    --target "$1" -t "$REPOSITORY/$1:$version" -t "$REPOSITORY/$1:$version-src.$source_digest" \
    -f images/Containerfile "$context" >/dev/null
}
for target in ksquad ksquad-agent; do
  log "image: $REPOSITORY/$target:$version"
  build "$target"
done
# Builds of other sources stay for checkouts side by side: the newest three of each image (by commit time).
for target in ksquad ksquad-agent; do
  "$TOOL" images --sort created --format '{{.Tag}}' "$REPOSITORY/$target" | grep -- '-src\.' | tail -n +4 |
    while read -r tag; do "$TOOL" untag "$REPOSITORY/$target:$tag"; done
done
for target in ksquad ksquad-agent; do
  image="$REPOSITORY/$target:$version"
  printf '%s\t%s\t%s\n' "$image" "$("$TOOL" image inspect --format '{{.Digest}}' "$image")" \
    "$("$TOOL" image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
done
log "built in $((SECONDS - t0)) s"
