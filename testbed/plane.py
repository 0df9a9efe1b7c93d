"""What the node and its network policies need of the control plane they run against (testbed.controlplane's
ControlPlane is one): its processes, its PKI, kubectl as its admin. A protocol, so that the dependency goes one
way: controlplane -> node -> netpol -> plane."""

import subprocess
from pathlib import Path
from typing import Protocol

from testbed.pki import KeyPair, Pki


class Plane(Protocol):
    root: Path
    bins: Path
    pki: Pki
    apiserver_port: int

    @property
    def apiserver_address(self) -> str: ...

    def spawn(self, name: str, cmd: list[str], cwd: Path | None = None) -> None: ...

    def running(self, name: str) -> bool: ...

    def stop_process(self, name: str) -> None: ...

    def check_alive(self) -> None: ...

    def tail(self, component: str, chars: int = 3000) -> str: ...

    def certificate_kubeconfig(self, name: str, pair: KeyPair) -> Path: ...

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]: ...
