"""Sandboxes on the test cluster, in containers from ksquad's images: cold Jobs that run the reference agent,
warm pools that never double-bind, toolchains, no secrets in specs, pods that cannot start."""

import asyncio
import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.agents import AgentActivities
from activities.sandboxes import (
    ContainerSpec,
    KubernetesSandboxes,
    PoolRef,
    SandboxActivities,
    SandboxSettings,
    job_name,
)
from agent.scripted_model import fingerprint
from kube import ApiError, Config, Kube, path
from store import Store
from testbed import chart, warrants
from testbed.agents import MODEL_KEY, ModelEndpoint, contract
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE, KSQUAD_IMAGE
from workflows.activity_types import SandboxRequest
from workflows.contract import ExecutionContract, SkillRequirements, SkillSpec
from workflows.spec import SandboxPolicy

# A toolchain's init container: stages a `jq` into the shared volume (from the ksquad image, which has Python).
STAGE_JQ = [
    "python3",
    "-c",
    "import os; d = os.environ['KSQUAD_TOOLCHAIN_DIR'] + '/bin'; os.makedirs(d); "
    "open(d + '/jq', 'w').write('#!/bin/sh\\necho jq')",
]

# A skill's sidecar: a server on the pod's loopback (docs the agent may read).
SERVE_DOCS = ["python3", "-m", "http.server", "8700", "--bind", "127.0.0.1", "--directory", "/usr/share"]

# The test node has 2 CPUs: sandboxes ask for little, so twenty fit beside each other.
SMALL = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "1Gi"}}


def settings(**overrides: Any) -> SandboxSettings:
    base: dict[str, Any] = {
        "image": AGENT_IMAGE,
        "poll_seconds": 0.1,
        "resources": SMALL,
        "toolchains": {"jq": ContainerSpec(image=KSQUAD_IMAGE, command=STAGE_JQ)},
    }
    return SandboxSettings(**{**base, **overrides})


RUNC = "kata"  # a RuntimeClass the test node runs with runc (testbed/node.py)
SANDBOX_KINDS = {"ServiceAccount", "NetworkPolicy", "ReplicaSet"}


def apply_sandbox_parts(cluster: ControlPlane, values: dict[str, Any]) -> list[PoolRef]:
    """The chart's sandbox parts (ServiceAccount, NetworkPolicy, pools) for the Run namespaces in `values`; the
    pools as the worker's settings have them (with the templates the chart rendered)."""
    rendered = chart.render(values)
    docs = [d for d in rendered if d["metadata"].get("namespace") != chart.RELEASE_NAMESPACE]
    chart.apply(cluster, docs, SANDBOX_KINDS)
    return chart.worker_settings(rendered).pools


@pytest.fixture
async def kube(ksquad_cluster: ControlPlane) -> AsyncIterator[Kube]:
    async with Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as client:
        yield client


@pytest.fixture
def run_ns(ksquad_cluster: ControlPlane, namespace: str) -> str:
    """A namespace of Runs: the chart's sandbox ServiceAccount and NetworkPolicy, and the model's Secret."""
    apply_sandbox_parts(ksquad_cluster, {"namespaces": [namespace]})
    ksquad_cluster.kubectl(
        "create", "secret", "generic", "model-key", "-n", namespace, f"--from-literal=apiKey={MODEL_KEY}"
    )
    return namespace


def create_run(cluster: ControlPlane, namespace: str, name: str) -> str:
    doc = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"agents": ["dev-1"]},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    created = json.loads(cluster.kubectl("get", "kr", name, "-n", namespace, "-o", "json").stdout)
    return str(created["metadata"]["uid"])


def request(c: ExecutionContract, policy: SandboxPolicy | None = None, timeout: int = 60) -> SandboxRequest:
    return warrants.sandbox_request(c, timeout, policy=policy, run_seconds=600)


async def acquire(backend: KubernetesSandboxes, req: SandboxRequest) -> Any:
    return await ActivityEnvironment().run(SandboxActivities(backend).acquire_sandbox, req)


async def release(
    backend: KubernetesSandboxes, c: ExecutionContract, sandbox: Any, confirm: bool = True
) -> None:
    await ActivityEnvironment().run(
        SandboxActivities(backend).release_sandbox, warrants.sandbox_release(c, sandbox, confirm)
    )


