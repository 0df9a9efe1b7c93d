#!/usr/bin/env bash
# Builds the test cluster (kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, etcd)
# and helm from the Go module proxy into a cache outside the clone, keyed by versions. Rebuilds only what is
# missing.
#
#   testbed/build-control-plane.sh            build what is missing, print the cache directory
#   KSQUAD_TESTBINS=/path testbed/build-control-plane.sh
#
# Why the wrapper modules: k8s.io/kubernetes requires every staging module (k8s.io/api, ...) at v0.0.0
# and replaces them with ./staging paths, which `go install` refuses. A small main module that requires
# k8s.io/kubernetes and replaces each staging module with its published v0.<minor>.<patch> builds the
# same code. etcd's server module has replace directives too, so it gets the same treatment.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
GO_VERSION="$(go env GOVERSION)"
# The node's parts too: a real kubelet (pods in containers through containerd), the scheduler, kube-proxy.
KUBERNETES_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_helm-${HELM_VERSION}"
cache_root="${KSQUAD_TESTBINS_ROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/ksquad-testbins}"
out="${KSQUAD_TESTBINS:-$cache_root/$key}"
mkdir -p "$out"
# One builder per cache at a time (`make testbins` and a test that found the cache empty may start together): the
# second waits here, then finds built what the first built.
exec {build_lock}>"$out/.build.lock"
flock "$build_lock"

export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -trimpath" GOTOOLCHAIN=local
# Two cores: one package at a time keeps peak memory low without costing much wall time.
export GOMAXPROCS="${GOMAXPROCS:-2}"

log() { printf '[build-control-plane %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
step() {  # step NAME COMMAND...: run a step, print how long it took
  local name=$1; shift
  local t0=$SECONDS
  log "start: $name"
  "$@"
  log "done:  $name ($((SECONDS - t0)) s)"
}

work="$(mktemp -d "${TMPDIR:-/tmp}/ksquad-cp-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT

build_kubernetes() {
  local minor_patch="${K8S_VERSION#v1.}"   # 36.3
  local staging_version="v0.${minor_patch}"
  local modfile
  modfile="$(go mod download -json "k8s.io/kubernetes@${K8S_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  {
    echo "module ksquad.local/testbins/kubernetes"
    echo
    grep -E '^go [0-9]' "$modfile"
    grep -E '^godebug ' "$modfile" || true
    echo
    echo "require k8s.io/kubernetes ${K8S_VERSION}"
    echo
    echo "replace ("
    # every staging module: the targets of the ./staging/src replace directives
    sed -nE 's#^\s*(k8s\.io/[^ ]+) => \./staging/src/.*#\1#p' "$modfile" | while read -r m; do
      echo "	$m => $m ${staging_version}"
    done
    echo ")"
  } > go.mod
  log "wrapper go.mod replaces $(grep -c '=>' go.mod) staging modules with ${staging_version}"
  local cmd
  for cmd in "${KUBERNETES_COMMANDS[@]}"; do go get "k8s.io/kubernetes/cmd/$cmd@${K8S_VERSION}" >&2; done
  local pkg=k8s.io/component-base/version
  local ldflags="-s -w -X ${pkg}.gitVersion=${K8S_VERSION} -X ${pkg}.gitMajor=1 -X ${pkg}.gitMinor=${minor_patch%%.*} -X ${pkg}.gitTreeState=clean -X ${pkg}.buildDate=1970-01-01T00:00:00Z"
  ldflags="$ldflags -X k8s.io/client-go/pkg/version.gitVersion=${K8S_VERSION}"
  for cmd in "${KUBERNETES_COMMANDS[@]}"; do
    [ -x "$out/$cmd" ] && continue
    step "go build $cmd" go build -ldflags "$ldflags" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd"
    mv "$out/$cmd.tmp" "$out/$cmd"
  done
}

fetch_etcd() {
  mkdir -p "$work/etcd" && cd "$work/etcd"
  printf 'module ksquad.local/testbins/etcd\n\ngo 1.24\n' > go.mod
  go get "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" >&2
}

build_etcd() {
  cd "$work/etcd"
  go build -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$out/etcd.tmp" "$out/etcd"
}

fetch_helm() {
  mkdir -p "$work/helm" && cd "$work/helm"
  printf 'module ksquad.local/testbins/helm\n\ngo 1.24\n' > go.mod
  go get "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}" >&2
}

build_helm() {
  cd "$work/helm"
  go build -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" -o "$out/helm.tmp" helm.sh/helm/v3/cmd/helm
  mv "$out/helm.tmp" "$out/helm"
}

total0=$SECONDS
log "cache: $out (go ${GO_VERSION})"
missing=0
for cmd in "${KUBERNETES_COMMANDS[@]}"; do [ -x "$out/$cmd" ] || missing=1; done
# etcd's and helm's modules download while Kubernetes compiles (the network beside both cores).
fetches=()
if [ ! -x "$out/etcd" ]; then fetch_etcd & fetches+=($!); fi
if [ ! -x "$out/helm" ]; then fetch_helm & fetches+=($!); fi
if [ "$missing" = 0 ]; then log "cached: kubernetes ${K8S_VERSION}"
else step "kubernetes ${K8S_VERSION}" build_kubernetes; fi
for pid in "${fetches[@]}"; do wait "$pid" || { log "downloading etcd's or helm's modules failed"; exit 1; }; done
if [ -x "$out/etcd" ]; then log "cached: etcd ${ETCD_VERSION}"; else step "etcd ${ETCD_VERSION}" build_etcd; fi
if [ -x "$out/helm" ]; then log "cached: helm ${HELM_VERSION}"; else step "helm ${HELM_VERSION}" build_helm; fi
log "all binaries ready in $((SECONDS - total0)) s"
echo "$out"
