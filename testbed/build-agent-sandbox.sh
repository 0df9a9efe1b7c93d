#!/usr/bin/env bash
# Builds kubernetes-sigs/agent-sandbox's controller (sigs.k8s.io/agent-sandbox: Sandbox, SandboxTemplate,
# SandboxWarmPool, SandboxClaim) from the Go module proxy into a cache outside the clone, keyed by version, with its
# CRDs from the same module. The test cluster runs it as a process beside its control plane (testbed/agent_sandbox.py)
# for ksquad's agent-sandbox backend. Rebuilds only when missing.
#
#   testbed/build-agent-sandbox.sh            build it when missing, print the cache directory
set -euo pipefail

AGENT_SANDBOX_VERSION="${AGENT_SANDBOX_VERSION:-v1.0.1}"  # v1.0.2 is not served by the module proxy (403)
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="${KSQUAD_AGENT_SANDBOX_BINS:-$cache_root/agent-sandbox-${AGENT_SANDBOX_VERSION}}"
mkdir -p "$out"
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
log() { printf '[build-agent-sandbox %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$out/agent-sandbox-controller" ] && [ -f "$out/crds.yaml" ]; then
  log "cached: agent-sandbox ${AGENT_SANDBOX_VERSION} in $out"
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-agent-sandbox-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
log "building agent-sandbox ${AGENT_SANDBOX_VERSION} (a few minutes the first time)"
if [ -n "${KSQUAD_FETCH_ONLY:-}" ]; then  # only the modules: -n loads every package and builds nothing
  go install -n "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@${AGENT_SANDBOX_VERSION}" 2>"$work/plan" || { cat "$work/plan" >&2; exit 1; }
  log "modules downloaded"; exit 0
fi
GOBIN="$work/bin" go install -ldflags "-s -w" "sigs.k8s.io/agent-sandbox/cmd/agent-sandbox-controller@${AGENT_SANDBOX_VERSION}"
src="$(go env GOMODCACHE)/sigs.k8s.io/agent-sandbox@${AGENT_SANDBOX_VERSION}/k8s/crds"
for crd in "$src"/*.yaml; do
  printf -- '---\n'
  cat "$crd"
done > "$out/crds.yaml.tmp"
mv "$out/crds.yaml.tmp" "$out/crds.yaml"
mv "$work/bin/agent-sandbox-controller" "$out/agent-sandbox-controller.tmp"
mv "$out/agent-sandbox-controller.tmp" "$out/agent-sandbox-controller"
log "agent-sandbox ${AGENT_SANDBOX_VERSION} ready in $((SECONDS - t0)) s"
echo "$out"
