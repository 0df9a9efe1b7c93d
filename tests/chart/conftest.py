"""The release every test of tests/chart/ shares (installed once, as the README tells a user, and uninstalled by
tests/chart/test_uninstall.py, whose name sorts last), and what those tests use to look at it."""

import asyncio
import json
import os
import secrets
import shlex
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import yaml
from temporalio.client import Client

from dev.binaries import find_binary
from dev.devserver import DevServer
from store import Store
from testbed.agents import MODEL_KEY, ModelEndpoint
from testbed.chart import CHART
from testbed.controlplane import ControlPlane, cached_binaries_dir
from testbed.isolate import NODE_ADDRESS
from testbed.jaeger import Jaeger, running_jaeger
from testbed.postgres import PostgresServer
from tests.support.install_texts import readme_cluster_steps
from workflows.status import Phase

ROOT = Path(__file__).parents[2]
SEED = ROOT / "examples" / "fix-flaky-tests.yaml"
SQUAD = ROOT / "examples" / "cluster-squad.yaml"
HOME = "ksquad"  # the release's namespace: the README's
NS = "ksquad-system"  # the Runs': the seed Run's
RELEASE = "ksquad"
API_NODE_PORT = 30480
API_URL = f"http://{NODE_ADDRESS}:{API_NODE_PORT}"
# How sandboxes reach ksquad-api for their work items: the test bed has no cluster DNS, so the Service gets a fixed
# address of the Service range (through kube-proxy to the API's pod, as the sandboxes' NetworkPolicy allows).
API_CLUSTER_IP = "10.0.0.80"
SEED_TASK = "Stabilize the flaky payment-retry test."
# The placement the chart allows besides its defaults (sandbox.allowed*): tests/chart/test_placement.py.
GPU_ACCOUNT = "gpu-runner"
GPU_TAINT = "ksquad.io/gpu"
GPU_PRIORITY = "ksquad-batch"
T = TypeVar("T")


