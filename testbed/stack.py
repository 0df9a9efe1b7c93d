"""ksquad as the chart deploys it, on the real control plane: the bridge and the worker as their own processes,
authenticated as the chart's ServiceAccounts with the RBAC `helm template` renders, against Temporal's dev
server, a SQLite store, cold sandboxes in containers of the reference agent's image, and the scripted model.
Used by the bridge tests and the benchmarks; tests/chart/ installs the chart itself, from its images."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from temporalio.client import Client

from dev.binaries import dying_with_parent
from dev.devserver import DevServer
from kube import Kube, path
from store import Store
from temporal_client.codec import ensure_key_file
from temporal_client.connection import connect
from testbed import chart
from testbed.agents import MODEL_KEY, ModelEndpoint
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE
from testbed.isolate import free_port

ROOT = Path(__file__).parents[1]
STACK_KINDS = {
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
RUN_API = "ksquad.io/v1alpha1"
# The Runs' runtimeClass gvisor served by the kata RuntimeClass (runc on the test node), as an operator may map it
# with the chart value sandbox.runtimeClasses: the lifecycle tests on a stack are about the orchestrator, and a cold
# sandbox under gVisor's ptrace platform costs about five times the CPU of one under runc. What gVisor must hold is
# tried where it is the point: tests/chart/test_isolation.py and test_install.py (the chart's own worker),
# tests/crd_bridge/test_sandbox_death.py (`start_stack(gvisor=True)`), tests/testbed/test_gvisor.py.
RUNC_FOR_GVISOR: dict[str, str | None] = {"gvisor": "kata", "kata": "kata", "runc": None}


PORT_TRIES = 3


class PortTaken(RuntimeError):
    """A component exited at start because its port was taken by another process."""


@dataclass
class Stack:
    cluster: ControlPlane
    namespace: str
    temporal: Client
    kube: Kube  # as the admin, for the test's own checks
    task_queue: str
    root: Path
    dev_server: DevServer
    model: ModelEndpoint
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    kubeconfigs: dict[str, Path] = field(default_factory=dict)
    # The warm pools the worker claims from ({name, namespace, runtime_class}), as the chart's sandbox settings list
    # them: set before the worker starts (or start it again).
    pools: list[dict[str, str]] = field(default_factory=list)
    # More of the bridge's settings (its chart-rendered environment, e.g. KSQUAD_NAMESPACE_MAX_CONCURRENT_RUNS):
    # set before the bridge starts.
    bridge_env: dict[str, str] = field(default_factory=dict)
    # More of the worker's sandbox settings (activities.sandboxes.manifests.SandboxSettings, e.g.
    # release_timeout_seconds): set before the worker starts.
    sandbox_settings: dict[str, Any] = field(default_factory=dict)
    # Each running component's health port (/healthz, /readyz, /metrics).
    ports: dict[str, int] = field(default_factory=dict)

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, input=input, check=check)

    def apply(self, *docs: dict[str, Any]) -> None:
        for doc in docs:
            doc.setdefault("metadata", {}).setdefault("namespace", self.namespace)
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(list(docs)))

    def service_account_kubeconfig(self, name: str) -> Path:
        return service_account_kubeconfig(self.cluster, name, self.namespace)

    @property
    def seal_key(self) -> Path:
        """The key the bridge seals resolutions with and the worker checks them by (the chart's Secret)."""
        path = self.root / "seal.key"
        ensure_key_file(path)
        return path

    @property
    def endpoint_key(self) -> Path:
        """The key the worker signs its callers' tokens to Agent.spec.endpoint agents with (agent.callers): a
        shared endpoint agent started for this stack is given it (chart value agents.endpointTokenKeySecret)."""
        path = self.root / "endpoint-token.key"
        ensure_key_file(path)
        return path

    def env(self, component: str) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfigs[component]),
            "KSQUAD_SEAL_KEY_FILE": str(self.seal_key),
            "KSQUAD_ENDPOINT_TOKEN_KEY_FILE": str(self.endpoint_key),
            "KSQUAD_TEMPORAL_ADDRESS": self.dev_server.target,
            "KSQUAD_TASK_QUEUE": self.task_queue,
            "KSQUAD_HEALTH_PORT": str(free_port()),
        }

    async def start(self, component: str) -> subprocess.Popen[bytes]:
        """Start `component` and wait until it is ready. Its health port is picked free just before it starts;
        another process can take it meanwhile (seen once in CI: "address already in use", and the bridge
        exited), so a start that fails on that is made again on another port."""
        for _ in range(PORT_TRIES - 1):
            try:
                return await self._start_once(component)
            except PortTaken:
                continue
        return await self._start_once(component)

    async def _start_once(self, component: str) -> subprocess.Popen[bytes]:
        log_file = self.root / f"{component}.log"
        log_start = log_file.stat().st_size if log_file.exists() else 0
        if component == "bridge":
            env = {
                **self.env("bridge"),
                "KSQUAD_WATCH_NAMESPACES": self.namespace,
                "KSQUAD_LEASE_NAMESPACE": chart.RELEASE_NAMESPACE,
                "KSQUAD_LEASE_NAME": f"bridge-{self.namespace}",
                "POD_NAME": f"bridge-{uuid.uuid4().hex[:6]}",
                "KSQUAD_CANCEL_WAIT_SECONDS": "30",
                "KSQUAD_DATABASE_URL": self.database_url,  # phase events, for the cluster API's streams
                **self.bridge_env,
            }
            module = "crd_bridge.main"
        else:
            config = self.root / "sandbox.yaml"
            config.write_text(
                yaml.safe_dump(
                    {
                        "backend": "kubernetes",
                        "image": AGENT_IMAGE,
                        "poll_seconds": 0.1,
                        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                        "pools": self.pools,
                        **self.sandbox_settings,
                    }
                )
            )
            env = {
                **self.env("worker"),
                "KSQUAD_DATABASE_URL": self.database_url,
                "KSQUAD_SANDBOX_CONFIG": str(config),
            }
            module = "worker.main"
        log = (self.root / f"{component}.log").open("ab")
        process = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", module]),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )
        self.processes[component] = process
        port = env["KSQUAD_HEALTH_PORT"]
        self.ports[component] = int(port)
        async with httpx.AsyncClient() as http:
            for _ in range(300):
                if process.poll() is not None:
                    output = log_file.read_bytes()[log_start:].decode(errors="replace")
                    if "address already in use" in output.lower():
                        raise PortTaken(output[-3000:])
                    raise RuntimeError(f"{component} exited: {output[-3000:]}")
                try:
                    if (await http.get(f"http://127.0.0.1:{port}/readyz", timeout=1)).status_code == 200:
                        return process
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{component} not ready: {(self.root / f'{component}.log').read_text()[-3000:]}")

    def kill(self, component: str) -> None:
        process = self.processes.pop(component)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for process in self.processes.values():
            process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    @property
    def database_url(self) -> str:
        """The store the worker and the bridge share (SQLite here; PostgreSQL on the installed chart)."""
        return f"sqlite:///{self.root / 'ksquad.db'}"

    def log(self, component: str) -> str:
        return (self.root / f"{component}.log").read_text()

    async def phase_log(self, uid: str) -> list[str]:
        """The reasons of a run's phase changes, in order, from its event log in the store (what `ksquad runs
        watch` shows; Kubernetes Events aggregate repeats of one reason and message)."""
        store = await Store.open(self.database_url, migrate=False)
        try:
            return [e.data["reason"] for e in await store.events(uid) if e.kind == "phase"]
        finally:
            await store.close()

    async def run(self, name: str) -> dict[str, Any]:
        return await self.kube.get(path(RUN_API, "runs", self.namespace, name))

    async def wait_phase(self, name: str, phases: set[str], within: float = 90) -> dict[str, Any]:
        for _ in range(int(within / 0.1)):
            run = await self.run(name)
            if run.get("status", {}).get("phase") in phases:
                return run
            await asyncio.sleep(0.1)
        raise AssertionError(
            f"{name} never reached {phases}: {json.dumps(run.get('status'))[:2000]}\n"
            f"bridge: {self.log('bridge')[-2000:]}\nworker: {self.log('worker')[-2000:]}"
        )

    def resources(
        self, model: ModelEndpoint, agent: str = "dev-1", **agent_spec: Any
    ) -> list[dict[str, Any]]:
        """An Agent, its ModelEndpoint (the scripted model) and the labelled credential Secret."""
        return [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "model-key",
                    "labels": {"ksquad.io/credential": "true"},
                    # its owner's word: the scripted model, and nowhere else
                    "annotations": {"ksquad.io/allowed-hosts": urlsplit(model.url).hostname or ""},
                },
                "stringData": {"apiKey": MODEL_KEY},
            },
            {
                "apiVersion": RUN_API,
                "kind": "ModelEndpoint",
                "metadata": {"name": "scripted"},
                "spec": {"url": model.url, "model": "dev-model"},
            },
            {
                "apiVersion": RUN_API,
                "kind": "Agent",
                "metadata": {"name": agent},
                "spec": {
                    "modelEndpointRef": "scripted",
                    "credentialSecretRef": {"name": "model-key"},
                    "systemPrompt": "You fix flaky tests.",
                    **agent_spec,
                },
            },
        ]


