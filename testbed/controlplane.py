"""A real Kubernetes cluster for the tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and
a node (testbed/node.py: kubelet, containerd, kube-proxy) that runs pods in containers.

The binaries come from `build-control-plane.sh` (built once from the Go module proxy, cached outside the
clone). Authorization is Node and RBAC; the admin authenticates with a client certificate in
`system:masters`, every component with its own certificate (the controller manager then with per-controller
service-account credentials), as in a real cluster. It runs inside the test session's namespaces
(testbed/isolate.py), etcd and the API server off the node, in the network beyond it (testbed/outside.py):
pods reach the API server through the `kubernetes` Service, routed by the node, where NetworkPolicy applies.
"""

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dev.binaries import dying_with_parent, find_binary
from testbed import outside
from testbed.isolate import LOOPBACK, free_port, isolated
from testbed.node import Node
from testbed.pki import KeyPair, Pki

log = logging.getLogger(__name__)

BUILD_SCRIPT = Path(__file__).with_name("build-control-plane.sh")
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
# Controllers the tests rely on: Jobs, ReplicaSets and Deployments, owner-reference garbage collection,
# namespaces and their default ServiceAccounts, TTL after finish, aggregated ClusterRoles, node lifecycle (the
# not-ready taint), EndpointSlices of Services, PodDisruptionBudgets.
CONTROLLERS = ",".join(
    [
        "job-controller",
        "replicaset-controller",
        "deployment-controller",
        "garbage-collector-controller",
        "namespace-controller",
        "serviceaccount-controller",
        "serviceaccount-token-controller",
        "ttl-after-finished-controller",
        "clusterrole-aggregation-controller",
        "root-ca-certificate-publisher-controller",
        "node-lifecycle-controller",
        "endpointslice-controller",
        "disruption-controller",
    ]
)


class ControlPlaneError(RuntimeError):
    pass