async def gone(kube: Kube, url: str, within: float = 60) -> bool:
    for _ in range(int(within / 0.2)):
        try:
            await kube.get(url)
        except ApiError as err:
            if err.status == 404:
                return True
            raise
        await asyncio.sleep(0.2)
    return False


async def test_a_cold_run_runs_the_reference_agent_publishes_outputs_and_the_run_owns_everything(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "The flaky test is fixed."})
    uid = create_run(ksquad_cluster, run_ns, "fix-flaky-tests")
    c = contract(model, namespace=run_ns, name="fix-flaky-tests", uid=uid, work_item_ref=None)
    backend = KubernetesSandboxes(kube, settings(outputs_config_map=True))  # the seed's ConfigMap, asked for
    sandbox = await acquire(backend, request(c, SandboxPolicy(class_="batch")))
    assert (sandbox.kind, sandbox.name) == ("cold", "fix-flaky-tests-exec-1")
    job = await kube.get(path("batch/v1", "jobs", run_ns, sandbox.name))
    assert job["metadata"]["ownerReferences"][0]["uid"] == uid
    # As set, on the API server: no pod retries (a retry is the workflow's, with a new fence), the attempt's life
    # bounded by runSeconds + the time to become ready + a minute, the finished Job gone after the TTL.
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (0, 600 + 60 + 60)
    assert job["spec"]["ttlSecondsAfterFinished"] == settings().ttl_seconds_after_finished

    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        invocation = warrants.invocation(c, sandbox)
        result = await ActivityEnvironment().run(AgentActivities(store).invoke_agent, invocation)
    finally:
        await store.close()
    assert result.outputs == {"answer": "The flaky test is fixed."}
    assert model.state.calls[0].credential == fingerprint(f"Bearer {MODEL_KEY}"), (
        "the agent read its credential from the Secret"
    )

    published = await ActivityEnvironment().run(
        SandboxActivities(backend).publish_outputs,
        warrants.outputs_request(c, result.outputs),
    )
    assert published.config_map == "fix-flaky-tests-outputs"
    config_map = await kube.get(path("v1", "configmaps", run_ns, "fix-flaky-tests-outputs"))
    assert config_map["data"] == {"answer": "The flaky test is fixed."}

    ksquad_cluster.kubectl("delete", "kr", "fix-flaky-tests", "-n", run_ns, "--wait=true")
    assert await gone(kube, path("batch/v1", "jobs", run_ns, sandbox.name)), "the Job goes with its Run"
    assert await gone(kube, path("v1", "configmaps", run_ns, "fix-flaky-tests-outputs")), "so do the outputs"
    pods = await kube.list(path("v1", "pods", run_ns), labels={"job-name": sandbox.name})
    for _ in range(100):
        if not pods["items"]:
            break
        await asyncio.sleep(0.2)
        pods = await kube.list(path("v1", "pods", run_ns), labels={"job-name": sandbox.name})
    assert not pods["items"], "and its pod"


