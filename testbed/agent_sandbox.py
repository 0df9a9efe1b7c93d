"""kubernetes-sigs/agent-sandbox on the test cluster: its four CRDs (agents.x-k8s.io `Sandbox`;
extensions.agents.x-k8s.io `SandboxTemplate`, `SandboxWarmPool`, `SandboxClaim`) and its controller with the
extensions on, built from the Go module proxy by build-agent-sandbox.sh (v1.0.1, the newest the proxy serves) and
run as a process of the cluster with the admin's kubeconfig, as a platform team runs it in its own namespace.

The controller needs no webhook, cert-manager or cluster DNS: it makes one pod per Sandbox (named as the Sandbox,
owned by it), claims adopt a warm pool's Sandboxes by an ownership patch, and deletes cascade through the garbage
collector of kube-controller-manager (/work/shared/notes/agent-sandbox.md)."""

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from testbed.isolate import free_port

if TYPE_CHECKING:
    from testbed.controlplane import ControlPlane

BUILD_SCRIPT = Path(__file__).with_name("build-agent-sandbox.sh")
VERSION = "v1.0.1"
CONTROLLER = "agent-sandbox"
USER = "agent-sandbox-controller"  # its client certificate's name: the writes the audit log shows as its own
CRDS = (
    "sandboxes.agents.x-k8s.io",
    "sandboxtemplates.extensions.agents.x-k8s.io",
    "sandboxwarmpools.extensions.agents.x-k8s.io",
    "sandboxclaims.extensions.agents.x-k8s.io",
)


class AgentSandboxError(RuntimeError):
    pass


def cached_agent_sandbox() -> tuple[Path, Path]:
    """The controller and its CRDs from the cache, built first when missing (a few minutes, once)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, env=None, check=False)
    if done.returncode != 0:
        raise AgentSandboxError(
            f"building agent-sandbox failed ({BUILD_SCRIPT.name}, exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    folder = Path(done.stdout.strip().splitlines()[-1])
    return folder / "agent-sandbox-controller", folder / "crds.yaml"


def wait_established(plane: "ControlPlane", crd: str, timeout: float = 60) -> None:
    """`kubectl wait --for=condition=Established` fails outright on a CRD whose status has no conditions yet
    (".status.conditions accessor error: <nil>"), as one just applied can have: poll the condition instead."""
    deadline = time.monotonic() + timeout
    status = ""
    while time.monotonic() < deadline:
        status = plane.kubectl(
            "get", f"crd/{crd}", "-o", 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
        ).stdout.strip()
        if status == "True":
            return
        time.sleep(0.2)
    raise AgentSandboxError(f"CRD {crd} not Established after {timeout}s (status {status!r})")


def start(plane: "ControlPlane") -> None:
    """The CRDs and the controller, once per cluster (a second call finds it running)."""
    if plane.running(CONTROLLER):
        return
    binary, crds = cached_agent_sandbox()
    plane.kubectl("apply", "--server-side", "-f", str(crds))
    for crd in CRDS:
        wait_established(plane, crd)
    # A client certificate of its own (in system:masters, as its upstream ClusterRoles would be bound for it), so
    # that the audit log tells its writes from anyone else's.
    kubeconfig = plane.certificate_kubeconfig(
        CONTROLLER, plane.pki.issue(CONTROLLER, USER, ("system:masters",))
    )
    plane.spawn(
        CONTROLLER,
        [
            str(binary),
            "--kubeconfig",
            str(kubeconfig),
            "--extensions",
            "--leader-elect=false",  # one replica, out of the cluster: no Lease namespace to find
            f"--metrics-bind-address=127.0.0.1:{free_port('127.0.0.1')}",
            f"--health-probe-bind-address=127.0.0.1:{free_port('127.0.0.1')}",
            # as its kwok scalability presubmit runs it: the client's own rate limit is not what is measured
            "--kube-api-qps=1000",
            "--kube-api-burst=2000",
        ],
    )
