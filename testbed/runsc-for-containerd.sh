#!/bin/sh
# gVisor for containerd's runc shim: the test node's RuntimeClass handler `runsc` (testbed/node.py) names this as
# the shim's runtime binary (BinaryName). Debian's runsc package has no containerd shim of its own; the runc
# shim speaks runc's command line, which runsc takes, but for what this script bridges:
# - the flags: the ptrace platform (runsc's KVM platform hangs at boot on this machine), and the network of the
#   pod's namespace through the host kernel (--network=host: the sandbox joins the pod's network namespace, so
#   the pod's address and the node's NetworkPolicy are the same as under runc). gVisor's own network stack
#   (--network=sandbox) will not start here: this runsc takes any network namespace for the host's because
#   /proc/sys/net/core/rmem_default, its test, exists in every namespace on this kernel ("cannot run with network
#   enabled in root network namespace").
# - a pod's sandbox runs on one CPU: under ptrace every system call of the sandboxed program stops and resumes
#   it, which costs ~160 us here when the threads involved sit on different CPUs and ~45 us on one (the agent's
#   imports: ~15 s against ~7 s; ~2.5 s under runc). Pods are spread over the CPUs by their sandbox's id.
# - a pod is one gVisor sandbox, which its first (pause) container starts. For each later container:
#   - `runsc create` writes the sandbox's pid to the pid file, so the shim would see the container end only with
#     its pod, and a stopped container would hang until the kubelet gives up. The pid file gets a watcher's pid
#     instead: it waits for the container (`runsc wait`) and exits with its status. Started from here, it is the
#     shim's child once this script exits (the shim is a subreaper), which reaps it as it would runc's process.
#   - `runsc start`, not create, hands the container its standard input and output, and keeps them: what the
#     shim gave `create` (the container's log pipes), the watcher holds until then, and `start` gets them.
# - runsc's words for a container that has ended, on `kill`, are made runc's, or the shim retries forever.
set -eu
runsc="runsc --platform=ptrace --network=host"

# The shim's global flags (--root DIR, --log FILE, --log-format json, ...) come before the command.
globals="" root=""
while [ $# -gt 0 ]; do
  case "$1" in
    --systemd-cgroup|--debug) globals="$globals $1"; shift ;;
    --root=*) root=${1#*=}; globals="$globals $1"; shift ;;
    --root) root=$2; globals="$globals $1 $2"; shift 2 ;;
    --*=*) globals="$globals $1"; shift ;;
    --*) globals="$globals $1 $2"; shift 2 ;;
    *) break ;;
  esac
done
command=${1:-}
eval "id=\${$#}"  # create, start and delete name the container last
holder="$root/ksquad-$id.holder"  # a created container's watcher and CPU: "PID CPU"

case "$command" in
  create) ;;
  start)
    if [ -s "$holder" ]; then
      read -r watcher cpu <"$holder"
      exec taskset -c "$cpu" $runsc $globals "$@" \
        <"/proc/$watcher/fd/3" >"/proc/$watcher/fd/4" 2>"/proc/$watcher/fd/5"
    fi
    exec $runsc $globals "$@" ;;
  kill)
    status=0
    output=$($runsc $globals "$@" 2>&1) || status=$?
    case "$status:$output" in
      0:*) ;;
      *"sandbox is not running"*|*"no such process"*) echo "container not running ($output)" >&2 ;;
      *) echo "$output" >&2 ;;
    esac
    exit $status ;;
  delete)
    rm -f "$holder"
    exec $runsc $globals "$@" ;;
  *) exec $runsc $globals "$@" ;;
esac

bundle=. pid_file=""
for arg in "$@"; do
  case "${next:-}" in
    bundle) bundle=$arg ;;
    pid_file) pid_file=$arg ;;
  esac
  next=""
  case "$arg" in
    --bundle|-b) next=bundle ;;
    --bundle=*) bundle=${arg#*=} ;;
    --pid-file) next=pid_file ;;
    --pid-file=*) pid_file=${arg#*=} ;;
  esac
done
# containerd writes the spec compactly. Its pod's sandbox id (a pause container's is its own) picks the CPU.
spec=$(cat "$bundle/config.json")
sandbox=${spec#*\"io.kubernetes.cri.sandbox-id\":\"}
[ "$sandbox" != "$spec" ] && sandbox=${sandbox%%\"*} || sandbox=$id
cpu=$(( $(printf %s "$sandbox" | cksum | cut -d' ' -f1) % $(nproc) ))
taskset -c "$cpu" $runsc $globals "$@"

# A pod's sandbox (pause) container is "sandbox", the others "container".
case "$spec" in *'"io.kubernetes.cri.container-type":"container"'*) ;; *) exit 0 ;; esac
[ -n "$pid_file" ] || exit 0
# A background list's standard input is /dev/null: the streams go to it as 3, 4 and 5.
exec 3<&0 4>&1 5>&2
(
  exec </dev/null >/dev/null 2>&1
  # `runsc wait` refuses a container not started yet: wait for `start` (or the container's end).
  while state=$($runsc $globals state "$id"); do
    case "$state" in *'"status": "created"'*) sleep 0.05 ;; *) break ;; esac
  done
  exec 3<&- 4>&- 5>&-
  waited=$($runsc $globals wait "$id") || exit 255
  status=${waited##*\"exitStatus\":}
  exit "${status%\}}"
) &
echo "$! $cpu" >"$holder"
printf %s $! >"$pid_file"  # no newline: the shim parses the whole file as a number