async def test_twenty_runs_race_for_five_warm_pods_none_bound_twice(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint
) -> None:
    pool = {
        "name": "p1",
        "namespace": run_ns,
        "replicas": 5,
        # What is raced for is the claim; isolation is tests/chart/test_isolation.py's. Twenty pods under gVisor's
        # ptrace platform (about 15 s of CPU each to start the agent) outlast the claim's bound on 2 cores.
        "runtimeClass": RUNC,
        "credentials": ["model-key"],
    }
    pools = apply_sandbox_parts(
        ksquad_cluster, {"namespaces": [run_ns], "pools": [pool], "sandbox": {"resources": SMALL}}
    )
    await ready_warm(kube, run_ns, 5)
    backend = KubernetesSandboxes(kube, settings(pools=pools))
    contracts = []
    for i in range(20):
        name = f"race-{i}"
        contracts.append(
            contract(
                model,
                namespace=run_ns,
                name=name,
                uid=create_run(ksquad_cluster, run_ns, name),
                work_item_ref=None,
            )
        )
    sandboxes = await asyncio.gather(
        *(acquire(backend, request(c, SandboxPolicy(runtime_class=RUNC), timeout=120)) for c in contracts)
    )

    warm = [s for s in sandboxes if s.kind == "warm"]
    cold = [s for s in sandboxes if s.kind == "cold"]
    assert (len(warm), len(cold)) == (5, 15)
    assert len({s.name for s in warm}) == 5, "no pod was bound twice"
    for c, s in zip(contracts, sandboxes, strict=True):
        if s.kind == "warm":
            pod = await kube.get(path("v1", "pods", run_ns, s.name))
            assert pod["metadata"]["labels"]["ksquad.io/run"] == c.run.name
            assert pod["metadata"]["labels"]["ksquad.io/state"] == "bound"
            assert pod["metadata"]["ownerReferences"] == [
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Run",
                    "name": c.run.name,
                    "uid": c.run.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
    await ready_warm(kube, run_ns, 5)  # the ReplicaSet replenished the pool

    await asyncio.gather(*(release(backend, c, s) for c, s in zip(contracts, sandboxes, strict=True)))
    for s in warm:
        assert await gone(kube, path("v1", "pods", run_ns, s.name), within=5), (
            f"bound pod {s.name} was deleted"
        )
    leftover = await kube.list(path("v1", "pods", run_ns), labels="ksquad.io/state=bound")
    assert not leftover["items"]


async def test_a_warm_pod_touched_between_the_list_and_the_claim_is_still_claimed(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint
) -> None:
    # A kubelet's status update or a controller's touch moves a pod's resourceVersion too: a 409 on the guarded
    # patch does not mean someone else took it. bind_warm passed over such a pod and started cold.
    pool = {
        "name": "p1",
        "namespace": run_ns,
        "replicas": 1,
        "runtimeClass": "gvisor",
        "credentials": ["model-key"],
    }
    pools = apply_sandbox_parts(
        ksquad_cluster, {"namespaces": [run_ns], "pools": [pool], "sandbox": {"resources": SMALL}}
    )
    (warm,) = await ready_warm(kube, run_ns, 1)
    backend = KubernetesSandboxes(kube, settings(pools=pools))
    listed = backend.kube.list

    async def list_then_touch(url: str, **kwargs: Any) -> Any:
        found = await listed(url, **kwargs)
        name = warm["metadata"]["name"]
        ksquad_cluster.kubectl("annotate", "pod", name, "-n", run_ns, f"touched={time.time()}", "--overwrite")
        return found

    backend.kube.list = list_then_touch  # type: ignore[method-assign, assignment]
    name = "touched"
    c = contract(
        model, namespace=run_ns, name=name, uid=create_run(ksquad_cluster, run_ns, name), work_item_ref=None
    )
    bound = await backend.pools.bind_warm(c, SandboxPolicy())
    backend.kube.list = listed  # type: ignore[method-assign]
    assert bound is not None and bound.name == warm["metadata"]["name"], (
        "the free pod is claimed, not skipped"
    )
    pod = await kube.get(path("v1", "pods", run_ns, bound.name))
    assert pod["metadata"]["labels"]["ksquad.io/run"] == name


async def test_claims_take_their_pod_from_the_watch_and_skip_one_another_worker_bound(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint
) -> None:
    # A claim listed every warm pod of its pool: at agent-sandbox's rates that was most of the worker's CPU. Now
    # the pools' warm pods are watched; a pod another worker bound leaves the copy when the watch says so.
    pool = {
        "name": "p1",
        "namespace": run_ns,
        "replicas": 3,
        "runtimeClass": RUNC,
        "credentials": ["model-key"],
    }
    pools = apply_sandbox_parts(
        ksquad_cluster, {"namespaces": [run_ns], "pools": [pool], "sandbox": {"resources": SMALL}}
    )
    await ready_warm(kube, run_ns, 3)
    mine, other = (KubernetesSandboxes(kube, settings(pools=pools)) for _ in range(2))
    listed: list[str] = []
    list_pods = mine.kube.list

    async def counted(url: str, **kwargs: Any) -> Any:
        listed.append(url)
        return await list_pods(url, **kwargs)

    def claim_contract(name: str) -> ExecutionContract:
        uid = create_run(ksquad_cluster, run_ns, name)
        return contract(model, namespace=run_ns, name=name, uid=uid, work_item_ref=None)

    try:
        mine.pools.warm_pods.start()
        for _ in range(100):
            if mine.pools.warm_pods.of_pool(run_ns, "p1") is not None:
                break
            await asyncio.sleep(0.1)
        copy = mine.pools.warm_pods.of_pool(run_ns, "p1")
        assert copy is not None and len(copy) == 3, "the watch listed the pool's pods"

        taken = await other.pools.bind_warm(claim_contract("elsewhere"), SandboxPolicy(runtime_class=RUNC))
        assert taken is not None
        for _ in range(100):
            if taken.name not in {
                p["metadata"]["name"] for p in mine.pools.warm_pods.of_pool(run_ns, "p1") or []
            }:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError(f"{taken.name}, bound by another worker, is still warm in this one's copy")

        mine.kube.list = counted  # type: ignore[method-assign, assignment]
        for name in ("here-1", "here-2"):
            bound = await mine.pools.bind_warm(claim_contract(name), SandboxPolicy(runtime_class=RUNC))
            assert bound is not None and bound.name != taken.name
            pod = await kube.get(path("v1", "pods", run_ns, bound.name))
            assert pod["metadata"]["labels"]["ksquad.io/run"] == name
        assert not [u for u in listed if "/pods" in u], "no claim listed the pool's pods"
    finally:
        mine.kube.list = list_pods  # type: ignore[method-assign]
        await mine.close()
        await other.close()


async def ready_warm(
    kube: Kube, namespace: str, count: int, within: float = 90, pool: str = "p1"
) -> list[Any]:
    from activities.sandboxes import pod_ready

    for _ in range(int(within / 0.2)):
        selector = f"ksquad.io/state=warm,ksquad.io/pool={pool}"
        pods = (await kube.list(path("v1", "pods", namespace), labels=selector))["items"]
        ready = [p for p in pods if pod_ready(p)]
        if len(ready) == count:
            return ready
        await asyncio.sleep(0.2)
    raise AssertionError(f"{count} warm pods not ready in {namespace}")


async def test_a_skill_with_a_toolchain_and_a_sidecar_forces_cold_and_the_agent_has_both(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint
) -> None:
    import httpx

    skill = SkillSpec(
        name="json",
        instructions="Use jq, and the docs server on localhost:8700.",
        requires=SkillRequirements(toolchains=["jq"], sidecars=["docs"]),
    )
    uid = create_run(ksquad_cluster, run_ns, "needs-jq")
    c = contract(model, namespace=run_ns, name="needs-jq", uid=uid, skills=[skill], work_item_ref=None)
    backend = KubernetesSandboxes(
        kube, settings(sidecars={"docs": ContainerSpec(image=KSQUAD_IMAGE, command=SERVE_DOCS)})
    )
    sandbox = await acquire(backend, request(c, SandboxPolicy(class_="interactive")))
    assert sandbox.kind == "cold", "a warm pod cannot gain an init container"
    async with httpx.AsyncClient() as http:
        stats = (await http.get(f"{sandbox.endpoint}ksquad/stats", timeout=5)).json()
    assert stats["toolchains"] == ["jq/bin/jq"]
    # The sidecar runs beside the agent, locked down as it is, and the agent reaches it on the pod's loopback.
    (pod,) = (await kube.list(path("v1", "pods", run_ns), labels={"job-name": sandbox.name}))["items"]
    (sidecar,) = [i for i in pod["spec"]["initContainers"] if i["name"] == "sidecar-docs"]
    assert (
        sidecar["restartPolicy"] == "Always" and sidecar["securityContext"]["readOnlyRootFilesystem"] is True
    )
    (running,) = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == "sidecar-docs"]
    assert "running" in running["state"], running
    fetch = "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8700/').status)"
    got = ksquad_cluster.kubectl(
        "exec", "-n", run_ns, pod["metadata"]["name"], "-c", "agent", "--", "python3", "-c", fetch
    )
    assert got.stdout.strip() == "200"
    await release(backend, c, sandbox)
    pods = (await kube.list(path("v1", "pods", run_ns), labels={"job-name": sandbox.name}))["items"]
    assert not pods, "the sidecar went with its sandbox"


