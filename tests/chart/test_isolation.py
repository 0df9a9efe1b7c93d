"""The isolation the chart promises a Run's sandbox, enforced by the test node (testbed/node.py) and proven on the
installed release: the sandbox runs under gVisor, and its NetworkPolicy lets it reach its model endpoint (an
egress entry of the chart's values, off the node), the cluster DNS in kube-system and ksquad-api's listener for
sandboxes (its work item), nothing else: not the API server, not ksquad-api's port for people, not the metadata
address, not a pod of another namespace, not a pod labelled as DNS outside kube-system. Each holds for both sandbox
backends: a cold Job of the worker's, and a warm sandbox claimed through agent-sandbox (a pool of backend
agent-sandbox set with `helm upgrade`, kubernetes-sigs/agent-sandbox's controller making its pods).

Each target the sandbox is denied is first reached from a pod under no policy (the control), so a denial is the
policy's (the connection times out, and kube-network-policies counts drops), not an empty address. One Run, the
seed's spec under another name, serves every test of a backend: its model "thinks" while the sandbox is probed.
"""

import asyncio
import json
import os
import socketserver
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from testbed import agent_sandbox
from testbed.agents import ModelEndpoint, serving_model
from testbed.images import AGENT_IMAGE
from testbed.isolate import NODE_ADDRESS
from testbed.outside import METADATA_ADDRESS, OFF_NODE_ADDRESS
from tests.chart.conftest import API_CLUSTER_IP, NS, SEED, Release, phase_of, wait_for

RUN = "isolated-seed"
OTHER = "isolation-other"  # a namespace under no policy: the impostor DNS pod, which is also the control
THINKING = 30  # seconds the model takes to answer: the sandbox is probed meanwhile
TIMEOUT = 3.0  # a probe's connect timeout: an answer on the test bed's network takes milliseconds
# Connects to each target at once; prints {name: "connected" | "timed out" | the error}.
PROBE = """
import concurrent.futures, json, socket, sys
targets = json.loads(sys.argv[1])
def probe(target):
    try:
        socket.create_connection(tuple(target), timeout=float(sys.argv[2])).close()
        return "connected"
    except TimeoutError:
        return "timed out"
    except OSError as err:
        return f"{type(err).__name__}: {err}"
with concurrent.futures.ThreadPoolExecutor(len(targets)) as pool:
    print(json.dumps(dict(zip(targets, pool.map(probe, targets.values())))))
"""
# Listens on TCP ports (argv) and closes each connection it takes: the DNS pods (no DNS is answered here).
LISTEN = """
import socket, sys, threading
def serve(port):
    server = socket.create_server(("0.0.0.0", port), reuse_port=True)
    while True:
        server.accept()[0].close()
for port in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(port),)).start()
"""


@dataclass
class Bed:
    release: Release
    model: ModelEndpoint
    metadata: "Listener"
    targets: dict[str, tuple[str, int]]  # what the sandbox is probed against, by name
    control: tuple[str, str]  # (namespace, pod) under no policy


class Listener(socketserver.ThreadingTCPServer):
    """The metadata address's stand-in: a server on the node that outside.py turns 169.254.169.254 back to."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.connections = 0
        super().__init__((NODE_ADDRESS, 0), socketserver.BaseRequestHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.connections += 1
        super().process_request(request, client_address)


def pod(name: str, namespace: str, labels: dict[str, str], ports: list[int]) -> dict[str, Any]:
    """A pod under runc listening on `ports` (as root: port 53)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 0},
            "containers": [
                {
                    "name": "listen",
                    "image": AGENT_IMAGE,
                    "command": ["python3", "-c", LISTEN, *map(str, ports)],
                    "readinessProbe": {"tcpSocket": {"port": ports[0]}, "periodSeconds": 1},
                }
            ],
        },
    }


def ready_ip(release: Release, namespace: str, name: str) -> str | None:
    got = release.get("pod", name, "-n", namespace)
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in got["status"].get("conditions", []))
    return got["status"].get("podIP") if ready else None


@pytest.fixture(scope="module")
async def off_node_model() -> AsyncIterator[ModelEndpoint]:
    """The scripted model, as the sandbox reaches it: an off-node address (testbed/outside.py)."""
    async with serving_model() as model:
        port = urlsplit(model.url).port
        yield ModelEndpoint(f"http://{OFF_NODE_ADDRESS}:{port}/v1", model.state)