def cached_binaries_dir() -> Path:
    """The cached binaries' directory, building what is missing (minutes the first time, instant after)."""
    override = os.environ.get("KSQUAD_TESTBINS")
    if override and all(
        (Path(override) / b).exists() for b in ("etcd", "kube-apiserver", "kube-controller-manager")
    ):
        return Path(override)
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ControlPlaneError(
            f"building the test control plane failed ({BUILD_SCRIPT.name}, exit {done.returncode}):\n"
            f"{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


def write_kubeconfig(
    path: Path, server: str, ca: Path, user: dict[str, Any], namespace: str = "default"
) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "ksquad-test", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [
            {
                "name": "ksquad-test",
                "context": {"cluster": "ksquad-test", "user": "user", "namespace": namespace},
            }
        ],
        "current-context": "ksquad-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _client_cert_user(pair: KeyPair) -> dict[str, str]:
    return {"client-certificate": str(pair.cert), "client-key": str(pair.key)}


# The apiserver logs what is written to it (never a Secret's body): tests.support.secret_scan reads it after the
# suite. Who read Secrets and Runs is logged too, without bodies: tests that a request made no read as a person
# count those lines, and need reads to be logged for the count to mean anything.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [get, list, watch]
  resources: [{group: "", resources: [secrets]}, {group: ksquad.io, resources: [runs]}]
- level: None
  resources: [{group: "", resources: [secrets]}]
- level: Request
  verbs: [create, update, patch]
  resources:
  - {group: "", resources: [pods, pods/status, configmaps, events]}
  - {group: batch, resources: [jobs]}
  - {group: networking.k8s.io, resources: [networkpolicies]}
  - {group: ksquad.io}
- level: Metadata
  verbs: [create, update, patch]
  resources: [{group: coordination.k8s.io, resources: [leases]}]
- level: None
"""


def audit_events_at(path: Path) -> list[dict[str, Any]]:
    """The events of the audit log at `path`, in order: the files the API server rotated it into
    (`audit-<time>.log` beside it, once it outgrows its size) first, then the log itself."""
    logs = [*sorted(path.parent.glob(f"{path.stem}-*{path.suffix}")), path]
    return [
        json.loads(line)
        for log in logs
        if log.is_file()
        for line in log.read_text().splitlines()
        if line.strip()
    ]


ROOT_PREFIX = "ksquad-k8s-"
LOCK = ".in-use"  # flock'ed by the session that runs the cluster: the kernel lets go when it dies


def hold_lock(root: Path) -> int:
    fd = os.open(root / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def sweep_abandoned(directory: Path | None = None) -> None:
    """Remove what earlier sessions that were killed left on disk (containerd's unpacked images among it: hundreds
    of megabytes each). Their processes and mounts died with their namespaces (testbed/isolate.py); a
    directory whose lock nobody holds is abandoned. Kept ones (KSQUAD_KEEP_CLUSTER) stay."""
    for root in (directory or Path(tempfile.gettempdir())).glob(f"{ROOT_PREFIX}*"):
        lock = root / LOCK
        if not lock.exists() or (root / "keep").exists():
            continue
        try:
            fd = os.open(lock, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live session's
        finally:
            os.close(fd)
        log.info("removing %s, left by a test session that was killed", root)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class ControlPlane:
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix=ROOT_PREFIX)))
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, tuple[list[str], Path | None]] = field(default_factory=dict)
    apiserver_port: int = 0
    etcd_port: int = 0
    # The client rate of each controller and of the scheduler (requests/s; None: their defaults, 20 and 50). The
    # claim benchmark refills warm pools at 45-75 pods/s, past what a ReplicaSet controller at 20/s can make: it
    # raises both, as a large cluster's operators do.
    controller_api_qps: int | None = None
    # Every write to the API server in the audit log too (its verb, resource and user, no body): the claim benchmark
    # counts the writes a claim costs the cluster, whoever makes them.
    audit_every_write: bool = False

    @property
    def apiserver_address(self) -> str:
        """Off the node inside the test bed's namespaces (testbed/outside.py); loopback outside them."""
        return outside.CONTROL_ADDRESS if isolated() else LOOPBACK

    @property
    def server(self) -> str:
        return f"https://{self.apiserver_address}:{self.apiserver_port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """What was written to the apiserver (AUDIT_POLICY: Jobs, Pods, ConfigMaps... never Secrets)."""
        return self.root / "audit.log"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every event of the audit log, the files the API server rotated it into first (audit_events_at)."""
        return audit_events_at(self.audit_log)

    def _audit_policy(self) -> Path:
        policy = self.root / "audit-policy.yaml"
        every_write = "- level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n"
        text = AUDIT_POLICY
        if self.audit_every_write:
            text = text.removesuffix("- level: None\n") + every_write + "- level: None\n"
        policy.write_text(text)
        return policy

    def log_file(self, component: str) -> Path:
        return self.root / f"{component}.log"

    def start(self) -> None:
        sweep_abandoned()
        self._lock = hold_lock(self.root)
        bins = self.bins = cached_binaries_dir()
        t0 = time.monotonic()
        self.pki = Pki(self.root / "pki")
        # Inside the test bed's namespaces etcd and the API server run beyond the node, where the API server
        # serves its address (the `kubernetes` Service's endpoint) and etcd only its own loopback.
        if isolated():
            outside.create()
        bind = "0.0.0.0" if isolated() else "127.0.0.1"
        advertise = self.apiserver_address
        serving = self.pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            addresses=("10.0.0.1", advertise),
            dns_names=(
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
        )
        admin = self.admin = self.pki.issue("admin", "ksquad-test-admin", ("system:masters",))
        kcm = self.pki.issue("controller-manager", "system:kube-controller-manager")
        to_kubelet = self.pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        self.etcd_port, peer_port = free_port(LOOPBACK), free_port(LOOPBACK)
        self.apiserver_port = free_port(LOOPBACK)

        etcd_url = f"http://127.0.0.1:{self.etcd_port}"
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--data-dir",
                str(self.root / "etcd"),
                "--name",
                "default",
                "--listen-client-urls",
                etcd_url,
                "--advertise-client-urls",
                etcd_url,
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer_port}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes",
                str(4 << 30),
                "--log-level",
                "warn",
            ],
            off_node=True,
        )
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                "--etcd-servers",
                etcd_url,
                "--bind-address",
                bind,
                "--advertise-address",
                advertise,
                "--secure-port",
                str(self.apiserver_port),
                "--tls-cert-file",
                str(serving.cert),
                "--tls-private-key-file",
                str(serving.key),
                "--client-ca-file",
                str(self.pki.ca),
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--service-account-key-file",
                str(self.pki.service_account_pub),
                "--service-account-signing-key-file",
                str(self.pki.service_account_key),
                "--service-cluster-ip-range",
                SERVICE_CLUSTER_IP_RANGE,
                "--authorization-mode",
                "Node,RBAC",
                "--enable-admission-plugins",
                "NodeRestriction",
                "--kubelet-client-certificate",
                str(to_kubelet.cert),
                "--kubelet-client-key",
                str(to_kubelet.key),
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--allow-privileged=true",
                "--cert-dir",
                str(self.root / "apiserver-certs"),
                "--profiling=false",
                "-v=1",
                "--audit-policy-file",
                str(self._audit_policy()),
                "--audit-log-path",
                str(self.audit_log),
                "--audit-log-format",
                "json",
            ],
            off_node=True,
        )
        write_kubeconfig(self.admin_kubeconfig, self.server, self.pki.ca, _client_cert_user(admin))
        self._wait_ready("kube-apiserver", f"{self.server}/readyz", admin, timeout=90)

        kcm_kubeconfig = self.certificate_kubeconfig("controller-manager", kcm)
        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                "--kubeconfig",
                str(kcm_kubeconfig),
                "--authentication-kubeconfig",
                str(kcm_kubeconfig),
                "--authorization-kubeconfig",
                str(kcm_kubeconfig),
                "--authentication-skip-lookup",
                "--controllers",
                CONTROLLERS,
                "--use-service-account-credentials=true",
                "--service-account-private-key-file",
                str(self.pki.service_account_key),
                "--root-ca-file",
                str(self.pki.ca),
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port(LOOPBACK)),
                "--concurrent-job-syncs",
                "10",
                "--concurrent-replicaset-syncs",
                "10",
                "--concurrent-gc-syncs",
                "10",
                *self._client_rate(),
                "--profiling=false",
                "-v=1",
            ],
        )
        scheduler = self.certificate_kubeconfig(
            "scheduler", self.pki.issue("scheduler", "system:kube-scheduler")
        )
        self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                "--kubeconfig",
                str(scheduler),
                "--authentication-kubeconfig",
                str(scheduler),
                "--authorization-kubeconfig",
                str(scheduler),
                "--authentication-skip-lookup",
                "--leader-elect=false",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                str(free_port(LOOPBACK)),
                *self._client_rate(),
                "--profiling=false",
                "-v=1",
            ],
        )
        self.wait_for_default_service_account("default", timeout=60)
        log.info("control plane ready on %s in %.1fs", self.server, time.monotonic() - t0)

    def start_node(self) -> None:
        """The node: containerd, the kubelet and kube-proxy (testbed/node.py); until it is Ready."""
        self.node = Node(self)
        self.node.start()

    def add_runtime_classes(self) -> None:
        """The RuntimeClasses Runs ask for (`sandboxPolicy.runtimeClass`): gvisor, whose handler runsc the node
        runs under gVisor, and kata, which it maps to runc (testbed/node.py)."""
        for name, handler in (("gvisor", "runsc"), ("kata", "kata")):
            self.kubectl(
                "apply",
                "-f",
                "-",
                input=f"apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: {name}}}\nhandler: {handler}\n",
            )

    def certificate_kubeconfig(self, name: str, pair: KeyPair) -> Path:
        return write_kubeconfig(
            self.root / f"{name}.kubeconfig", self.server, self.pki.ca, _client_cert_user(pair)
        )

    def stop_apiserver(self) -> None:
        """Take kube-apiserver away (SIGKILL: a graceful stop waits a minute for watches to drain): from now on
        everything talking to it is refused."""
        proc = self.processes["kube-apiserver"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    def start_apiserver(self, timeout: float = 90) -> None:
        """Bring it back with the same flags, certificates and etcd: the same cluster, as after a restart."""
        cmd, cwd = self.commands["kube-apiserver"]
        self._spawn("kube-apiserver", cmd, cwd)
        self._wait_ready("kube-apiserver", f"{self.server}/readyz", self.admin, timeout=timeout)

    def wait_for_resource(self, resource: str, timeout: float = 60) -> None:
        """Until `kubectl get <resource>` works: a CRD (re)established is served a moment after it says so."""
        deadline = time.monotonic() + timeout
        while True:
            done = self.kubectl("get", resource, "--all-namespaces", "-o", "name", check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{resource} not served after {timeout}s: {done.stderr.strip()}")
            time.sleep(0.2)

    def _client_rate(self) -> list[str]:
        qps = self.controller_api_qps
        return [] if qps is None else ["--kube-api-qps", str(qps), "--kube-api-burst", str(2 * qps)]

    def spawn(self, name: str, cmd: list[str], cwd: Path | None = None) -> None:
        """Start a component of the cluster, logging to `log_file(name)`; it dies with this process."""
        self._spawn(name, cmd, cwd)

    def running(self, name: str) -> bool:
        proc = self.processes.get(name)
        return proc is not None and proc.poll() is None

    def check_alive(self) -> None:
        self._check_alive()

    def _spawn(self, name: str, cmd: list[str], cwd: Path | None = None, off_node: bool = False) -> None:
        if off_node and isolated():
            cmd = outside.enter(cmd)
        self.commands[name] = (cmd, cwd)
        out = self.log_file(name).open("ab")
        self.processes[name] = subprocess.Popen(
            dying_with_parent(cmd),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            # A node's usual umask, whatever this process's: an embedded stack sets 077 (dev.stack.private_state),
            # and a containerd started under it made files the pods' non-root users cannot read (StartError).
            umask=0o022,
        )

    def _check_alive(self) -> None:
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def tail(self, component: str, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_file(component).read_text(errors="replace")[-chars:]
        return ""

    def _wait_ready(self, name: str, url: str, client: KeyPair, timeout: float) -> None:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(client.cert), str(client.key))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(url, context=context, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.2)
        raise ControlPlaneError(f"{name} not ready after {timeout}s ({last}):\n{self.tail(name)}")

    def wait_for_default_service_account(self, namespace: str, timeout: float = 90) -> None:
        """The controller manager makes each namespace's `default` ServiceAccount, which pods need. Right after
        an apiserver restart (the outage test) its informers were refused by RBAC not yet loaded and back off:
        30 s was once too short for the next namespace."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            done = self.kubectl("get", "serviceaccount", "default", "-n", namespace, check=False)
            if done.returncode == 0:
                return
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-controller-manager made no default ServiceAccount in {namespace} in {timeout}s:\n"
            f"{self.tail('kube-controller-manager')}"
        )

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(find_binary("kubectl")), "--kubeconfig", str(kubeconfig or self.admin_kubeconfig), *args]
        done = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and done.returncode != 0:
            raise ControlPlaneError(
                f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}"
            )
        return done

    def token_kubeconfig(self, name: str, token: str, namespace: str = "default") -> Path:
        """A kubeconfig that authenticates with a bearer token (a service account's, say)."""
        return write_kubeconfig(
            self.root / f"{name}.kubeconfig", self.server, self.pki.ca, {"token": token}, namespace
        )

    def stop_process(self, name: str) -> None:
        proc = self.processes.get(name)
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        node = getattr(self, "node", None)
        if node is not None:
            node.stop()
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self.stop_process(name)
        if isolated():
            outside.delete()
        if os.environ.get("KSQUAD_KEEP_CLUSTER"):  # set it to keep logs and state for a post-mortem
            (self.root / "keep").touch()
        else:
            shutil.rmtree(self.root, ignore_errors=True)


# A cluster to poke at by hand: python -m testbed.isolate python -m testbed.controlplane
if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})  # delivered to sigwait below
    plane = ControlPlane()
    plane.start()
    plane.start_node()
    print(f"export KUBECONFIG={plane.admin_kubeconfig}", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        plane.stop()
        sys.exit(0)