async def test_no_spec_holds_a_secret_and_sandboxes_run_non_root_without_a_token(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint
) -> None:
    uid = create_run(ksquad_cluster, run_ns, "secretive")
    c = contract(model, namespace=run_ns, name="secretive", uid=uid, work_item_ref=None)
    backend = KubernetesSandboxes(kube, settings())
    sandbox = await acquire(backend, request(c, SandboxPolicy(class_="batch")))
    job = await kube.get(path("batch/v1", "jobs", run_ns, sandbox.name))
    (pod,) = (await kube.list(path("v1", "pods", run_ns), labels={"job-name": sandbox.name}))["items"]
    for obj in (job, pod):
        text = json.dumps(obj)
        assert "alice@example.com" not in text, "the sandbox never gets the user's identity"
        assert MODEL_KEY not in text
        assert base64.b64encode(MODEL_KEY.encode()).decode() not in text
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert spec["runtimeClassName"] == "gvisor"
    assert not any(v.get("projected") for v in spec.get("volumes", [])), "no service-account token volume"
    (agent,) = spec["containers"]
    refs = [e["valueFrom"]["secretKeyRef"] for e in agent["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert refs == [{"name": "model-key", "key": "apiKey"}]
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    await release(backend, c, sandbox)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"image": "registry.example/agent:missing"}, "ErrImagePull"),
        ({"node_selector": {"gpu": "h100"}, "unschedulable_grace_seconds": 1.0}, "cannot be scheduled"),
        (
            {"service_account": "nobody", "pod_creation_grace_seconds": 1.0},
            'serviceaccount "nobody" not found',
        ),
    ],
)
async def test_a_pod_that_cannot_start_fails_the_acquisition_with_its_reason(
    ksquad_cluster: ControlPlane,
    run_ns: str,
    kube: Kube,
    model: ModelEndpoint,
    overrides: dict[str, Any],
    words: str,
) -> None:
    name = f"broken-{uuid.uuid4().hex[:6]}"
    c = contract(
        model, namespace=run_ns, name=name, uid=create_run(ksquad_cluster, run_ns, name), work_item_ref=None
    )
    backend = KubernetesSandboxes(kube, settings(**overrides))
    started = asyncio.get_running_loop().time()
    with pytest.raises(ApplicationError) as caught:
        await acquire(backend, request(c, SandboxPolicy(class_="batch"), timeout=45))
    assert caught.value.type == "SandboxFailed"
    assert words in str(caught.value)
    assert asyncio.get_running_loop().time() - started < 45, "within the claim timeout"
    assert job_name(name, 1) in str(caught.value)