def ui_origin(dev_server: DevServer) -> str:
    """The Temporal UI as a browser on the node opens it: the same host as ksquad-api's node port, so the codec
    cookie is same-site."""
    return f"http://{NODE_ADDRESS}:{dev_server.ui_port}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """test_uninstall.py right after the package's other tests, in whatever order those were collected: it ends the
    release they share (and after it the package's fixture tears down, not before a later chart test)."""
    last = [item for item in items if item.nodeid.startswith("tests/chart/test_uninstall.py")]
    if not last:
        return
    rest = [item for item in items if item not in last]
    chart = [i for i, item in enumerate(rest) if item.nodeid.startswith("tests/chart/")]
    at = chart[-1] + 1 if chart else len(rest)
    items[:] = rest[:at] + last + rest[at:]


@dataclass
class Release:
    cluster: ControlPlane
    store: Store
    temporal: Client
    values: list[str]
    codec_token: str  # ksquad-api's shared codec token

    def helm(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return helm(self.cluster, *args, check=check, timeout=timeout)

    async def upgrade(self, changed: list[str]) -> None:
        """`helm upgrade` with the release's values and `changed` (kept for later upgrades), waiting for the
        pods, in a thread: the scripted model answers from this event loop."""
        args = [
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            HOME,
            *self.values,
            *changed,
            "--wait",
            "--timeout",
            "5m",
        ]
        await asyncio.to_thread(self.helm, *args)
        self.values += changed

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return self.cluster.kubectl(*args, input=input)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)

    def run(self, name: str) -> dict[str, Any]:
        run: dict[str, Any] = self.get("run", name, "-n", NS)
        return run

    def jobs_created(self, run: str | None = None) -> list[str]:
        """Every Job created in NS (for Run `run` only, by its label), as the API server's audit log has them
        (AUDIT_POLICY logs a Job's create with its body): a Job made and deleted before a test looks counts too."""
        names = []
        for event in self.cluster.audit_events():  # rotated files too: a long session outgrows one
            ref = event.get("objectRef") or {}
            if (ref.get("resource"), ref.get("namespace"), event.get("verb")) != ("jobs", NS, "create"):
                continue
            meta = (event.get("requestObject") or {}).get("metadata") or {}
            if run is None or (meta.get("labels") or {}).get("ksquad.io/run") == run:
                names.append(meta.get("name") or meta.get("generateName") or "?")
        return names

    def ensure_credential(self, model: ModelEndpoint) -> None:
        """The seed's credential `model-key` as the README has a user make it (tests/chart/test_install.py's seed
        test makes it so itself), allowed to go to `model` (at its address, which a test bed may add to)."""
        secret = self.cluster.kubectl("get", "secret", "model-key", "-n", NS, "-o", "json", check=False)
        if secret.returncode != 0:
            self.kubectl(
                "-n", NS, "create", "secret", "generic", "model-key", f"--from-literal=apiKey={MODEL_KEY}"
            )
            self.kubectl("-n", NS, "label", "secret", "model-key", "ksquad.io/credential=true")
            annotations = {}
        else:
            annotations = json.loads(secret.stdout)["metadata"].get("annotations", {})
        hosts = [h for h in annotations.get("ksquad.io/allowed-hosts", "").split(",") if h]
        if (host := urlsplit(model.url).hostname or "") not in hosts:
            hosts.append(host)
        self.kubectl(
            "-n",
            NS,
            "annotate",
            "--overwrite",
            "secret",
            "model-key",
            f"ksquad.io/allowed-hosts={','.join(hosts)}",
        )

    def squad(self, model: ModelEndpoint) -> None:
        self.kubectl("apply", "-f", "-", input=edited_squad(model))


def edited_squad(model: ModelEndpoint) -> str:
    """examples/cluster-squad.yaml, its ModelEndpoint pointed at the scripted model (as its comment has a user
    edit it)."""
    docs = list(yaml.safe_load_all(SQUAD.read_text()))
    for doc in docs:
        if doc["kind"] == "ModelEndpoint":
            doc["spec"].update(url=model.url, model="dev-model")
    return yaml.safe_dump_all(docs)


def helm(
    cluster: ControlPlane, *args: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    cmd = [str(cached_binaries_dir() / "helm"), "--kubeconfig", str(cluster.admin_kubeconfig), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return done


def diagnose(cluster: ControlPlane) -> str:
    """What a user would look at when an install does not come up: pods, events, each container's log."""
    parts = []
    for namespace in (HOME, NS):
        parts += [
            cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout,
            cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout[
                -3000:
            ],
        ]
        for pod in cluster.kubectl("get", "pods", "-n", namespace, "-o", "name", check=False).stdout.split():
            logs = cluster.kubectl("logs", "-n", namespace, pod, "--tail=40", check=False)
            parts.append(f"--- {pod}\n{logs.stdout}{logs.stderr}")
    return "\n".join(parts)


def grant(
    release: Release, account: str, name: str, verbs: str = "", resource: str = "", clusterrole: str = ""
) -> None:
    """Bind the Run namespace's ServiceAccount `account` to a new Role `name` (`verbs` on `resource`), or, given
    `clusterrole`, to that ClusterRole there."""
    if not clusterrole:
        release.kubectl("-n", NS, "create", "role", name, f"--verb={verbs}", f"--resource={resource}")
    bound = f"--clusterrole={clusterrole}" if clusterrole else f"--role={name}"
    release.kubectl("-n", NS, "create", "rolebinding", name, bound, f"--serviceaccount={NS}:{account}")


async def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float = 120, interval: float = 0.5
) -> T:
    """Polls `probe` in a thread: the scripted model serves in this event loop, which must keep running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(probe)
        if value:
            return value
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def phase_of(release: Release, name: str, phases: set[str], timeout: float = 180) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        run = release.run(name)
        return run if run.get("status", {}).get("phase") in phases else None

    try:
        return await wait_for(f"{name} to reach {phases}", reached, timeout)
    except AssertionError as err:
        status = json.dumps(release.run(name).get("status"))[:3000]
        raise AssertionError(f"{err}\nstatus: {status}\n{diagnose(release.cluster)}") from None


def terminal_events(release: Release, uid: str) -> int:
    """How many times the Run's Events (one per phase change, counted when repeated) say it ended."""
    events = release.get("events", "-n", NS, "--field-selector", f"involvedObject.uid={uid}")["items"]
    ends = tuple(f"{p.value}:" for p in Phase if p.terminal)
    return sum(int(e.get("count") or 1) for e in events if e["message"].startswith(ends))


@pytest.fixture(scope="package")
async def chart_jaeger(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Jaeger]:
    """The release's trace collector (Jaeger, on the node's address: every pod reaches it)."""
    async with running_jaeger(tmp_path_factory.mktemp("chart-jaeger")) as jaeger:
        yield jaeger


def bed_values(dev_server: DevServer, jaeger: Jaeger) -> list[str]:
    """What the test bed adds to the README's `helm install`: ksquad-api on a port of the node (its stand-in for an
    Ingress) beside the Temporal UI, with the codec token; sandboxes reaching it at a fixed address (no cluster DNS);
    the GPU allowances tests/chart/test_placement.py's agent asks for; tracing to the test bed's Jaeger."""
    return [
        "--set",
        "api.service.type=NodePort",
        "--set",
        f"api.service.nodePort={API_NODE_PORT}",
        "--set",
        f"api.url={API_URL}",
        "--set",
        f"api.uiOrigins={{{ui_origin(dev_server)}}}",
        "--set",
        "api.codecTokenSecret.name=ksquad-codec-token",
        "--set",
        f"api.service.clusterIP={API_CLUSTER_IP}",
        "--set",
        f"api.itemsUrl=https://{API_CLUSTER_IP}:8443",
        "--set",
        f"sandbox.allowedServiceAccounts={{{GPU_ACCOUNT}}}",
        "--set",
        f"sandbox.allowedTolerations={{{GPU_TAINT}}}",
        "--set",
        f"sandbox.allowedPriorityClasses={{{GPU_PRIORITY}}}",
        "--set",
        f"tracing.otlpEndpoint={jaeger.otlp_url}",
        "--set",
        "tracing.sandboxes.enabled=true",
        "--set",
        f"tracing.traceUrl={jaeger.trace_url()}",
    ]


def in_place_of(steps: list[str], replacements: dict[str, str]) -> list[str]:
    """`steps` with each of the text's values replaced by the test bed's; each must be in the text, so that the
    table keeps saying what the test changes."""
    for old in replacements:
        assert any(old in step for step in steps), (
            f"the text no longer has {old!r}: update the test bed's table"
        )
    for old, new in replacements.items():
        steps = [step.replace(old, new) for step in steps]
    return steps


def shell_step(
    cluster: ControlPlane, command: str, check: bool = True, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """One command of a text, as a user's shell runs it from the checkout: kubectl and helm on the PATH, the
    cluster's admin kubeconfig."""
    tools = cluster.root / "text-tools"
    if not tools.exists():
        tools.mkdir()
        (tools / "kubectl").symlink_to(find_binary("kubectl"))
        (tools / "helm").symlink_to(cached_binaries_dir() / "helm")
    env = {**os.environ, "KUBECONFIG": str(cluster.admin_kubeconfig), "PATH": f"{tools}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and done.returncode != 0:
        raise AssertionError(f"`{command}` failed ({done.returncode}): {done.stderr.strip()}")
    return done


@pytest.fixture(scope="package")
async def release(
    ksquad_cluster: ControlPlane, postgres: PostgresServer, dev_server: DevServer, chart_jaeger: Jaeger
) -> AsyncIterator[Release]:
    """Installed by the README's own commands ("On a cluster", up to `helm install`: the namespaces, the Runs'
    labelled restricted, the database and codec Secrets, `helm install --wait`), run by a shell as a user runs them,
    with the test bed's database and Temporal in place of the README's and bed_values added to the install;
    with tracing on, to the test bed's Jaeger, sandboxes too (tests/chart/test_traces.py reads what it exported)."""
    cluster = ksquad_cluster
    database = postgres.create_database(f"helm_{uuid.uuid4().hex[:8]}")
    url = database.replace("postgresql+psycopg://", "postgresql://")
    steps = readme_cluster_steps()
    install_at = next(i for i, step in enumerate(steps) if step.startswith("helm install"))
    as_the_test_bed = {
        "postgresql://ksquad:...@db/ksquad": url,
        "temporal-frontend.temporal.svc:7233": f"{NODE_ADDRESS}:{dev_server.port}",
    }
    steps = in_place_of(steps[: install_at + 1], as_the_test_bed)
    for step in steps[:install_at]:
        shell_step(cluster, step)
    # operating.md's step beyond the README's: the token the Temporal UI's codec calls carry (tests/chart/test_api.py)
    codec_token = secrets.token_urlsafe(24)
    cluster.kubectl(
        "-n", HOME, "create", "secret", "generic", "ksquad-codec-token", f"--from-literal=token={codec_token}"
    )
    install = shlex.split(steps[install_at])
    readme_values = [install[i + 1] for i, arg in enumerate(install) if arg == "--set"]  # upgrades keep them
    values = [arg for value in readme_values for arg in ("--set", value)] + bed_values(
        dev_server, chart_jaeger
    )
    started = time.monotonic()
    extra = " ".join(shlex.quote(arg) for arg in bed_values(dev_server, chart_jaeger))
    installed = shell_step(cluster, f"{steps[install_at]} {extra} --timeout 5m", check=False)
    if installed.returncode != 0:
        raise AssertionError(f"helm install failed: {installed.stderr}\n{diagnose(cluster)}")
    print(f"[helm install --wait] {time.monotonic() - started:.1f}s\n{installed.stdout}", flush=True)
    for namespace in (HOME, NS):
        cluster.wait_for_default_service_account(namespace)
    store = await Store.open(database, migrate=False)
    try:
        yield Release(cluster, store, await Client.connect(dev_server.target), values, codec_token)
    finally:
        await store.close()
        if helm(cluster, "status", RELEASE, "-n", HOME, check=False).returncode == 0:
            cluster.kubectl("delete", "runs", "--all", "-n", NS, "--wait=true", "--timeout=90s", check=False)
            helm(cluster, "uninstall", RELEASE, "-n", HOME, "--wait", check=False)
