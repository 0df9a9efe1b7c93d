#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok: simulated nodes and pod lifecycles against a real API server) from the Go module
# proxy into a cache outside the clone, keyed by version. The test cluster runs it beside its real node
# (testbed/kwok.py) for nodes a 2-core machine cannot have: a labelled, tainted GPU node. Never kwokctl (it
# downloads cluster binaries). Rebuilds only when missing.
#
#   testbed/build-kwok.sh            build it when missing, print the cache directory
set -euo pipefail

KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="${KSQUAD_KWOK_BINS:-$cache_root/kwok-${KWOK_VERSION}}"
mkdir -p "$out"
# One builder per cache at a time (`make testbins` and a test that found the cache empty may start together).
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
log() { printf '[build-kwok %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$out/kwok" ] && [ -f "$out/stages.yaml" ]; then
  log "cached: kwok ${KWOK_VERSION} in $out"
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-kwok-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
log "building kwok ${KWOK_VERSION}"
# Its own module (kwok pins its k8s.io versions): go install builds exactly the released go.mod.
if [ -n "${KSQUAD_FETCH_ONLY:-}" ]; then  # only the modules: -n loads every package and builds nothing
  go install -n "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}" 2>"$work/plan" || { cat "$work/plan" >&2; exit 1; }
  log "modules downloaded"; exit 0
fi
GOBIN="$work/bin" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
# kwok's own "fast" stages (a node Ready at once with its Lease kept; a pod Ready at once, completed, deleted),
# from the module it was built from: without stages it exits.
src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@${KWOK_VERSION}/kustomize/stage"
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
  pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  printf -- '---\n'
  cat "$src/$stage.yaml"
done > "$out/stages.yaml.tmp"
mv "$out/stages.yaml.tmp" "$out/stages.yaml"
mv "$work/bin/kwok" "$out/kwok.tmp"
mv "$out/kwok.tmp" "$out/kwok"
log "kwok ${KWOK_VERSION} ready in $((SECONDS - t0)) s"
echo "$out"