@pytest.fixture(scope="module")
async def bed(release: Release, off_node_model: ModelEndpoint) -> AsyncIterator[Bed]:
    """The release with the model's address as its one egress entry, the target pods, the metadata stand-in."""
    model_port = urlsplit(off_node_model.url).port
    assert model_port is not None
    # As an operator does: the sandboxes may reach the model endpoint, at its address and port.
    await release.upgrade(
        [
            "--set",
            f"sandbox.network.egress[0].cidr={OFF_NODE_ADDRESS}/32",
            "--set",
            f"sandbox.network.egress[0].ports[0]={model_port}",
        ]
    )
    release.kubectl("create", "namespace", OTHER)
    release.cluster.wait_for_default_service_account(OTHER)
    release.kubectl(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump_all(
            [
                pod("kube-dns", "kube-system", {"k8s-app": "kube-dns"}, [53]),
                pod("dns-impostor", OTHER, {"k8s-app": "kube-dns"}, [53, 8080]),
            ]
        ),
    )
    dns = await wait_for("the kube-dns pod", lambda: ready_ip(release, "kube-system", "kube-dns"), 120)
    impostor = await wait_for("the impostor", lambda: ready_ip(release, OTHER, "dns-impostor"), 120)
    metadata = Listener()
    threading.Thread(target=metadata.serve_forever, daemon=True).start()
    apiserver = release.cluster
    try:
        yield Bed(
            release,
            off_node_model,
            metadata,
            {
                "model endpoint": (OFF_NODE_ADDRESS, model_port),
                "cluster DNS": (dns, 53),
                "API server (kubernetes Service)": ("10.0.0.1", 443),
                "API server (its address)": (apiserver.apiserver_address, apiserver.apiserver_port),
                "metadata address": (METADATA_ADDRESS, metadata.server_address[1]),
                "pod of another namespace": (impostor, 8080),
                "ksquad-api for sandboxes (items, HTTPS)": (API_CLUSTER_IP, 8443),
                "ksquad-api for people (console, codec, runs)": (API_CLUSTER_IP, 8080),
                "kube-dns label outside kube-system": (impostor, 53),
            },
            (OTHER, "dns-impostor"),
        )
    finally:
        metadata.shutdown()
        release.kubectl("delete", "pod", "kube-dns", "-n", "kube-system", "--wait=false")
        release.kubectl("delete", "namespace", OTHER, "--wait=false")


def probe(release: Release, namespace: str, name: str, targets: dict[str, tuple[str, int]]) -> dict[str, str]:
    done = release.kubectl(
        "exec", "-n", namespace, name, "--", "python3", "-c", PROBE, json.dumps(targets), str(TIMEOUT)
    )
    results: dict[str, str] = json.loads(done.stdout)
    return results


@dataclass
class Sandbox:
    name: str
    ip: str
    backend: str  # job or agent-sandbox
    calls_before: int  # the model's calls before its Run was applied


@pytest.fixture(scope="module", params=["job", "agent-sandbox"])
async def sandbox(bed: Bed, request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    """The seed's Run under another name, in its gvisor sandbox (a cold Job made by the worker, or a warm sandbox
    of a pool of backend agent-sandbox), while its model thinks."""
    release, backend = bed.release, request.param
    release.ensure_credential(bed.model)
    if backend == "agent-sandbox":
        await agent_sandbox_pool(release)
    bed.model.script("dev-model", {"delay": THINKING, "text": "Stabilized, in isolation."})
    release.squad(bed.model)  # its ModelEndpoint at the model's off-node address
    run = yaml.safe_load(SEED.read_text())
    run["metadata"]["name"] = run_name(backend)
    calls_before = len(bed.model.state.calls)
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(run))

    def running() -> Sandbox | None:
        status = release.run(run_name(backend)).get("status", {})
        if status.get("phase") in ("Failed", "Succeeded", "Cancelled"):
            raise AssertionError(f"the Run ended before its sandbox was probed: {json.dumps(status)[:2000]}")
        if backend == "agent-sandbox":
            named = status.get("sandbox") or {}
            if not named:
                return None
            assert named["kind"] == "claimed", status  # the pool's, not a cold Job
            pods = [release.get("pod", named["name"].partition("/")[2], "-n", NS)]
        else:
            pods = release.get("pods", "-n", NS, "-l", f"job-name={run_name(backend)}-exec-1")["items"]
        statuses = pods[0]["status"].get("containerStatuses") if pods else None
        if statuses and "running" in statuses[0]["state"] and pods[0]["status"].get("podIP"):
            return Sandbox(pods[0]["metadata"]["name"], pods[0]["status"]["podIP"], backend, calls_before)
        return None

    yield await wait_for("the Run's sandbox pod to run", running, timeout=180)
    if backend == "agent-sandbox":  # the release as the other tests know it: no pool
        await release.upgrade(["--set-json", "pools=[]"])


