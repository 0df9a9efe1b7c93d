"""NetworkPolicy on the test node: kube-network-policies (sigs.k8s.io/kube-network-policies, built from the Go
module proxy by build-network-policies.sh), one process on the node as its DaemonSet would run one pod.

It judges the first packet of each connection from or to a pod, handed to it on an NFQUEUE, and answers accept or
drop from the NetworkPolicies it watches. It would hand them over itself with a table of nftables rules, but
their `queue` expression is missing from this machine's kernel (CONFIG_NFT_QUEUE is not set: the table is
refused with "netlink receive: no such file or directory", which its log keeps saying). The kernel has the
x_tables NFQUEUE target, so the node installs the same hand-over with iptables (QUEUE_RULES): at postrouting,
before source NAT, skipping root's own sockets and established connections, as its table does; every pod's new
connections rather than only those of pods some policy selects (it keeps that list in its table), so it also
judges, and accepts, the others'. What that covers and what it does not:
- what the node forwards: pod to pod on the bridge (with `bridge-nf-call-iptables`, bridged packets pass the
  IP hooks) and pod to the network beyond the node (testbed/outside.py: the API server, the metadata address);
- not a pod's connection to an address of the node itself (the test bed's servers: Temporal, PostgreSQL, the
  scripted model on NODE_ADDRESS), which never reaches postrouting; nor anything sent by root on the node
  (`--uid-owner 0`, so kubelet probes pass): probe from pods; nor IPv6 (the pods have none);
- containerd 1.6 has no NRI, so it learns a new pod's address from the API server: a pod's first packets,
  before that, pass unfiltered (kubernetes/kubernetes#85966).
"""

import re
import subprocess
import time
import urllib.request
from pathlib import Path

from testbed.isolate import LOOPBACK, POD_SUBNET, free_port
from testbed.plane import Plane

