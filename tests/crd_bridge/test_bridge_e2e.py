"""kubectl apply a Run and watch it run: the bridge and the worker as the chart deploys them, end to end on
the real control plane."""

import asyncio
import json
from pathlib import Path
from typing import Any

import yaml

from kube import path
from testbed.agents import ROTATED_MODEL_KEY, ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, StackFactory
from tests.support.dev import ksquad
from workflows import search_attributes as sa

SEED = Path(__file__).parents[2] / "examples" / "fix-flaky-tests.yaml"


async def watch_phases(stack: Any, name: str, until: set[str], within: float = 120) -> list[str]:
    """Every phase the Run's status showed, in order, until one of `until`."""
    seen: list[str] = []
    for _ in range(int(within / 0.05)):
        try:
            run = await stack.run(name)
        except Exception:
            run = {}
        phase = run.get("status", {}).get("phase")
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        if phase in until:
            return seen
        await asyncio.sleep(0.05)
    raise AssertionError(
        f"{name}: phases {seen}, never {until}\n{stack.log('bridge')[-3000:]}\n{stack.log('worker')[-3000:]}"
    )


def in_order(seen: list[str], expected: list[str]) -> bool:
    position = 0
    for phase in seen:
        if position < len(expected) and phase == expected[position]:
            position += 1
    return position == len(expected)


async def test_the_seed_run_applied_with_kubectl_runs_to_succeeded_and_events_tell_the_story(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    # The seed's Run in a namespace of this test's own (ksquad-system belongs to tests/chart/, which applies the
    # file byte for byte on the installed chart).
    model.script("dev-model", {"delay": 1, "text": "Stabilized the payment-retry test."})
    stack = await start_stack()
    ns = stack.namespace
    stack.apply(
        *stack.resources(model),
        {
            "apiVersion": RUN_API,
            "kind": "Team",
            "metadata": {"name": "payments-squad"},
            "spec": {"agents": ["dev-1"]},
        },
        {"apiVersion": RUN_API, "kind": "Project", "metadata": {"name": "payments-api"}, "spec": {}},
    )
    seed = yaml.safe_load(SEED.read_text())
    seed["metadata"]["namespace"] = ns
    sandboxes: dict[str, dict[str, Any]] = {}  # uid -> each Job and Pod of the Run seen while it lived

    async def keep_sandboxes() -> None:
        while True:
            for kind in ("pods", "jobs"):
                group = "v1" if kind == "pods" else "batch/v1"
                listed = await stack.kube.list(path(group, kind, ns), labels="ksquad.io/run=fix-flaky-tests")
                sandboxes.update({o["metadata"]["uid"]: {**o, "kind": kind} for o in listed["items"]})
            await asyncio.sleep(0.2)

    keeping = asyncio.create_task(keep_sandboxes())
    stack.apply(seed)
    try:
        seen = await watch_phases(stack, "fix-flaky-tests", {"Succeeded", "Failed"})
    finally:
        keeping.cancel()
    run = await stack.run("fix-flaky-tests")
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert in_order(seen, ["Pending", "Claiming", "Running", "Succeeded"]), seen
    assert status["outputs"] == {"answer": "Stabilized the payment-retry test."}
    assert status["workItem"]["ref"] == "wi-8123"
    assert status["workItem"]["item"] is False, "no work item of that id: the ref is a lock key, and says so"
    assert status["observedGeneration"] == run["metadata"]["generation"]
    assert status["triggeredBy"] == "ksquad-test-admin", "stamped at admission: the user who applied it"
    assert run["metadata"]["annotations"]["ksquad.io/triggered-by"] == "ksquad-test-admin"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Complete"] == "True" and "Failed" not in conditions

    table = stack.kubectl("get", "runs", "-n", ns, "fix-flaky-tests", "--no-headers").stdout.split()
    assert table[1:4] == ["Succeeded", "dev-1", "1"]
    events = json.loads(
        stack.kubectl(
            "get", "events", "-n", ns, "--field-selector", "involvedObject.name=fix-flaky-tests", "-o", "json"
        ).stdout
    )["items"]
    story = [
        e["reason"] for e in sorted(events, key=lambda e: e["metadata"]["annotations"]["ksquad.io/revision"])
    ]
    assert in_order(story, ["Created", "Claiming", "Running", "Succeeded"]), story
    configmaps = await stack.kube.list(path("v1", "configmaps", ns))
    assert configmaps["items"], "the namespace's ConfigMaps are listed (its kube-root-ca.crt at least)"
    assert not [c["metadata"]["name"] for c in configmaps["items"] if "Stabilized" in json.dumps(c)], (
        "the answer is the Run's (status, artifacts), in no ConfigMap `view` reads"
    )

    description = await stack.temporal.get_workflow_handle(f"{ns}/fix-flaky-tests").describe()
    assert description.search_attributes[sa.TRIGGERED_BY.name] == ["ksquad-test-admin"]
    assert description.search_attributes[sa.PHASE.name] == ["Succeeded"]
    assert {o["kind"] for o in sandboxes.values()} == {"jobs", "pods"}, "the sandbox was seen while it lived"
    for sandbox in sandboxes.values():
        assert "ksquad-test-admin" not in json.dumps(sandbox["spec"]), (
            "the sandbox never gets the user's identity"
        )
    stack.kubectl("delete", "runs", "--all", "-n", ns, "--wait=true", "--timeout=60s")


def run_doc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": RUN_API,
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {"agents": ["dev-1"], **spec},
    }


