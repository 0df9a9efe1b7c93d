"""Sandbox placement on the installed chart, with the chart's allow-lists set as an operator allows a team's GPU
pool (tests/chart/conftest.py: sandbox.allowedServiceAccounts, allowedTolerations, allowedPriorityClasses).

A GPU node is simulated by kwok (testbed/kwok.py): labelled ksquad.io/pool=gpu, tainted ksquad.io/gpu, with four
nvidia.com/gpu. The real kube-scheduler places the sandbox of a Run whose Agent asks for that node selector,
toleration and one GPU onto it, and nowhere else (the real node has neither the label nor the GPUs); the pod runs
as the allowed ServiceAccount, still without a token, at the allowed priority. A Run's own node selector overrides
its Agent's and reaches the pod too. A placement outside the chart's lists is refused at admission, naming the
chart value; a toleration of every taint is refused even by the worker's own policy."""

import asyncio
import json
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from dev.binaries import find_binary
from testbed.kwok import SimulatedNodes
from tests.chart.conftest import GPU_ACCOUNT, GPU_PRIORITY, GPU_TAINT, NS, Release, phase_of, wait_for

API = "ksquad.io/v1alpha1"
GPU_NODE = "kwok-gpu-0"
GPU_PLACEMENT = {
    "serviceAccountName": GPU_ACCOUNT,
    "nodeSelector": {"ksquad.io/pool": "gpu"},
    "tolerations": [{"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {"limits": {"nvidia.com/gpu": "1"}},
    "priorityClassName": GPU_PRIORITY,
}


@pytest.fixture(scope="module")
def gpu_node(release: Release) -> Iterator[str]:
    nodes = SimulatedNodes(release.cluster)
    nodes.start()
    nodes.add(
        GPU_NODE,
        labels={"ksquad.io/pool": "gpu"},
        taints=[{"key": GPU_TAINT, "value": "true", "effect": "NoSchedule"}],
        capacity={"nvidia.com/gpu": "4"},
    )
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": GPU_ACCOUNT, "namespace": NS}},
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": GPU_PRIORITY},
            "value": 1000,
            "preemptionPolicy": "Never",
        },
        {
            "apiVersion": API,
            "kind": "ModelEndpoint",
            "metadata": {"name": "placement-model", "namespace": NS},
            "spec": {"url": "http://model.invalid/v1", "model": "gpu-model"},
        },
        {
            "apiVersion": API,
            "kind": "Agent",
            "metadata": {"name": "gpu-agent", "namespace": NS},
            "spec": {"modelEndpointRef": "placement-model", "placement": GPU_PLACEMENT},
        },
    ]
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield GPU_NODE
    finally:
        release.kubectl("delete", "runs", "-l", "test=placement", "-n", NS, "--wait=true", "--timeout=60s")
        release.kubectl(
            "delete",
            "agent/gpu-agent",
            "modelendpoint/placement-model",
            "serviceaccount/" + GPU_ACCOUNT,
            "-n",
            NS,
        )
        release.kubectl("delete", "priorityclass", GPU_PRIORITY)
        nodes.remove(GPU_NODE)


def run(name: str, **spec: Any) -> str:
    doc = {
        "apiVersion": API,
        "kind": "Run",
        "metadata": {"name": name, "namespace": NS, "labels": {"test": "placement"}},
        "spec": {"agents": ["gpu-agent"], "retryPolicy": {"maxRetries": 0}, **spec},
    }
    return yaml.safe_dump(doc)


def diagnosis(release: Release, run_name: str) -> str:
    """What a test that waited in vain saw: the Run's status, its Jobs and pods, the namespace's events, kwok's log."""
    status = release.run(run_name).get("status", {})
    jobs = release.cluster.kubectl(
        "get", "jobs,pods", "-n", NS, "-l", f"ksquad.io/run={run_name}", "-o", "wide", check=False
    )
    events = release.cluster.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp", check=False)
    nodes = release.cluster.kubectl("get", "nodes", "-o", "wide", "--show-labels", check=False)
    return (
        f"status: {json.dumps(status)[:3000]}\n{jobs.stdout}{jobs.stderr}\n{events.stdout[-4000:]}\n{nodes.stdout}\n"
        f"kwok: {release.cluster.tail('kwok')}"
    )