def service_account_kubeconfig(cluster: ControlPlane, name: str, suffix: str) -> Path:
    """A kubeconfig authenticating as the chart's ServiceAccount `name` (a token for two hours)."""
    token = cluster.kubectl(
        "create", "token", name, "-n", chart.RELEASE_NAMESPACE, "--duration=2h"
    ).stdout.strip()
    return cluster.token_kubeconfig(f"{name}-{suffix}", token)


def apply_chart_rbac(cluster: ControlPlane, namespace: str, values: dict[str, Any]) -> None:
    """`namespace` (made when missing) with the chart's ServiceAccounts, RBAC, network and admission policies
    for it, rendered from `values` (their `namespaces` is set to it)."""
    if cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0:
        cluster.kubectl("create", "namespace", namespace)
    cluster.wait_for_default_service_account(namespace)
    chart.apply(cluster, chart.render({**values, "namespaces": [namespace]}), STACK_KINDS)


async def build_stack(
    cluster: ControlPlane,
    dev_server: DevServer,
    model: ModelEndpoint,
    admin: Kube,
    root: Path,
    namespace: str | None = None,
    bridge: bool = True,
    runtime_classes: dict[str, str | None] | None = None,
) -> Stack:
    """The chart's RBAC applied for `namespace` (a fresh one by default), then the worker and the bridge.
    `runtime_classes` (e.g. RUNC_FOR_GVISOR) is the chart value sandbox.runtimeClasses: the worker's mapping, and
    what the chart's admission policy lets it ask for."""
    ns = namespace or f"t-{uuid.uuid4().hex[:10]}"
    values: dict[str, Any] = {}
    if runtime_classes is not None:
        values["sandbox"] = {"runtimeClasses": runtime_classes}
    apply_chart_rbac(cluster, ns, values)
    stack = Stack(
        cluster,
        ns,
        await connect(dev_server.target),
        admin,
        f"e2e-{uuid.uuid4().hex[:8]}",
        root / ns,
        dev_server,
        model,
        sandbox_settings={} if runtime_classes is None else {"runtime_classes": runtime_classes},
    )
    stack.root.mkdir(parents=True, exist_ok=True)
    for component in ("bridge", "worker"):
        stack.kubeconfigs[component] = stack.service_account_kubeconfig(f"ksquad-{component}")
    # The store at its newest schema before either starts (both would migrate the one SQLite file at once,
    # which SQLite does not serialise as PostgreSQL's advisory lock does); then both start together: each
    # takes a couple of seconds of imports, and the tests on the cluster start some fifty stacks.
    store = await Store.open(stack.database_url)
    await store.close()
    await asyncio.gather(*(stack.start(c) for c in ("worker", "bridge") if bridge or c == "worker"))
    return stack
