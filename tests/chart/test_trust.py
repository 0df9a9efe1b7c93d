"""Trust by construction on the installed chart, tried as each actor would (docs/security.md):

- a namespace editor (Kubernetes' `edit` in the Run namespace, and Runs there) cannot reshape a warm pool, make a
  pod a pool or a Job would adopt, add an ephemeral container to a sandbox, change its image, or exec, attach or
  port-forward into it: each is refused by the admission policy ksquad-sandboxes-are-ksquads, naming why, and
  nothing changed;
- a pool changed by someone admission lets through (an operator, or a cluster without the policy) is not claimed
  from: the worker claims pods of the template the chart rendered only;
- a Temporal client without the codec key copies a finished Run's start input from its history and starts it again,
  under a new workflow id and under the Run's own: neither makes a Job, calls the model or touches the Run's status
  (a Warning Event CopyRefused says so);
- a Run may claim a work item only if its creator may update it;
- the built-in `view` role reads no answer: not the Run (its status, its artifacts through ksquad-api), not a
  ConfigMap, not the item's comments.
"""

import asyncio
import base64
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from activities.sandboxes import KubernetesSandboxes, SandboxSettings
from dev.binaries import find_binary
from kube import Config, Kube
from testbed.agents import ModelEndpoint
from testbed.chart import render
from tests.chart.conftest import API_URL, HOME, NS, RELEASE, Release, grant, phase_of, wait_for
from tests.chart.test_api import MODEL, squad, start_run
from tests.support.dev import ksquad
from workflows.activity_types import WORKER_TASK_QUEUE
from workflows.contract import ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import Placement, SandboxPolicy

POOL = "trust"
POLICY = "ksquad-sandboxes-are-ksquads"


def member(release: Release, name: str, item_rights: bool = True) -> Path:
    """A person of the Run namespace: Kubernetes' `edit` there (pods, Jobs, ReplicaSets, ConfigMaps, and work
    items) and Runs; without `item_rights`, Runs only (they may start Runs, not change work items)."""
    release.kubectl("-n", NS, "create", "serviceaccount", name)
    grant(release, name, f"{name}-runs", "get,list,watch,create,patch", "runs.ksquad.io")
    if item_rights:
        grant(release, name, f"{name}-edit", clusterrole="edit")
        # `kubectl debug`, as clusters give their developers (`edit` has no pods/ephemeralcontainers): RBAC would
        # let them, so what refuses it must be ksquad's admission policy.
        grant(release, name, f"{name}-debug", "patch,update", "pods/ephemeralcontainers")
    token = release.kubectl("-n", NS, "create", "token", name, "--duration=1h").stdout.strip()
    return release.cluster.token_kubeconfig(f"trust-{name}", token, NS)


async def items_cli(tmp_path: Path, kubeconfig: Path, *args: str) -> Any:
    """`ksquad items ...` as the user of `kubeconfig`, against the release's ksquad-api."""
    return await ksquad(tmp_path, "items", *args, "--kubeconfig", str(kubeconfig), "--api", API_URL)


def as_user(
    release: Release, kubeconfig: Path, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return release.cluster.kubectl(*args, input=input, check=False, kubeconfig=kubeconfig)


@pytest.fixture(scope="module")
def pool(release: Release) -> Iterator[dict[str, Any]]:
    """The chart's warm pool in the Run namespace, as `helm upgrade --set pools=...` would make it (applied by the
    admin, its operator), its pods kept off the node and marked Ready with an address."""
    values = yaml.safe_load(release.helm("get", "values", RELEASE, "-n", HOME, "-o", "yaml").stdout)
    values["pools"] = [
        {
            "name": POOL,
            "namespace": NS,
            "replicas": 1,
            "placement": {"nodeSelector": {"ksquad.io/no-node": "true"}},
        }
    ]
    rendered = render(values, namespace=HOME)
    (replica_set,) = [d for d in rendered if d["kind"] == "ReplicaSet"]
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(replica_set))
    try:
        yield replica_set
    finally:
        release.kubectl("delete", "replicaset", replica_set["metadata"]["name"], "-n", NS, "--wait=false")
        release.kubectl("delete", "pods", "-n", NS, "-l", f"ksquad.io/pool={POOL}", "--wait=false")