async def test_kubectl_delete_of_a_running_run_ends_cancelled_with_its_sandbox_gone(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 120, "text": "never"})
    stack = await start_stack()
    stack.apply(*stack.resources(model), run_doc("doomed"))
    await stack.wait_phase("doomed", {"Running"})
    await wait_for(lambda: model.state.in_flight == 1, "the agent's model call")
    running = await stack.kube.list(path("batch/v1", "jobs", stack.namespace))
    assert running["items"], "the sandbox's Job is there while the Run runs (where the check below looks)"
    stack.kubectl("delete", "run", "doomed", "-n", stack.namespace, "--wait=true", "--timeout=60s")
    assert stack.kubectl("get", "run", "doomed", "-n", stack.namespace, check=False).returncode != 0, (
        "finalizer removed"
    )
    final = await stack.temporal.get_workflow_handle(f"{stack.namespace}/doomed").query("state")
    assert final["phase"] == "Cancelled"
    assert final["message"].startswith("the Run was deleted"), final[
        "message"
    ]  # not "cancelled through Temporal"
    # The agent drops its model call when its task is cancelled; the model sees the hang-up on its next check.
    await wait_for(lambda: model.state.abandoned == 1, "the agent to stop its model call", within=30)
    jobs = await stack.kube.list(path("batch/v1", "jobs", stack.namespace))
    assert not jobs["items"], "the sandbox is gone"


async def test_the_cancel_annotation_cancels_without_deleting(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 120, "text": "never"})
    stack = await start_stack()
    stack.apply(*stack.resources(model), run_doc("stop-me"))
    await stack.wait_phase("stop-me", {"Running"})
    running = await stack.kube.list(path("batch/v1", "jobs", stack.namespace))
    assert running["items"], "the sandbox's Job is there while the Run runs (where the check below looks)"
    stack.kubectl(
        "annotate", "run", "stop-me", "-n", stack.namespace, "ksquad.io/cancel-requested=no longer needed"
    )
    run = await stack.wait_phase("stop-me", {"Cancelled"})
    assert run["status"]["message"] == "no longer needed"
    assert "ksquad.io/workflow" in run["metadata"]["finalizers"], "still there, still ours"
    for _ in range(100):
        if not (await stack.kube.list(path("batch/v1", "jobs", stack.namespace)))["items"]:
            break
        await asyncio.sleep(0.2)
    assert not (await stack.kube.list(path("batch/v1", "jobs", stack.namespace)))["items"]


async def test_a_run_whose_agent_appears_later_waits_with_the_condition_then_runs(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"text": "done late"})
    stack = await start_stack()
    secret, endpoint, agent = stack.resources(model)
    stack.apply(secret, endpoint, run_doc("early"))
    run = await stack.wait_phase("early", {"Pending"})
    for _ in range(100):
        run = await stack.run("early")
        conditions = {c["type"]: c for c in run.get("status", {}).get("conditions", [])}
        if "ReferencesResolved" in conditions:
            break
        await asyncio.sleep(0.1)
    condition = conditions["ReferencesResolved"]
    assert condition["status"] == "False"
    assert f"Agent {stack.namespace}/dev-1" in condition["message"]
    await asyncio.sleep(10)  # the Agent arrives ten seconds later
    assert (await stack.run("early"))["status"]["phase"] == "Pending", "it waited"
    stack.apply(agent)
    run = await stack.wait_phase("early", {"Succeeded", "Failed"}, within=120)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    resolved = {c["type"]: c for c in run["status"]["conditions"]}["ReferencesResolved"]
    assert resolved["status"] == "True"