def run_name(backend: str) -> str:
    return RUN if backend == "job" else f"{RUN}-as"


async def agent_sandbox_pool(release: Release) -> None:
    """agent-sandbox in the cluster, and the release's one pool of backend agent-sandbox in the Runs' namespace,
    mounting the seed's credential (as an operator sets it), full."""
    agent_sandbox.start(release.cluster)
    pool = {
        "name": "as",
        "namespace": NS,
        "replicas": 1,
        "backend": "agent-sandbox",
        "credentials": ["model-key"],
    }
    await release.upgrade(
        [
            "--set-json",
            f"pools=[{json.dumps(pool)}]",
            "--set",
            f"agentSandbox.controllerUser={agent_sandbox.USER}",
        ]
    )

    def full() -> bool | None:
        warm = release.get("sandboxwarmpool", "ksquad-pool-as", "-n", NS)
        return True if (warm.get("status") or {}).get("readyReplicas") == 1 else None

    await wait_for("the agent-sandbox pool to be full", full, timeout=180)


async def test_the_sandbox_runs_under_gvisors_kernel_not_the_hosts(bed: Bed, sandbox: Sandbox) -> None:
    release = bed.release
    spec = release.get("pod", sandbox.name, "-n", NS)["spec"]
    assert spec["runtimeClassName"] == "gvisor"
    inside = await asyncio.to_thread(
        release.kubectl, "exec", "-n", NS, sandbox.name, "--", "cat", "/proc/version"
    )
    control = await asyncio.to_thread(
        release.kubectl, "exec", "-n", bed.control[0], bed.control[1], "--", "cat", "/proc/version"
    )
    host = Path("/proc/version").read_text()
    assert control.stdout == host, "a runc pod shares the host's kernel"
    # gVisor's Sentry answers as its own kernel, whatever the host runs.
    assert inside.stdout.startswith("Linux version 4.4.0 "), inside.stdout
    assert os.uname().release != "4.4.0" and inside.stdout != host


async def test_the_sandbox_reaches_its_model_the_cluster_dns_and_its_item_listener_and_nothing_else(
    bed: Bed, sandbox: Sandbox
) -> None:
    release = bed.release
    allowed = {"model endpoint", "cluster DNS", "ksquad-api for sandboxes (items, HTTPS)"}
    # From a pod under no policy every target answers: each is there, on a path a pod can take.
    reached = bed.metadata.connections  # the module's probes so far (one a backend)
    control = await asyncio.to_thread(probe, release, *bed.control, bed.targets)
    assert control == {name: "connected" for name in bed.targets}, control
    assert bed.metadata.connections == reached + 1
    policies = release.cluster.node.network_policies
    dropped = policies.verdicts().get("drop", 0)
    started = time.monotonic()
    results = await asyncio.to_thread(probe, release, NS, sandbox.name, bed.targets)
    print(f"[isolation] sandbox probes {time.monotonic() - started:.1f}s: {json.dumps(results)}")
    assert results == {name: "connected" if name in allowed else "timed out" for name in bed.targets}, results
    assert bed.metadata.connections == reached + 1, "nothing reached the metadata stand-in from the sandbox"
    denied = len(bed.targets) - len(allowed)
    assert policies.verdicts().get("drop", 0) - dropped >= denied, "kube-network-policies dropped each one"


async def test_the_seed_run_succeeds_in_its_gvisor_sandbox_through_its_egress_entry(
    bed: Bed, sandbox: Sandbox
) -> None:
    run = await phase_of(
        bed.release, run_name(sandbox.backend), {"Succeeded", "Failed"}, timeout=THINKING + 120
    )
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert status["outputs"] == {"answer": "Stabilized, in isolation."}
    assert status["attempt"] == 1, "in the sandbox probed above (the attempt's first pod)"
    task = yaml.safe_load(SEED.read_text())["spec"]["inputs"]["task"]
    calls = [c.task for c in bed.model.state.calls[sandbox.calls_before :]].count(task)
    assert calls == status["attempt"], "the sandbox called the model at its off-node address, once"
