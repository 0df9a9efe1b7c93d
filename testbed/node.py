"""The test cluster's node: a real kubelet that runs pods in containers through containerd (runc, or gVisor
for RuntimeClass `gvisor`), kube-proxy for Services and kube-network-policies for NetworkPolicy.

Everything runs inside the test session's namespaces (testbed/isolate.py): pods get addresses on the
bridge `ksq0` through the CNI bridge plugin (Debian's containernetworking-plugins), the node is NODE_ADDRESS.
The API server and etcd are off the node, in the network beyond it (testbed/outside.py).
Images come from `make images` (testbed/images.py), imported into containerd; nothing is pulled.

What is enforced as on a production node:
- RuntimeClass handler `runsc` runs pods under gVisor: Debian's `runsc` (release 20221219, the ptrace
  platform: no KVM here), one sandbox per pod. The package has no containerd shim: containerd's runc shim runs
  it through runsc-for-containerd.sh, which also lets the shim see each container of a pod end. A process in
  such a pod sees gVisor's kernel, not the host's.
- NetworkPolicy, by kube-network-policies (testbed/netpol.py) on what the node forwards: pod to pod, and pod to
  the network beyond the node (the API server, the metadata address 169.254.169.254). Its verdicts are its own;
  the hand-over of packets to it is the node's iptables rules (this kernel lacks the nftables rules' `queue`).

What differs from a production node, on purpose:
- RuntimeClass handler `kata` maps to runc: the object and its admission are real, no VM is started.
- A gVisor sandbox uses the pod's network namespace through the host kernel (`--network=host`) instead of
  gVisor's own network stack, which this runsc refuses to start on this kernel (runsc-for-containerd.sh says
  why): a sandbox's sockets are the host kernel's. Its address, and the NetworkPolicy applied to it, are as
  they would be.
- Pods reach the node's own address (NODE_ADDRESS) unfiltered, as on most production nodes; here the test
  bed's servers listen there (Temporal, PostgreSQL, the scripted model, MCP servers), so a sandbox can reach
  them, where on a production cluster they would be off the node and behind its egress policy.
- kube-network-policies learns pods' addresses from the API server (containerd 1.6 has no NRI): a new pod's
  first packets, before that, are not filtered.
- containerd runs with `restrict_oom_score_adj` (this machine refuses lowering oom_score_adj), cgroups v1
  (`failCgroupV1: false`) and no per-QoS cgroups; image garbage collection is off, as are evictions.
- No cluster DNS: pods' resolv.conf names 127.0.0.1, so a name lookup fails at once instead of hanging.
"""

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import yaml

from testbed import images
from testbed.isolate import BRIDGE, LOOPBACK, NODE_ADDRESS, POD_RANGE, POD_SUBNET, free_port, isolated
from testbed.netpol import NetworkPolicies, remove_queue_rules
from testbed.plane import Plane

log = logging.getLogger(__name__)
NODE_NAME = "ksquad-node"
# RuntimeClass handler -> the OCI runtime containerd's runc shim runs for it: gVisor for `runsc` (RuntimeClass
# gvisor), runc for the rest (`kata` too: no VMs here).
RUNTIME_HANDLERS = {"runc": "runc", "runsc": "runsc", "kata": "runc"}
CNI_PLUGINS = Path("/usr/lib/cni")
HOST_PACKAGES = "containerd runc runsc containernetworking-plugins nftables iptables podman"
# What containerd's runc shim runs for handler runsc: runsc, with what it takes to stand in for runc.
RUNSC = Path(__file__).with_name("runsc-for-containerd.sh")


class NodeError(RuntimeError):
    pass


def containerd_config(root: Path) -> str:
    binaries = {"runc": "runc", "runsc": str(RUNSC)}
    runtimes = "\n".join(
        f"""[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{handler}]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{handler}.options]
  BinaryName = "{binaries[runtime]}"
  Root = "{root}/{runtime}"
"""
        for handler, runtime in RUNTIME_HANDLERS.items()
    )
    return f"""version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{CNI_PLUGINS}"
  conf_dir = "{root}/cni"
  max_conf_num = 1
{runtimes}"""