@contextmanager
def pod_watch(release: Release, run_name: str) -> Iterator[subprocess.Popen[str]]:
    """`kubectl get pods --watch -o json` on the Run's sandbox pods, as it streams."""
    cmd = [str(find_binary("kubectl")), "--kubeconfig", str(release.cluster.admin_kubeconfig), "get", "pods"]
    cmd += ["-n", NS, "-l", f"ksquad.io/run={run_name}", "--watch", "-o", "json"]
    watch = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield watch
    finally:
        watch.kill()
        watch.wait()


def first_scheduled(watch: subprocess.Popen[str], timeout: float) -> dict[str, Any] | None:
    """The first state of a pod the watch shows bound to a node, or None after `timeout`."""
    assert watch.stdout is not None
    decoder, buffer = json.JSONDecoder(), ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([watch.stdout], [], [], 1)
        if not ready:
            continue
        line = watch.stdout.readline()
        if not line:
            return None
        buffer += line
        try:
            pod, end = decoder.raw_decode(buffer.strip())
        except ValueError:
            continue
        buffer = buffer.strip()[end:]
        if pod.get("spec", {}).get("nodeName"):
            return dict(pod)
    return None


def sandbox_pod(release: Release, run_name: str) -> dict[str, Any] | None:
    pods = release.get("pods", "-n", NS, "-l", f"ksquad.io/run={run_name}")["items"]
    return pods[0] if pods else None


