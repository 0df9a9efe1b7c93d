"""Simulated nodes beside the test cluster's real one: kwok (sigs.k8s.io/kwok, built from the Go module proxy by
build-kwok.sh), for nodes a 2-core machine cannot have, such as a GPU node of a team's own.

kwok manages only the nodes labelled `type=kwok` (the real node's kubelet keeps its own): it marks them Ready,
keeps their Lease, and plays their pods' lifecycle (Running and Ready with an address from its CIDR, no container
ever started) with kwok's own "fast" stages, which the build copies beside the binary. The real kube-scheduler
places pods onto them, so what a test sees there is the scheduling: a pod on a simulated node was put there by
its node selector, tolerations and resources, and by nothing else. A simulated node is always tainted (the test's
taints, else KWOK_TAINT), so no pod of another test lands there by accident.
"""

import json
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from testbed.controlplane import ControlPlane

BUILD_SCRIPT = Path(__file__).with_name("build-kwok.sh")
LABEL = "type"
KWOK = "kwok"
KWOK_TAINT = {"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}
USER = "kwok"  # its client certificate's name
POD_CIDR = "10.250.0.0/24"  # addresses kwok gives its pods: reachable by nobody, used by no real pod


class KwokError(RuntimeError):
    pass


def cached_kwok() -> tuple[Path, Path]:
    """kwok and its stages from the cache, built first when missing (a few minutes, once)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise KwokError(
            f"building kwok failed ({BUILD_SCRIPT.name}, exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    folder = Path(done.stdout.strip().splitlines()[-1])
    return folder / "kwok", folder / "stages.yaml"


class SimulatedNodes:
    def __init__(self, plane: "ControlPlane") -> None:
        self.plane = plane

    def start(self) -> None:
        """kwok, once per cluster (a second call finds it running)."""
        if self.plane.running(KWOK):
            return
        binary, stages = cached_kwok()
        # A client certificate of its own (the simulated kubelets' writes, told apart in the audit log).
        kubeconfig = self.plane.certificate_kubeconfig(
            KWOK, self.plane.pki.issue(KWOK, USER, ("system:masters",))
        )
        self.plane.spawn(
            KWOK,
            [
                str(binary),
                "--kubeconfig",
                str(kubeconfig),
                "--config",
                str(stages),
                "--manage-nodes-with-label-selector",
                f"{LABEL}={KWOK}",
                "--cidr",
                POD_CIDR,
                "--node-port=0",  # no kubelet API of its own: nothing here asks a simulated node for logs or exec
                # Its nodes' liveness is their Lease, as a kubelet's (kwok's stages write their status every 10-20
                # minutes only). Without one kwok renews none, and 50 s after its start the node lifecycle
                # controller marks every simulated node NotReady and their pods not Ready.
                "--node-lease-duration-seconds=40",
            ],
        )

    def add(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        taints: list[dict[str, str]] | None = None,
        capacity: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> None:
        """A simulated node, Ready within `timeout` (kwok's node-initialize stage)."""
        allocatable = {"cpu": "32", "memory": "256Gi", "pods": "110", **(capacity or {})}
        node: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    LABEL: KWOK,
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    **(labels or {}),
                },
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            },
            "spec": {"taints": taints or [KWOK_TAINT]},
            "status": {"allocatable": allocatable, "capacity": allocatable},
        }
        self.plane.kubectl("apply", "-f", "-", input=json.dumps(node))
        deadline = time.monotonic() + timeout
        while True:
            self.plane.check_alive()
            done = self.plane.kubectl(
                "get",
                "node",
                name,
                "-o",
                'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
                check=False,
            )
            if done.stdout.strip() == "True":
                return
            if time.monotonic() > deadline:
                raise KwokError(f"simulated node {name} not Ready after {timeout}s:\n{self.plane.tail(KWOK)}")
            time.sleep(0.3)

    def remove(self, name: str) -> None:
        self.plane.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")