def cni_config(root: Path) -> dict[str, object]:
    first, last = POD_RANGE
    return {
        "cniVersion": "1.0.0",
        "name": "ksquad-test",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(root / "ipam"),
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "ranges": [
                        [
                            {
                                "subnet": POD_SUBNET,
                                "rangeStart": first,
                                "rangeEnd": last,
                                "gateway": NODE_ADDRESS,
                            }
                        ]
                    ],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    plane: Plane, root: Path, serving: tuple[Path, Path], healthz_port: int
) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_ADDRESS,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(serving[0]),
        "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(plane.pki.ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{root}/containerd/containerd.sock",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "localStorageCapacityIsolation": False,
        "failSwapOn": False,
        "resolvConf": str(root / "resolv.conf"),
        "podLogsDir": str(root / "pod-logs"),
        "volumePluginDir": str(root / "volume-plugins"),
        "maxPods": 500,
        "podPidsLimit": -1,
        "serializeImagePulls": False,
        # Our images are imported, never pulled: never collect them, never evict for a full disk.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
            "imagefs.inodesFree": "1%",
        },
        # A rotated Secret reaches a mounted volume within seconds (a production kubelet: about a minute).
        "syncFrequency": "5s",
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
        "rotateCertificates": False,
        "registerNode": True,
    }