async def test_a_gpu_agents_sandbox_is_scheduled_onto_the_gpu_node_and_nowhere_else(
    release: Release, gpu_node: str
) -> None:
    # kwok makes the pod Ready at an address nobody serves, so the worker fails the attempt and deletes the pod
    # within a second: watch it from before the Run exists.
    with pod_watch(release, "placed-gpu") as pods:
        release.kubectl("apply", "-f", "-", input=run("placed-gpu"))
        pod = await asyncio.to_thread(first_scheduled, pods, 90)
    if pod is None:
        raise AssertionError(
            f"the GPU sandbox was not scheduled within 90s\n{diagnosis(release, 'placed-gpu')}"
        )
    spec = pod["spec"]
    assert spec["nodeName"] == gpu_node, f"scheduled onto {spec['nodeName']}"
    assert spec["nodeSelector"] == {"ksquad.io/pool": "gpu"}
    assert {"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    (agent,) = spec["containers"]
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == "1", "the GPU request passed through to the pod"
    assert spec["serviceAccountName"] == GPU_ACCOUNT
    assert spec["automountServiceAccountToken"] is False, "a placed sandbox still gets no token"
    assert (spec["priorityClassName"], spec["priority"]) == (GPU_PRIORITY, 1000)
    node = release.get("node", gpu_node)
    assert node["metadata"]["labels"]["type"] == "kwok", (
        "a simulated node: the scheduler chose it, nothing ran"
    )


async def test_a_runs_node_selector_overrides_its_agents_and_reaches_the_pod(
    release: Release, gpu_node: str
) -> None:
    release.kubectl(
        "apply",
        "-f",
        "-",
        input=run(
            "placed-nowhere",
            placement={"nodeSelector": {"ksquad.io/pool": "tpu"}},
            timeouts={"claimSeconds": 30},
        ),
    )

    def unschedulable() -> dict[str, Any] | None:
        pod = sandbox_pod(release, "placed-nowhere")
        if pod is None:
            return None
        conditions = {c["type"]: c for c in pod.get("status", {}).get("conditions", [])}
        scheduled = conditions.get("PodScheduled", {})
        return pod if scheduled.get("reason") == "Unschedulable" else None

    pod = await wait_for("the scheduler to find no node for the Run's selector", unschedulable, timeout=90)
    assert pod["spec"]["nodeSelector"] == {"ksquad.io/pool": "tpu"}, "the Run's selector, over the Agent's"
    assert "nodeName" not in pod["spec"]
    assert pod["spec"]["serviceAccountName"] == GPU_ACCOUNT, "the Agent's fields the Run does not set stay"
    # Claiming is bounded by timeouts.claimSeconds, and the Run says what its sandbox was waiting for.
    status = (await phase_of(release, "placed-nowhere", {"Failed", "Succeeded"}, timeout=90))["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "ClaimTimeout"), status
    assert status["message"].startswith("no sandbox within timeouts.claimSeconds (30s): pod "), status[
        "message"
    ]
    assert "cannot be scheduled" in status["message"], status["message"]


@pytest.mark.parametrize(
    ("placement", "words"),
    [
        (
            {"serviceAccountName": "ksquad-worker"},
            "spec.placement.serviceAccountName ksquad-worker is not allowed here (chart value sandbox.allowedServiceAccounts: gpu-runner",
        ),
        (
            {"tolerations": [{"operator": "Exists"}]},
            "spec.placement.tolerations: (no key: every taint) not allowed here (chart value sandbox.allowedTolerations: ksquad.io/gpu)",
        ),
        (
            {"priorityClassName": "system-node-critical"},
            "spec.placement.priorityClassName system-node-critical is not allowed here (chart value sandbox.allowedPriorityClasses: ksquad-batch)",
        ),
    ],
)
def test_a_placement_outside_the_charts_lists_is_refused_at_admission(
    release: Release, placement: dict[str, Any], words: str
) -> None:
    for kind, spec in (
        ("Agent", {"modelEndpointRef": "placement-model"}),
        ("Run", {"agents": ["gpu-agent"]}),
    ):
        doc = {
            "apiVersion": API,
            "kind": kind,
            "metadata": {"name": "too-far", "namespace": NS},
            "spec": {**spec, "placement": placement},
        }
        done = release.cluster.kubectl(
            "create", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False
        )
        assert done.returncode != 0, f"{kind} admitted: {done.stdout}"
        assert "ksquad-allowed-sandboxes" in done.stderr and words in " ".join(done.stderr.split()), (
            done.stderr
        )


def test_an_affinity_other_than_node_affinity_is_refused_by_the_api_server_naming_the_field(
    release: Release,
) -> None:
    """Pod affinity would place a sandbox beside another tenant's pods (a namespaceSelector reaches any namespace):
    only nodeAffinity is taken, on an Agent or a Run, and the refusal says where and why."""
    reach = {
        "labelSelector": {"matchLabels": {"app": "payments-db"}},
        "namespaceSelector": {},
        "topologyKey": "x",
    }
    node = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "ksquad.io/pool", "operator": "In", "values": ["gpu"]}]}
        ]
    }
    for kind, spec in (
        ("Agent", {"modelEndpointRef": "placement-model"}),
        ("Run", {"agents": ["gpu-agent"]}),
    ):
        for affinity, refused in (
            ({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [reach]}}, True),
            ({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}, True),
            ({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": node}}, False),
        ):
            doc = {
                "apiVersion": API,
                "kind": kind,
                "metadata": {"name": "near", "namespace": NS},
                "spec": {**spec, "placement": {"affinity": affinity}},
            }
            done = release.cluster.kubectl(
                "create", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False
            )
            if refused:
                assert done.returncode != 0, f"{kind} admitted with {affinity}"
                said = " ".join(done.stderr.split())
                assert "spec.placement.affinity" in said and "only nodeAffinity is allowed" in said, (
                    done.stderr
                )
            else:
                assert done.returncode == 0, done.stderr