async def test_a_rotated_credential_resumes_a_run_paused_on_it(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"text": "works with the new key", "expect_key": ROTATED_MODEL_KEY})
    stack = await start_stack()
    stack.apply(*stack.resources(model), run_doc("rotate"))
    run = await stack.wait_phase("rotate", {"Paused"})
    assert run["status"]["pauseReason"] == "CredentialExpired"
    stack.kubectl(
        "patch",
        "secret",
        "model-key",
        "-n",
        stack.namespace,
        "--type=merge",
        "-p",
        json.dumps({"stringData": {"apiKey": ROTATED_MODEL_KEY}}),
    )
    run = await stack.wait_phase("rotate", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["attempt"] == 1, "the same attempt went on: the task continued"


async def wait_for(predicate: Any, what: str, within: float = 60) -> None:
    for _ in range(int(within / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


async def test_the_ksquad_cli_applies_lists_pauses_resumes_and_cancels_runs_on_a_cluster(
    start_stack: StackFactory, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"delay": 120, "text": "never"})
    stack = await start_stack()
    stack.apply(*stack.resources(model))
    manifest = tmp_path / "run.yaml"
    manifest.write_text(
        json.dumps({**run_doc("cli-run"), "metadata": {"name": "cli-run", "namespace": stack.namespace}})
    )
    on_cluster = ("--kubeconfig", str(stack.cluster.admin_kubeconfig))

    applied = await ksquad(tmp_path, "run", "-f", str(manifest), *on_cluster, "-o", "json")
    assert applied.code == 0, applied.err
    assert applied.json()["applied"] == [
        {"kind": "Run", "namespace": stack.namespace, "name": "cli-run", "action": "created"}
    ]
    await stack.wait_phase("cli-run", {"Running"})
    listed = await ksquad(tmp_path, "runs", "list", "-n", stack.namespace, *on_cluster, "-o", "json")
    assert [i["metadata"]["name"] for i in listed.json()["items"]] == ["cli-run"]

    assert (await ksquad(tmp_path, "runs", "pause", f"{stack.namespace}/cli-run", *on_cluster)).code == 0
    await stack.wait_phase("cli-run", {"Paused"})
    assert (await ksquad(tmp_path, "runs", "resume", f"{stack.namespace}/cli-run", *on_cluster)).code == 0
    run = await stack.wait_phase("cli-run", {"Running"})
    assert run["status"]["attempt"] == 2
    cancelled = await ksquad(
        tmp_path, "runs", "cancel", f"{stack.namespace}/cli-run", "--reason", "done here", *on_cluster
    )
    assert cancelled.code == 0, cancelled.err
    run = await stack.wait_phase("cli-run", {"Cancelled"})
    assert run["status"]["message"] == "done here"
    got = await ksquad(tmp_path, "runs", "get", f"{stack.namespace}/cli-run", *on_cluster, "-o", "json")
    assert got.json()["status"]["phase"] == "Cancelled"

    unknown = await ksquad(tmp_path, "runs", "get", f"{stack.namespace}/nope", *on_cluster)
    assert unknown.code == 1 and unknown.err.strip() == f'Error: run "{stack.namespace}/nope" not found'


async def test_ksquad_runs_input_on_a_cluster_answers_a_run_paused_for_input_once(
    start_stack: StackFactory, model: ModelEndpoint, tmp_path: Path
) -> None:
    question = {"name": "ksquad_request_input", "arguments": {"question": "Which test is flaky?"}}
    model.script("dev-model", {"tool_calls": [question]}, {"text": "fixed test_payment_retry"})
    stack = await start_stack()
    stack.apply(*stack.resources(model), run_doc("asked"))
    on_cluster = ("--kubeconfig", str(stack.cluster.admin_kubeconfig))
    # Before the question, an answer is refused: it could only be a guess at a question not yet asked.
    early = await ksquad(tmp_path, "runs", "input", f"{stack.namespace}/asked", "too soon", *on_cluster)
    assert early.code == 1 and "is not waiting for input" in early.err, early.err

    run = await stack.wait_phase("asked", {"Paused"})
    assert (run["status"]["pauseReason"], run["status"]["message"]) == (
        "InputRequired",
        "Which test is flaky?",
    )
    given = await ksquad(
        tmp_path, "runs", "input", f"{stack.namespace}/asked", "test_payment_retry", *on_cluster
    )
    assert given.code == 0, given.err
    run = await stack.wait_phase("asked", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert (run["status"]["attempt"], run["status"]["message"]) == (1, "fixed test_payment_retry")
    # The bridge removed the annotation once it was sent, so no later question gets this answer.
    assert "ksquad.io/input" not in (await stack.run("asked"))["metadata"].get("annotations", {})
    # One task went on: the model was asked twice (the question, then with the answer as the tool's result).
    calls = [c for c in model.state.calls if c.model == "dev-model"]
    assert len(calls) == 2 and calls[1].messages > calls[0].messages, calls