BUILD_SCRIPT = Path(__file__).with_name("build-network-policies.sh")
QUEUE = 100  # its default --nfqueue-id
CHAIN = "KSQUAD-NETWORK-POLICIES"
# Its nftables table's rules, for x_tables: the mangle table's postrouting runs after destination NAT (a Service's
# backend is judged) and before source NAT (the pod's own address is).
QUEUE_RULES = [
    ["-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
    ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
    ["-s", POD_SUBNET, "-j", "NFQUEUE", "--queue-num", str(QUEUE)],
    ["-d", POD_SUBNET, "-j", "NFQUEUE", "--queue-num", str(QUEUE)],
]
# Where client-go's in-cluster configuration reads its credentials (it has no kubeconfig flag): mounted in a
# mount namespace of its own, over a fresh /run (/var/run leads there), so nothing else sees them.
SERVICE_ACCOUNT_DIR = "/run/secrets/kubernetes.io/serviceaccount"
RBAC = """\
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-network-policies, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: kube-network-policies}
rules:
- {apiGroups: [""], resources: [pods, namespaces, nodes], verbs: [list, watch]}
- {apiGroups: [networking.k8s.io], resources: [networkpolicies], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-network-policies}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: kube-network-policies}
subjects: [{kind: ServiceAccount, name: kube-network-policies, namespace: kube-system}]
"""


class NetworkPolicyError(RuntimeError):
    pass


def cached_binary() -> Path:
    """kube-network-policies from the cache, built first when missing (a few minutes, once)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetworkPolicyError(
            f"building kube-network-policies failed ({BUILD_SCRIPT.name}, exit {done.returncode}):\n"
            f"{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1]) / "kube-network-policies"


def see_bridged_packets() -> None:
    """Packets between two pods on the bridge are switched, not routed: only with these set do they pass the
    IP hooks where the policies are enforced (this network namespace's setting; the host's stay as they are)."""
    for family in ("iptables", "ip6tables"):
        setting = Path(f"/proc/sys/net/bridge/bridge-nf-call-{family}")
        try:
            setting.write_text("1")
        except OSError as err:
            raise NetworkPolicyError(
                f"cannot set {setting} ({err}): NetworkPolicy between pods on one bridge needs the kernel's "
                "br_netfilter (modprobe br_netfilter on the host)"
            ) from None


class NetworkPolicies:
    def __init__(self, plane: Plane, root: Path, node_name: str) -> None:
        self.plane = plane
        self.root = root
        self.node_name = node_name
        self.metrics_port = 0

    def start(self, timeout: float = 60) -> None:
        binary = cached_binary()
        see_bridged_packets()
        self.plane.kubectl("apply", "-f", "-", input=RBAC)
        token = self.plane.kubectl(
            "create", "token", "kube-network-policies", "-n", "kube-system", "--duration=48h"
        ).stdout.strip()
        credentials = self.root / "serviceaccount"
        credentials.mkdir(parents=True, exist_ok=True)
        (credentials / "token").write_text(token)
        (credentials / "ca.crt").write_bytes(self.plane.pki.ca.read_bytes())
        self.metrics_port = free_port(LOOPBACK)
        self.plane.spawn(
            "kube-network-policies",
            [
                "env",
                f"KUBERNETES_SERVICE_HOST={self.plane.apiserver_address}",
                f"KUBERNETES_SERVICE_PORT={self.plane.apiserver_port}",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount -t tmpfs -o mode=755 tmpfs /run && mkdir -p {SERVICE_ACCOUNT_DIR} && cp "$0"/* '
                f'{SERVICE_ACCOUNT_DIR}/ && exec "$@"',
                str(credentials),
                str(binary),
                "--hostname-override",
                self.node_name,
                "--metrics-bind-address",
                f"{LOOPBACK}:{self.metrics_port}",
                "--disable-nri",  # containerd 1.6 has none
                "-v=2",  # each packet's verdict, in its log
            ],
        )
        # Packets queued to nobody are dropped: hand them over only once it listens.
        deadline = time.monotonic() + timeout
        while not _listening(QUEUE):
            self.plane.check_alive()
            if time.monotonic() > deadline:
                raise NetworkPolicyError(
                    f"kube-network-policies did not listen on NFQUEUE {QUEUE} in {timeout}s:\n"
                    f"{self.plane.tail('kube-network-policies')}"
                )
            time.sleep(0.2)
        remove_queue_rules()
        _iptables("-N", CHAIN)
        for rule in QUEUE_RULES:
            _iptables("-A", CHAIN, *rule)
        _iptables("-A", "POSTROUTING", "-j", CHAIN)

    def verdicts(self) -> dict[str, int]:
        """Packets judged since it started, by verdict (accept, drop), from its metrics."""
        with urllib.request.urlopen(f"http://{LOOPBACK}:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        counts: dict[str, int] = {}
        for match in re.finditer(
            r'^kube_network_policies_packet_count\{[^}]*verdict="(\w+)"[^}]*\} (\S+)$', text, re.M
        ):
            counts[match[1]] = counts.get(match[1], 0) + int(float(match[2]))
        return counts


def remove_queue_rules() -> None:
    """Without its judge, the hand-over would drop every pod's new connections: gone with it."""
    subprocess.run(["iptables", "-t", "mangle", "-D", "POSTROUTING", "-j", CHAIN], capture_output=True)
    subprocess.run(["iptables", "-t", "mangle", "-F", CHAIN], capture_output=True)
    subprocess.run(["iptables", "-t", "mangle", "-X", CHAIN], capture_output=True)


def _iptables(*args: str) -> None:
    done = subprocess.run(["iptables", "-t", "mangle", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetworkPolicyError(f"iptables -t mangle {' '.join(args)} failed: {done.stderr.strip()}")


def _listening(queue: int) -> bool:
    """Whether a process is bound to NFQUEUE `queue` in this network namespace."""
    try:
        lines = Path("/proc/net/netfilter/nfnetlink_queue").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[:1] == [str(queue)] for line in lines)
