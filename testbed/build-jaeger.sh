#!/usr/bin/env bash
# Builds Jaeger (v2: the OpenTelemetry Collector-based all-in-one `jaeger` binary, released from the Go module
# github.com/jaegertracing/jaeger under its v1.x tags) from the Go module proxy into a cache outside the clone, keyed
# by version. The test bed runs it with in-memory storage as the tracing backend the trace tests read back
# (testbed/jaeger.py); `ksquad dev --demo --jaeger` runs it beside the demo. Rebuilds only when missing.
#
#   testbed/build-jaeger.sh            build it when missing, print the cache directory
set -euo pipefail

JAEGER_VERSION="${JAEGER_VERSION:-v1.75.0}"
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="${KSQUAD_JAEGER_BINS:-$cache_root/jaeger-${JAEGER_VERSION}}"
mkdir -p "$out"
# One builder per cache at a time (`make testbins` and a test that found the cache empty may start together).
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
log() { printf '[build-jaeger %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$out/jaeger" ]; then
  log "cached: jaeger ${JAEGER_VERSION} in $out"
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-jaeger-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
log "building jaeger ${JAEGER_VERSION} (a few minutes the first time)"
# Jaeger's go.mod has a replace directive (sarama, for its Kafka storage, unused here), so `go install module@v` refuses
# it: build it as a tool of a scratch module instead, with that replace carried over.
cd "$work"
go mod init ksquad.test/jaeger >/dev/null 2>&1
go mod edit -replace github.com/Shopify/sarama=github.com/Shopify/sarama@v1.33.0
go get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@${JAEGER_VERSION}"
if [ -n "${KSQUAD_FETCH_ONLY:-}" ]; then log "modules downloaded"; exit 0; fi
go build -ldflags "-s -w" -o "$out/jaeger.tmp" github.com/jaegertracing/jaeger/cmd/jaeger
mv "$out/jaeger.tmp" "$out/jaeger"
log "jaeger ${JAEGER_VERSION} ready in $((SECONDS - t0)) s"
echo "$out"