async def warm_pod(release: Release) -> str:
    def made() -> str | None:
        pods = release.get("pods", "-n", NS, "-l", f"ksquad.io/pool={POOL},ksquad.io/state=warm")["items"]
        return pods[0]["metadata"]["name"] if pods else None

    name: str = await wait_for("the pool's ReplicaSet to make its pod", made, timeout=30)
    ready = {
        "status": {
            "phase": "Running",
            "podIP": "10.244.255.3",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }
    release.kubectl("patch", "pod", name, "-n", NS, "--subresource=status", "-p", json.dumps(ready))
    return name


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    said = " ".join((done.stdout + done.stderr).split())
    assert done.returncode != 0, f"admitted: {said}"
    assert POLICY in said and all(w in said for w in words), said


async def test_an_editor_can_neither_reshape_a_pool_nor_reach_into_a_sandbox(
    release: Release, pool: dict[str, Any]
) -> None:
    name = await warm_pod(release)
    editor = member(release, "reshaper")
    rs = pool["metadata"]["name"]
    before = release.get("replicaset", rs, "-n", NS)["spec"]["template"]
    pod_before = release.get("pod", name, "-n", NS)["spec"]

    for patch in (
        {"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "evil:1"}]}}}},
        {
            "spec": {
                "template": {
                    "spec": {"containers": [{"name": "agent", "env": [{"name": "X", "value": "y"}]}]}
                }
            }
        },
        {"spec": {"template": {"metadata": {"labels": {"extra": "label"}}}}},
        {"spec": {"replicas": 5}},
    ):
        refused(
            as_user(
                release,
                editor,
                "patch",
                "replicaset",
                rs,
                "-n",
                NS,
                "--type=strategic",
                "-p",
                json.dumps(patch),
            ),
            "warm pool",
        )
    refused(as_user(release, editor, "delete", "replicaset", rs, "-n", NS), "warm pool")
    assert release.get("replicaset", rs, "-n", NS)["spec"]["template"] == before, "the pool is as it was"

    for labels in (
        {"ksquad.io/pool": POOL, "ksquad.io/state": "warm"},  # for the pool's ReplicaSet to adopt
        {"app.kubernetes.io/component": "sandbox"},
        {"batch.kubernetes.io/controller-uid": str(uuid.uuid4()), "job-name": "fix-exec-1"},  # for a Job
        {"controller-uid": str(uuid.uuid4())},
    ):
        decoy = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"decoy-{uuid.uuid4().hex[:6]}", "namespace": NS, "labels": labels},
            "spec": pool["spec"]["template"]["spec"],
        }
        refused(as_user(release, editor, "create", "-f", "-", input=json.dumps(decoy)), "is made")
    assert not release.get("pods", "-n", NS, "-l", "ksquad.io/pool=" + POOL)["items"][1:], "no second pod"

    refused(as_user(release, editor, "set", "image", f"pod/{name}", "agent=evil:1", "-n", NS), "is made")
    refused(
        as_user(release, editor, "label", "pod", name, "-n", NS, "ksquad.io/state=bound", "--overwrite"),
        "is made",
    )
    refused(
        as_user(
            release,
            editor,
            "debug",
            name,
            "-n",
            NS,
            "--image=busybox",
            "--profile=restricted",
            "--target=agent",
            "--",
            "true",
        ),
        "ephemeral",
    )
    refused(
        as_user(release, editor, "exec", name, "-n", NS, "-c", "agent", "--", "cat", "/proc/self/environ"),
        "reaches into a sandbox",
    )
    refused(as_user(release, editor, "attach", name, "-n", NS, "-c", "agent"), "reaches into a sandbox")
    kubectl = [str(find_binary("kubectl")), "--kubeconfig", str(editor)]
    forward = await asyncio.to_thread(
        subprocess.run,
        ["timeout", "20", *kubectl, "port-forward", f"pod/{name}", "18080:8080", "-n", NS],
        capture_output=True,
        text=True,
    )
    refused(forward, "reaches into a sandbox")
    after = release.get("pod", name, "-n", NS)
    assert after["spec"] == pod_before and after["metadata"]["labels"]["ksquad.io/state"] == "warm"
    assert "ephemeralContainers" not in after["spec"]

    # A pod of the editor's own, not a sandbox, is theirs to reach (the policy is about sandboxes only).
    mine = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "mine", "namespace": NS},
        "spec": pool["spec"]["template"]["spec"],
    }
    made = as_user(release, editor, "create", "-f", "-", input=json.dumps(mine))
    assert made.returncode == 0, made.stderr
    try:
        done = as_user(release, editor, "exec", "mine", "-n", NS, "--", "true")
        assert POLICY not in done.stderr, (
            done.stderr
        )  # refused for another reason (no node runs it), not by ksquad
    finally:
        release.kubectl("delete", "pod", "mine", "-n", NS, "--wait=false")