class Node:
    """containerd, the kubelet and kube-proxy of one node, started against a running control plane."""

    def __init__(self, plane: Plane) -> None:
        self.plane = plane
        self.root = plane.root / "node"
        self.containerd_root = self.root / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_root / "containerd.sock"

    def start(self, timeout: float = 90) -> None:
        if not isolated():
            raise NodeError(
                "the test cluster's node runs pods in containers on a network of its own: run the tests through "
                "`make test` / `make pytest` (as root), which starts them in their own namespaces "
                "(python -m testbed.isolate pytest ...)"
            )
        for program in ("containerd", "runc", "runsc", "ctr", "nft", "iptables"):
            if shutil.which(program) is None:
                raise NodeError(
                    f"{program} not found: `make test` installs it (apt-get install {HOST_PACKAGES})"
                )
        if not (CNI_PLUGINS / "bridge").exists():
            raise NodeError(f"no CNI plugins in {CNI_PLUGINS}: apt-get install containernetworking-plugins")
        archive, names = images.archive()
        bins = self.plane.bins
        t0 = time.monotonic()
        for sub in ("containerd/cni", "pod-logs", "volume-plugins", "kubelet", "pki"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (self.containerd_root / "config.toml").write_text(containerd_config(self.containerd_root))
        (self.containerd_root / "cni" / "10-ksquad-test.conflist").write_text(
            json.dumps(cni_config(self.root), indent=1)
        )
        self.plane.spawn("containerd", ["containerd", "--config", str(self.containerd_root / "config.toml")])
        self._wait("containerd", lambda: self.ctr("version", check=False).returncode == 0, 30)
        imported = self.ctr("images", "import", str(archive), timeout=300)
        if imported.returncode != 0:
            raise NodeError(f"importing {archive} into containerd failed: {imported.stderr}")
        for name, built in names.items():
            if name != built:
                self.ctr("images", "tag", "--force", built, name)
        t_images = time.monotonic()

        pki = self.plane.pki
        node_cert = pki.issue("node", f"system:node:{NODE_NAME}", ("system:nodes",))
        serving = pki.issue(
            "kubelet-serving", NODE_NAME, server=True, addresses=(NODE_ADDRESS,), dns_names=(NODE_NAME,)
        )
        kubeconfig = self.plane.certificate_kubeconfig("kubelet", node_cert)
        config = self.root / "kubelet.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(self.plane, self.root, (serving.cert, serving.key), free_port(LOOPBACK))
            )
        )
        self.plane.spawn(
            "kubelet",
            [
                str(bins / "kubelet"),
                "--config",
                str(config),
                "--kubeconfig",
                str(kubeconfig),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                NODE_ADDRESS,
                "--root-dir",
                str(self.root / "kubelet"),
                "--cert-dir",
                str(self.root / "pki"),
                "-v=1",
            ],
        )
        proxy_cert = pki.issue("kube-proxy", "system:kube-proxy")
        proxy_config = self.root / "kube-proxy.yaml"
        proxy_config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
                    "kind": "KubeProxyConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.plane.certificate_kubeconfig("kube-proxy", proxy_cert))
                    },
                    "mode": "nftables",
                    "clusterCIDR": POD_SUBNET,
                    "hostnameOverride": NODE_NAME,
                    "bindAddress": NODE_ADDRESS,
                    "healthzBindAddress": f"127.0.0.1:{free_port(LOOPBACK)}",
                    "metricsBindAddress": f"127.0.0.1:{free_port(LOOPBACK)}",
                    "conntrack": {"maxPerCore": 0},  # leave the namespace's conntrack table size alone
                    "nftables": {"masqueradeAll": True},  # pod -> Service -> pod on one bridge needs it
                }
            )
        )
        self.plane.spawn("kube-proxy", [str(bins / "kube-proxy"), "--config", str(proxy_config), "-v=1"])
        # In force before the first pod is scheduled: a pod's policies apply from its start.
        self.network_policies = NetworkPolicies(self.plane, self.root, NODE_NAME)
        self.network_policies.start()
        self._wait(f"node {NODE_NAME} to be Ready", self._ready, timeout)
        log.info(
            "node ready: images imported in %.1fs, kubelet ready %.1fs later",
            t_images - t0,
            time.monotonic() - t_images,
        )

    def _ready(self) -> bool:
        done = self.plane.kubectl(
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return done.stdout.strip() == "True"

    def _wait(self, what: str, probe: "object", timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.plane.check_alive()
            if probe():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise NodeError(
            f"timed out after {timeout}s waiting for {what}:\n{self.plane.tail('kubelet')}\n"
            f"{self.plane.tail('containerd')}"
        )

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0 and args[:2] != ("images", "import"):
            raise NodeError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    def stop(self) -> None:
        """Stop the kubelet first (so nothing restarts), then every container, then containerd."""
        remove_queue_rules()
        self.plane.stop_process("kube-network-policies")
        self.plane.stop_process("kube-proxy")
        self.plane.stop_process("kubelet")
        if self.containerd_socket.exists() and self.plane.running("containerd"):
            tasks = self.ctr("tasks", "list", "--quiet", check=False).stdout.split()
            for task in tasks:
                self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
            for task in tasks:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.ctr("tasks", "delete", "--force", task, check=False, timeout=10)
        self.plane.stop_process("containerd")
        # Whatever is left (a shim, a container process) dies with the session's PID namespace; its mounts go
        # with the mount namespace. Unmount the overlays now anyway so the state directory can be removed.
        with contextlib.suppress(OSError):
            for line in reversed(Path("/proc/self/mounts").read_text().splitlines()):
                target = line.split()[1]
                if target.startswith(str(self.root)):
                    subprocess.run(["umount", "-l", target], capture_output=True)
        with contextlib.suppress(ProcessLookupError):
            for shim in _shims(self.containerd_root):
                os.kill(shim, signal.SIGKILL)


def _shims(containerd_root: Path) -> list[int]:
    """containerd-shim processes of this containerd (they daemonize: not our children)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if (
                cmdline
                and cmdline[0].endswith(b"containerd-shim-runc-v2")
                and str(containerd_root).encode() in b" ".join(cmdline)
            ):
                pids.append(int(proc.name))
    return pids