async def test_the_run_workflow_completes_on_a_cold_sandbox(
    ksquad_cluster: ControlPlane,
    run_ns: str,
    kube: Kube,
    model: ModelEndpoint,
    dev_server: Any,
    tmp_path: Path,
) -> None:
    from activities.claims import ClaimActivities
    from tests.workflows.world import World, run_input, running_world_on, start_run
    from workflows.status import Phase

    model.script("dev-model", {"text": "Stabilized the payment-retry test."})
    uid = create_run(ksquad_cluster, run_ns, "whole-run")
    world = World()
    world.agents["dev-1"] = contract(model, namespace=run_ns, name="whole-run", uid=uid).agent
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    real = [
        *ClaimActivities(store).all(),
        AgentActivities(store).invoke_agent,
        *SandboxActivities(KubernetesSandboxes(kube, settings())).all(),
    ]
    try:
        async with running_world_on(dev_server.target, world, real) as client:
            inp = run_input(
                "whole-run",
                namespace=run_ns,
                uid=uid,
                work_item_ref="wi-whole",
                sandboxPolicy={"class": "batch"},
            )
            status = await (await start_run(client, inp)).result()
    finally:
        await store.close()
    assert status.phase == Phase.SUCCEEDED, status.message
    assert status.sandbox is None, "released"
    assert status.outputs == {"answer": "Stabilized the payment-retry test."}
    with pytest.raises(ApiError) as absent:  # by default, no ConfigMap the built-in `view` role could read
        await kube.get(path("v1", "configmaps", run_ns, "whole-run-outputs"))
    assert absent.value.status == 404
    assert await gone(kube, path("batch/v1", "jobs", run_ns, "whole-run-exec-1"))
    running = next(e for e in world.events["whole-run"] if e.phase == Phase.RUNNING)
    assert (running.message or "").endswith("dev-1 on whole-run-exec-1")


# --- pods are ours because Kubernetes says so ------------------------------------------------------------------
# An intruder is a user who may edit a Run namespace (the `edit` ClusterRole: pods, Jobs, ReplicaSets), but is not
# the worker. Its pods run a listener of its own that records whatever it is sent.

