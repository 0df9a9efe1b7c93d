"""Run a command (the test session) in network, PID and mount namespaces of its own.

    python -m testbed.isolate pytest ...        # what `make pytest` does

Why: the test cluster's pods get addresses on a bridge, and its servers (Temporal, PostgreSQL, the scripted
model) must be reachable from those pods. Inside a network namespace the test bed created, the bridge, the
pods and every server it starts are all there is: no address outside it is ever a target, and no port
collides with anything else on the machine. In the PID namespace this process is PID 1: when the session ends,
however it ends (SIGKILL, a CI timeout), the kernel kills everything left in it, pods' containers and
containerd's shims included, and the mount namespace takes their mounts with it. Nothing outlives the run.

The namespace has loopback and the bridge `ksq0` with the node's address NODE_ADDRESS/16, where the
servers of the test bed listen; pods get addresses from POD_RANGE. No route leads out.

Needs root (as the cluster's kubelet and containerd do). Run as another user, the command runs as is and
the tests that need the cluster fail with the reason.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

BRIDGE = "ksq0"
NODE_ADDRESS = "10.244.0.1"  # the node (kubelet, apiserver, the test bed's servers), on the bridge
POD_SUBNET = "10.244.0.0/16"
POD_RANGE = ("10.244.1.1", "10.244.255.254")
MARKER = "KSQUAD_TESTBED_ISOLATED"  # set inside: the session runs in the namespaces
LOOPBACK = "127.0.0.1"


def isolated() -> bool:
    return os.environ.get(MARKER) == "1"


def service_address() -> str:
    """Where the test bed's own servers (Temporal, PostgreSQL, the scripted model, MCP servers) listen: the
    node's address inside the namespaces, so pods reach them too; loopback outside."""
    return NODE_ADDRESS if isolated() else LOOPBACK


def free_port(host: str | None = None) -> int:
    """A port free now on `host` (default: the service address), for a server the test bed starts next."""
    with socket.socket() as s:
        s.bind((host or service_address(), 0))
        port: int = s.getsockname()[1]
        return port


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True)


def _setup() -> None:
    """Inside the new namespaces, before the command starts: the network and the mounts it needs."""
    _run("ip", "link", "set", "lo", "up")
    # Interfaces made from here on (the bridge, a veth per pod) get no IPv6 link-local address: Chromium aborts
    # every request in flight (net::ERR_NETWORK_CHANGED) when an address of its namespace comes or goes, and the
    # UI tests running beside the cluster's failed so as pods started (lo, made with the namespace, keeps ::1).
    ipv6_default = Path("/proc/sys/net/ipv6/conf/default/disable_ipv6")
    if ipv6_default.exists():
        ipv6_default.write_text("1")
    _run("ip", "link", "add", BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{NODE_ADDRESS}/16", "dev", BRIDGE)
    _run("ip", "link", "set", BRIDGE, "up")
    # /sys still shows the machine's network devices: mount this namespace's sysfs, keeping the cgroup
    # hierarchies mounted under it (containerd and the kubelet need both).
    keep = tempfile.mkdtemp(prefix="ksquad-cgroup-")
    _run("mount", "--rbind", "/sys/fs/cgroup", keep)
    _run("mount", "-t", "sysfs", "sysfs", "/sys")
    _run("mount", "--move", keep, "/sys/fs/cgroup")
    os.rmdir(keep)
    # Pods' network namespaces are files under /run/netns: this run's own, gone with it.
    Path("/run/netns").mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/run/netns")
    # A forwarding namespace: the node routes between pods on the bridge and itself (and nowhere else).
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")


def _pid1(command: list[str]) -> int:
    """PID 1 of the namespace: start the command, reap every orphan, pass signals on, exit with its code."""
    child = subprocess.Popen(command)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child.pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--inside":
        _setup()
        os.environ[MARKER] = "1"
        return _pid1(argv[1:])
    if not argv:
        sys.exit("usage: python -m testbed.isolate COMMAND [ARG...]")
    if isolated() or os.geteuid() != 0:
        if os.geteuid() != 0:
            print(
                "testbed.isolate: not root: running without the test bed's namespaces "
                "(the tests that need the cluster will fail and say why)",
                file=sys.stderr,
            )
        os.execvp(argv[0], argv)
    unshare = ["unshare", "--net", "--pid", "--mount", "--fork", "--mount-proc", "--propagation", "private"]
    os.execvp(unshare[0], [*unshare, sys.executable, "-m", "testbed.isolate", "--inside", *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