async def test_a_pool_changed_past_admission_is_not_claimed_from(
    release: Release, pool: dict[str, Any]
) -> None:
    """An operator (or a cluster without the policy) changes the pool's template: the worker, which claims pods of
    the template the chart rendered, takes none of its pods, and the change is undone by the next `helm upgrade`."""
    name = await warm_pod(release)
    config = yaml.safe_load(release.get("configmap", "ksquad-sandbox", "-n", HOME)["data"]["sandbox.yaml"])
    settings = SandboxSettings.model_validate(
        {**config, "pools": [{"name": POOL, "namespace": NS, "template": pool["spec"]["template"]}]}
    )
    token = release.kubectl("create", "token", "ksquad-worker", "-n", HOME, "--duration=30m").stdout.strip()
    as_worker = release.cluster.token_kubeconfig("trust-worker", token, NS)
    model = ModelRef(name="m", url="http://model.example/v1")
    placed = ResolvedAgent(
        name="dev-1", model=model, placement=Placement(node_selector={"ksquad.io/no-node": "true"})
    )
    rs = pool["metadata"]["name"]
    release.kubectl(
        "patch",
        "replicaset",
        rs,
        "-n",
        NS,
        "--type=json",
        "-p",
        json.dumps(
            [
                {
                    "op": "add",
                    "path": "/spec/template/spec/containers/0/env/-",
                    "value": {"name": "X", "value": "y"},
                }
            ]
        ),
    )
    try:
        async with Kube(Config.from_kubeconfig(as_worker)) as kube:
            run = RunIdentity(namespace=NS, name="pinned", uid=str(uuid.uuid4()), attempt=1, fence=1)
            contract = ExecutionContract(run=run, agent=placed, model=model)
            assert (
                await KubernetesSandboxes(kube, settings).pools.bind_warm(contract, SandboxPolicy()) is None
            )
            assert release.get("pod", name, "-n", NS)["metadata"]["labels"]["ksquad.io/state"] == "warm", (
                "unclaimed"
            )
    finally:
        # The chart's template put back whole (an apply would keep the env it never applied itself).
        release.kubectl("replace", "-f", "-", input=yaml.safe_dump(pool))
    async with Kube(Config.from_kubeconfig(as_worker)) as kube:
        run = RunIdentity(namespace=NS, name="pinned-again", uid=str(uuid.uuid4()), attempt=1, fence=1)
        bound = await KubernetesSandboxes(kube, settings).pools.bind_warm(
            ExecutionContract(run=run, agent=placed, model=model), SandboxPolicy()
        )
        assert bound is not None and bound.name == name, "the chart's template again: its pod is claimed"


async def test_a_copy_of_a_runs_start_input_makes_no_job_and_touches_nothing(
    release: Release, model: ModelEndpoint
) -> None:
    model.script(MODEL, {"text": "the victim's answer"})
    squad(release, model)
    start_run(release, "victim", "answer once")
    done = (await phase_of(release, "victim", {"Succeeded", "Failed"}, timeout=300))["status"]
    assert done["phase"] == "Succeeded", done
    jobs_before = release.jobs_created()
    calls_before = len(model.state.calls)
    history = release.temporal.get_workflow_handle(f"{NS}/victim")
    events = [e async for e in history.fetch_history_events()]
    (copied,) = events[
        0
    ].workflow_execution_started_event_attributes.input.payloads  # ciphertext: what a client without the codec key can read and copy

    for workflow_id in (f"attacker-{uuid.uuid4().hex[:6]}/victim", f"{NS}/victim"):
        handle = await release.temporal.start_workflow(
            "RunWorkflow",
            RawValue(Payload(metadata=copied.metadata, data=copied.data)),
            id=workflow_id,
            task_queue=WORKER_TASK_QUEUE,
        )
        for _ in range(240):  # no codec in this client: its result, ciphertext, is not read; that it ended is
            if (await handle.describe()).close_time is not None:
                break
            await asyncio.sleep(0.5)
        else:
            raise AssertionError(f"the copy {workflow_id} never ended")
    await asyncio.sleep(3)
    after = release.run("victim")["status"]
    assert (after["phase"], after["revision"], after["message"]) == (
        done["phase"],
        done["revision"],
        done["message"],
    )
    assert release.jobs_created() == jobs_before, "no Job made, not even one deleted since"
    assert len(model.state.calls) == calls_before, "the model was not called again"
    events = release.get("events", "-n", NS, "--field-selector", "involvedObject.name=victim")["items"]
    copies = [e for e in events if e["reason"] == "CopyRefused"]
    assert len(copies) >= 2 and all(e["type"] == "Warning" for e in copies), [e["reason"] for e in events]