LISTENER = r"""
import http.server, json, os
seen = {"posts": 0, "contract": False}
class Listener(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/.well-known/agent-card.json":
            body = os.environ["CARD"].replace("URL-HERE", "http://" + self.headers["Host"] + "/")
        else:
            body = json.dumps(seen)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())
    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        seen["posts"] += 1
        seen["contract"] = seen["contract"] or b"ksquad.io/contract" in data
        self.send_response(500)
        self.end_headers()
http.server.ThreadingHTTPServer(("", 8080), Listener).serve_forever()
"""


def intruder(cluster: ControlPlane, namespace: str) -> Path:
    """A kubeconfig of a user who may edit the namespace (create pods, Jobs, ReplicaSets) and nothing else."""
    cluster.kubectl("create", "serviceaccount", "intruder", "-n", namespace)
    cluster.kubectl(
        "create", "rolebinding", "intruder", "-n", namespace, "--clusterrole=edit",
        f"--serviceaccount={namespace}:intruder",
    )  # fmt: skip
    token = cluster.kubectl("create", "token", "intruder", "-n", namespace, "--duration=1h").stdout.strip()
    return cluster.token_kubeconfig(f"intruder-{namespace}", token, namespace)


def listener_pod(
    name: str, labels: dict[str, str], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    """The intruder's pod: its own code (a listener) on the node's default runtime (runc), locked down otherwise."""
    from google.protobuf.json_format import MessageToDict

    from agent.server import agent_card

    card = json.dumps(MessageToDict(agent_card("URL-HERE")))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "agent",
                    "image": KSQUAD_IMAGE,
                    "command": ["python3", "-c", LISTENER],
                    "env": [{"name": "CARD", "value": card}],
                    "readinessProbe": {"httpGet": {"path": "/seen", "port": 8080}, "periodSeconds": 1},
                    "securityContext": {"allowPrivilegeEscalation": False},
                }
            ],
        },
    }


async def running(kube: Kube, namespace: str, name: str, within: float = 60) -> Any:
    from activities.sandboxes import pod_ready

    for _ in range(int(within / 0.2)):
        pod = await kube.get(path("v1", "pods", namespace, name))
        if pod_ready(pod):
            return pod
        await asyncio.sleep(0.2)
    raise AssertionError(f"pod {name} not ready")


async def heard(pod: Any) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient() as http:
        result: dict[str, Any] = (
            await http.get(f"http://{pod['status']['podIP']}:8080/seen", timeout=5)
        ).json()
        return result


async def test_a_pod_labelled_for_the_attempts_job_is_not_its_sandbox_nor_a_job_made_under_its_name(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "answered by the Job's own pod"})
    as_intruder = intruder(ksquad_cluster, run_ns)
    uid = create_run(ksquad_cluster, run_ns, "labelled")
    c = contract(model, namespace=run_ns, name="labelled", uid=uid, work_item_ref=None)
    # Before the worker makes the Job, the intruder starts a pod labelled as its pod would be, on runc.
    decoy = listener_pod(
        "a-decoy",
        {"job-name": job_name("labelled", 1), "batch.kubernetes.io/job-name": job_name("labelled", 1)},
    )
    ksquad_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(decoy), kubeconfig=as_intruder)
    decoy = await running(kube, run_ns, "a-decoy")

    backend = KubernetesSandboxes(kube, settings())
    sandbox = await acquire(backend, request(c, SandboxPolicy(class_="batch")))
    assert sandbox.endpoint != f"http://{decoy['status']['podIP']}:8080/", "the decoy is not the sandbox"
    job = await kube.get(path("batch/v1", "jobs", run_ns, sandbox.name))
    (pod,) = [
        p
        for p in (await kube.list(path("v1", "pods", run_ns), labels={"job-name": sandbox.name}))["items"]
        if p["metadata"]["name"] != "a-decoy"
    ]
    assert sandbox.endpoint == f"http://{pod['status']['podIP']}:8080/", "the pod the Job made"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert pod["spec"]["runtimeClassName"] == "gvisor"
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        inv = warrants.invocation(c, sandbox)
        result = await ActivityEnvironment().run(AgentActivities(store).invoke_agent, inv)
    finally:
        await store.close()
    assert result.outputs == {"answer": "answered by the Job's own pod"}, (
        "its agent knew the caller's token hash"
    )
    assert await heard(decoy) == {"posts": 0, "contract": False}, "the decoy was sent nothing"

    # The intruder makes the next attempt's Job itself, owned by the Run and labelled for the attempt.
    c2 = contract(model, namespace=run_ns, name="labelled", uid=uid, attempt=2, work_item_ref=None)
    impostor = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name("labelled", 2),
            "labels": {"ksquad.io/run": "labelled", "ksquad.io/run-uid": uid, "ksquad.io/attempt": "2"},
            "ownerReferences": [
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Run",
                    "name": "labelled",
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "suspend": True,
            "template": {"spec": {"restartPolicy": "Never", **listener_pod("x", {})["spec"]}},
        },
    }
    ksquad_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(impostor), kubeconfig=as_intruder)
    with pytest.raises(ApplicationError) as caught:
        await acquire(backend, request(c2, SandboxPolicy(class_="batch")))
    assert caught.value.type == "SandboxFailed"
    assert f"Job {run_ns}/{job_name('labelled', 2)} exists and is not this attempt's" in str(caught.value)
    await release(backend, c, sandbox)


