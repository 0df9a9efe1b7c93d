#!/usr/bin/env bash
# Builds kube-network-policies (sigs.k8s.io/kube-network-policies: NetworkPolicy enforced with nftables and
# NFQUEUE, one process per node) from the Go module proxy into a cache outside the clone, keyed by version.
# The test cluster's node runs it (testbed/netpol.py). Rebuilds only when missing.
#
#   testbed/build-network-policies.sh            build it when missing, print the cache directory
set -euo pipefail

NETPOL_VERSION="${NETPOL_VERSION:-v0.8.0}"
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="${KSQUAD_NETPOL_BINS:-$cache_root/kube-network-policies-${NETPOL_VERSION}}"
mkdir -p "$out"
# One builder per cache at a time (`make testbins` and a test that found the cache empty may start together): the
# second waits here, then finds built what the first built.
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
log() { printf '[build-network-policies %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$out/kube-network-policies" ]; then
  log "cached: kube-network-policies ${NETPOL_VERSION} in $out"
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-netpol-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
cd "$work"
# Its command is the package .../cmd (`go install` would name the binary `cmd`): build it from a small module.
printf 'module ksquad.local/testbins/netpol\n\ngo 1.24\n' > go.mod
go get "sigs.k8s.io/kube-network-policies/cmd@${NETPOL_VERSION}" >&2
if [ -n "${KSQUAD_FETCH_ONLY:-}" ]; then log "modules downloaded"; exit 0; fi
log "building kube-network-policies ${NETPOL_VERSION}"
go build -ldflags "-s -w" -o "$out/kube-network-policies.tmp" sigs.k8s.io/kube-network-policies/cmd
mv "$out/kube-network-policies.tmp" "$out/kube-network-policies"
log "kube-network-policies ${NETPOL_VERSION} ready in $((SECONDS - t0)) s"
echo "$out"