async def test_a_run_claims_an_item_only_if_its_creator_may_update_it(
    release: Release, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script(MODEL, {"text": "should not run"})
    squad(release, model)
    calls_before = len(model.state.calls)
    owner = member(release, "item-owner")
    made = await items_cli(tmp_path, owner, "create", "LOCKED-1", "--title", "someone's item", "-n", NS)
    assert made.code == 0, made.err
    outsider = member(release, "runs-only", item_rights=False)
    run = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": "takes-locked", "namespace": NS},
        "spec": {"agents": ["api-agent"], "inputs": {"task": "x"}, "workItemRef": "LOCKED-1"},
    }
    created = as_user(release, outsider, "apply", "-f", "-", input=yaml.safe_dump(run))
    assert created.returncode == 0, created.stderr
    status = (await phase_of(release, "takes-locked", {"Failed", "Succeeded"}, timeout=120))["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidReferences"), status
    assert "may not update work item" in status["message"] and "LOCKED-1" in status["message"], status
    assert release.jobs_created("takes-locked") == [], "no sandbox was made, not even one deleted since"
    assert len(model.state.calls) == calls_before, "the model was not called"
    shown = await items_cli(tmp_path, owner, "get", "LOCKED-1", "-o", "json", "-n", NS)
    entries = json.loads(shown.out)["entries"]
    assert [e["kind"] for e in entries] == ["created"], "the item was not touched"


async def test_a_viewer_reads_no_answer(release: Release, model: ModelEndpoint, tmp_path: Path) -> None:
    model.script(MODEL, {"text": "THE-ANSWER-7f3"})
    squad(release, model)
    owner = member(release, "answer-owner")
    made = await items_cli(tmp_path, owner, "create", "ANSWERED-1", "--title", "a question", "-n", NS)
    assert made.code == 0, made.err
    start_run(release, "answered", "answer", workItemRef="ANSWERED-1")
    done = (await phase_of(release, "answered", {"Succeeded", "Failed"}, timeout=300))["status"]
    assert done["phase"] == "Succeeded", done
    release.kubectl("-n", NS, "create", "serviceaccount", "viewer")
    release.kubectl(
        "-n", NS, "create", "rolebinding", "viewer", "--clusterrole=view", f"--serviceaccount={NS}:viewer"
    )
    token = release.kubectl("-n", NS, "create", "token", "viewer", "--duration=1h").stdout.strip()
    viewer = release.cluster.token_kubeconfig("trust-viewer", token, NS)
    refusal = as_user(release, viewer, "get", "run", "answered", "-n", NS, "-o", "json")
    assert refusal.returncode != 0 and "forbidden" in refusal.stderr, "view reads no Run"
    for kind in ("configmaps", "events"):
        listed = as_user(release, viewer, "get", kind, "-n", NS, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        assert "THE-ANSWER-7f3" not in listed.stdout, f"the answer is in {kind} `view` reads"
    read = await ksquad(
        tmp_path,
        "runs",
        "artifacts",
        f"{NS}/answered",
        "answer",
        "--kubeconfig",
        str(viewer),
        "--api",
        API_URL,
    )
    assert read.code != 0 and "THE-ANSWER-7f3" not in read.out, read.out
    item = await items_cli(tmp_path, viewer, "get", "ANSWERED-1", "-o", "json", "-n", NS)
    assert item.code == 0, (
        item.err
    )  # view reads work items: their record says the Run finished, not what it said
    assert "THE-ANSWER-7f3" not in item.out, item.out
    encoded = base64.b64encode(b"THE-ANSWER-7f3").decode()
    assert encoded not in item.out