async def test_a_pod_labelled_warm_is_claimed_only_when_the_pools_replicaset_made_it(
    ksquad_cluster: ControlPlane, run_ns: str, kube: Kube, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "answered by the pool's own pod"})
    as_intruder = intruder(ksquad_cluster, run_ns)
    warm = {
        "ksquad.io/state": "warm",
        "ksquad.io/runtime-class": "gvisor",
        "app.kubernetes.io/component": "sandbox",
    }
    # One decoy says it is warm and holds the run's credential; the other matches the pool's selector before the
    # pool exists, so the pool's ReplicaSet adopts it as its own replica.
    loose = listener_pod("decoy-loose", warm, {"ksquad.io/credentials": "model-key"})
    adopted = listener_pod("decoy-adopted", {**warm, "ksquad.io/pool": "p1"})
    for decoy in (loose, adopted):
        ksquad_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(decoy), kubeconfig=as_intruder)
    loose = await running(kube, run_ns, "decoy-loose")
    await running(kube, run_ns, "decoy-adopted")
    pool = {
        "name": "p1",
        "namespace": run_ns,
        "replicas": 1,
        "runtimeClass": "gvisor",
        "credentials": ["model-key"],
    }
    pools = apply_sandbox_parts(
        ksquad_cluster, {"namespaces": [run_ns], "pools": [pool], "sandbox": {"resources": SMALL}}
    )
    for _ in range(100):
        owners = (await kube.get(path("v1", "pods", run_ns, "decoy-adopted")))["metadata"].get(
            "ownerReferences", []
        )
        if owners:
            break
        await asyncio.sleep(0.1)
    assert owners[0]["kind"] == "ReplicaSet", "the pool's ReplicaSet adopted the decoy"

    backend = KubernetesSandboxes(kube, settings(pools=pools))
    uid = create_run(ksquad_cluster, run_ns, "warmly")
    c = contract(model, namespace=run_ns, name="warmly", uid=uid, work_item_ref=None)
    assert await backend.pools.bind_warm(c, SandboxPolicy()) is None, "neither decoy is claimed"
    assert await gone(kube, path("v1", "pods", run_ns, "decoy-adopted"), within=30), (
        "the adopted decoy, not the pool's template, was deleted: the ReplicaSet replaces it"
    )
    (made,) = await ready_warm(kube, run_ns, 1)  # the pool's: the loose decoy is in none
    assert await backend.pools.bind_warm(c, SandboxPolicy(runtime_class="runc")) is None, (
        "a runc Run: not a gvisor pool"
    )
    bound = await backend.pools.bind_warm(c, SandboxPolicy())
    assert bound is not None and bound.name == made["metadata"]["name"]
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        inv = warrants.invocation(c, bound)
        result = await ActivityEnvironment().run(AgentActivities(store).invoke_agent, inv)
    finally:
        await store.close()
    assert result.outputs == {"answer": "answered by the pool's own pod"}, (
        "the claim gave it the token's hash"
    )
    assert await heard(loose) == {"posts": 0, "contract": False}
    await release(backend, c, bound)
