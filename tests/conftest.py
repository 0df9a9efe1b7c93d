"""Session fixtures of the test bed: real Temporal, PostgreSQL, SQLite and a Kubernetes control plane.

Each starts lazily, the first time a test asks for it, and stops at the end of the session. A missing
prerequisite raises with its reason (the test errors); nothing is skipped.
"""

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from dev.devserver import DevServer
from testbed.agents import (
    AgentFactory,
    ModelEndpoint,
    ToolServer,
    agent_starter,
    serving_model,
    serving_tools,
)
from testbed.controlplane import ControlPlane
from testbed.isolate import isolated
from testbed.postgres import PostgresServer
from testbed.temporal import start_time_skipping
from tests.support.browser import TEST_OUTPUT
from tests.support.fault_counts import record_counts
from tests.support.secret_scan import scan_audit_log, scan_histories, scan_logs, scan_temporal_databases

# The fixtures of the session's Kubernetes control plane (one node, one kubelet, one containerd).
CLUSTER_FIXTURES = {"cluster", "ksquad_cluster"}
SESSION_STARTED = pytest.StashKey[float]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[SESSION_STARTED] = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Name the files this session left in test-output/, so a CI log says where its screenshots are."""
    started = config.stash.get(SESSION_STARTED, 0.0)
    made = [p for p in sorted(TEST_OUTPUT.rglob("*")) if p.is_file() and p.stat().st_mtime >= started]
    if made:
        terminalreporter.write_sep("-", f"{len(made)} files in {TEST_OUTPUT} from this run")
        for path in made:
            terminalreporter.write_line(str(path.relative_to(TEST_OUTPUT)))


def pytest_itemcollected(item: pytest.Item) -> None:
    """Under two pytest-xdist workers (`--dist loadgroup`, the Makefile's PYTEST_WORKERS): every test on the
    control plane goes to one of them, in order, so there is one control plane and one node, while the tests that
    need none (the workflows, the agent, the embedded stack, the Temporal and PostgreSQL faults) run on the other.
    Marked as each item is collected: xdist reads the marks in its own pytest_collection_modifyitems."""
    if item.config.pluginmanager.hasplugin("xdist") and CLUSTER_FIXTURES & set(
        getattr(item, "fixturenames", ())
    ):
        item.add_marker(pytest.mark.xdist_group("cluster"))


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
async def dev_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevServer]:
    """Temporal's dev server with ksquad's search attributes, headless, state in memory. After the suite, no
    credential may be found in any workflow history it holds, nor in any embedded stack's Temporal database or
    any log of the session."""
    log_file = tmp_path_factory.mktemp("temporal") / "dev-server.log"
    # Pods reach it on the node's address. Given a single non-loopback --ip, the dev server's own services
    # cannot reach each other (they announce 127.0.0.1): inside the test bed's namespaces it listens on all.
    # With its UI: tests/chart/ shows decoded payloads in it through ksquad-api's codec endpoint.
    async with DevServer(ip="0.0.0.0" if isolated() else "127.0.0.1", ui=True, log_file=log_file) as server:
        yield server
        histories = await scan_histories(await Client.connect(server.target))
        embedded = scan_temporal_databases(tmp_path_factory.getbasetemp())
        logs = scan_logs(tmp_path_factory.getbasetemp())
        leaks = histories.leaks + embedded.leaks + logs.leaks
        record_counts(
            {
                "secret_scan.histories": histories.scanned,
                "secret_scan.embedded_temporal_databases": embedded.scanned,
                "secret_scan.log_files": logs.scanned,
                "secret_scan.leaks_in_histories_and_logs": len(leaks),
            }
        )
        assert not leaks, f"credentials copied: {leaks}"


@pytest.fixture(scope="session")
async def temporal_client(dev_server: DevServer) -> Client:
    return await Client.connect(dev_server.target)


@pytest.fixture
def task_queue() -> str:
    """A task queue of the test's own, so workers of different tests never take each other's tasks."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def model() -> AsyncIterator[ModelEndpoint]:
    """The scripted model, served in the test's event loop."""
    async with serving_model() as endpoint:
        yield endpoint


@pytest.fixture
async def tool_server() -> AsyncIterator[ToolServer]:
    """An MCP server, likewise."""
    async with serving_tools() as tools:
        yield tools


@pytest.fixture
async def start_agent(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    """The reference agent as its own process: `await start_agent(contract=None)`; stopped afterwards."""
    async with agent_starter(tmp_path) as start:
        yield start


@pytest.fixture
def outage_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of the test's own: the test stops and starts it (`halt`, `resume`)."""
    server = PostgresServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ksquad.db'}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[ControlPlane]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a node (kubelet, containerd, kube-proxy)
    that runs pods in containers from ksquad's images."""
    plane = ControlPlane()
    try:
        plane.start()
        plane.start_node()
        yield plane
        # After the suite: nothing written to the apiserver holds a credential; every sandbox pod was locked down.
        audit = scan_audit_log(plane.audit_log)
        record_counts(
            {
                "secret_scan.apiserver_writes": audit.scanned,
                "secret_scan.sandbox_pods": audit.sandbox_pods,
                "secret_scan.leaks_in_apiserver_writes": len(audit.leaks),
                "secret_scan.insecure_sandbox_pods": len(audit.insecure_pods),
                "secret_scan.run_texts_looked_for": audit.private_texts,
                "secret_scan.run_texts_in_jobs_or_pods": len(audit.texts_in_pods),
            }
        )
        assert audit.scanned > 0, f"{plane.audit_log} recorded no write: the scan below would prove nothing"
        assert not audit.leaks, f"credentials copied into objects: {audit.leaks[:20]}"
        assert not audit.texts_in_pods, f"prompts or inputs in Job or Pod specs: {audit.texts_in_pods[:20]}"
        assert not audit.insecure_pods, f"sandbox pods not locked down: {audit.insecure_pods[:20]}"
    finally:
        plane.stop()


@pytest.fixture
def namespace(cluster: ControlPlane) -> Iterator[str]:
    """A namespace of the test's own, deleted afterwards (without waiting for it to go)."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    cluster.wait_for_default_service_account(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


CRDS = Path(__file__).parents[1] / "charts" / "ksquad" / "crds" / "ksquad.io.yaml"


@pytest.fixture(scope="session")
def ksquad_cluster(cluster: ControlPlane) -> ControlPlane:
    """The control plane with ksquad's CRDs installed and the RuntimeClasses runs ask for."""
    cluster.kubectl("apply", "--server-side", "-f", str(CRDS))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRDS))
    cluster.wait_for_resource("runs.ksquad.io")
    # Listing works a moment before writing does ("Resource kind ksquad.io/v1alpha1, Kind=Run not found"):
    # wait until the API server takes a Run (a server-side dry run writes nothing).
    probe = "apiVersion: ksquad.io/v1alpha1\nkind: Run\nmetadata: {name: probe, namespace: default}\nspec: {agents: [a]}\n"
    for _ in range(300):
        if cluster.kubectl("create", "--dry-run=server", "-f", "-", input=probe, check=False).returncode == 0:
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the API server never took a Run after its CRD was established")
    cluster.add_runtime_classes()
    return cluster
