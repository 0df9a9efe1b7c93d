"""A sandbox that dies while its agent works, on the real stack (a kubectl-applied Run, the bridge, the worker,
a cold gVisor Job on the node, the store and the scripted model): the worker sees the agent gone, fences the
claim, confirms the sandbox gone, releases, and retries in a new sandbox. And when the old sandbox will not go (a
finalizer holds its pod) or the API server refuses to delete it (an admission policy), the run fails closed:
Failed (TeardownFailed), no second attempt, its claim kept fenced."""

import asyncio
import json
from typing import Any

from kube import path
from store import Store, work_item_key
from testbed.agents import ModelEndpoint
from tests.crd_bridge.conftest import Stack, StackFactory
from tests.crd_bridge.test_bridge_e2e import in_order, run_doc, wait_for
from workflows.activity_types import Activity

HOLD = "test.ksquad.io/hold"  # a finalizer of the test's: the pod's object stays after its containers die


async def sandbox_pod(stack: Stack, run: str) -> dict[str, Any]:
    pods = await stack.kube.list(path("v1", "pods", stack.namespace), labels=f"ksquad.io/run={run}")
    (pod,) = pods["items"]
    found: dict[str, Any] = pod
    return found


async def claim_actions(stack: Stack, item: str) -> tuple[list[tuple[str, int]], tuple[str | None, int]]:
    store = await Store.open(stack.database_url, migrate=False)
    try:
        key = work_item_key(stack.namespace, item)
        history = [(h.action, h.fence) for h in await store.claim_history(key)]
        return history, await store.holder_of(key)
    finally:
        await store.close()


async def thinking_in_its_sandbox(stack: Stack, model: ModelEndpoint, run: str) -> dict[str, Any]:
    """Apply the Run `run` (with a work item `wi-<run>`), wait until its agent's model call is in flight, and
    return its sandbox pod."""
    stack.apply(*stack.resources(model), run_doc(run, workItemRef=f"wi-{run}"))
    await stack.wait_phase(run, {"Running"})
    await wait_for(lambda: model.state.in_flight == 1, "the agent's model call", within=120)
    return await sandbox_pod(stack, run)


def kill(stack: Stack, pod: dict[str, Any]) -> None:
    """What a node that dies or an OOM kill does to a pod: it goes at once, its agent with it."""
    stack.kubectl(
        "delete", "pod", pod["metadata"]["name"], "-n", stack.namespace, "--grace-period=0", "--force"
    )


async def failed_closed(stack: Stack, model: ModelEndpoint, run: str, why: str) -> None:
    """The run ended Failed (TeardownFailed) saying `why`, with no second attempt, its claim kept at a new fence."""
    final = await stack.wait_phase(run, {"Succeeded", "Failed"}, within=180)
    status = final["status"]
    assert status["phase"] == "Failed" and status["reason"] == "TeardownFailed", json.dumps(status)[:2000]
    assert why in status["message"], status["message"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Failed"]["status"], conditions["Failed"]["reason"]) == ("True", "TeardownFailed")
    stopped = conditions["AgentStopped"]  # the sandbox may still hold the agent: the Run says so
    assert (stopped["status"], stopped["reason"]) == ("False", "SandboxNotGone"), stopped
    assert why in stopped["message"] and f"{run}-exec-1" in stopped["message"], stopped["message"]
    assert status["attempt"] == 1, "no retry while the old sandbox may still act"
    assert len(model.state.calls) == 1
    # The claim stays with the failed run, fenced (again by its last teardown, which could not confirm the
    # sandbox gone either): no one holds it with the old fence, and no one takes it until its lease runs out.
    history, (holder, fence) = await claim_actions(stack, f"wi-{run}")
    assert history[0][0] == "claimed" and {a for a, _ in history[1:]} == {"fenced"}, history
    assert holder == final["metadata"]["uid"] and fence == history[-1][1] > history[0][1], (holder, history)


async def test_a_sandbox_pod_killed_mid_run_is_fenced_confirmed_gone_and_the_run_retries_in_a_new_one(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 600, "text": "never"}, {"text": "done in the second sandbox"})
    stack = await start_stack(gvisor=True)  # the default runtime: the kill is gVisor's
    first = await thinking_in_its_sandbox(stack, model, "fragile")
    first_job = first["metadata"]["labels"]["job-name"]
    kill(stack, first)

    run = await stack.wait_phase("fragile", {"Succeeded", "Failed"}, within=240)
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert status["attempt"] == 2 and status["retries"] == 1, status
    assert status["outputs"] == {"answer": "done in the second sandbox"}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Complete"]["status"] == "True" and "Failed" not in conditions
    # The bridge writes the status, then the run's event log: the log may be a moment behind.
    for _ in range(100):
        told = await stack.phase_log(run["metadata"]["uid"])
        if "Succeeded" in told:
            break
        await asyncio.sleep(0.1)
    assert in_order(told, ["Running", "RetryBackoff", "Claiming", "Running", "Succeeded"]), told
    # Fence, then release, then the new claim: the dead holder's fence is stale before anyone claims again.
    history, (holder, _) = await claim_actions(stack, "wi-fragile")
    actions = [action for action, _ in history]
    assert in_order(actions, ["claimed", "fenced", "released", "claimed", "released"]), history
    first_fence = history[0][1]
    retry_fence = history[actions.index("claimed", 1)][1]
    assert first_fence < history[actions.index("fenced")][1] < retry_fence, history
    assert holder is None, "released at the end"
    assert len(model.state.calls) == 2, "one call per attempt"
    # The dead attempt's Job was confirmed gone before the retry asked for a sandbox: in the workflow's history,
    # the first release_sandbox (it confirms) completed before the second acquire_sandbox was scheduled.
    steps = await activity_steps(stack, f"{stack.namespace}/fragile")
    released = steps.index(("completed", Activity.RELEASE_SANDBOX))
    acquired_again = [i for i, step in enumerate(steps) if step == ("scheduled", Activity.ACQUIRE_SANDBOX)][1]
    assert released < acquired_again, steps
    jobs = await stack.kube.list(path("batch/v1", "jobs", stack.namespace))
    assert first_job not in [j["metadata"]["name"] for j in jobs["items"]], jobs


async def activity_steps(stack: Stack, workflow_id: str) -> list[tuple[str, str]]:
    """("scheduled" | "completed", activity type) for each activity event of the workflow's history, in order."""
    names: dict[int, str] = {}
    steps = []
    async for event in stack.temporal.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            names[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            steps.append(("scheduled", names[event.event_id]))
        elif event.HasField("activity_task_completed_event_attributes"):
            steps.append(
                ("completed", names[event.activity_task_completed_event_attributes.scheduled_event_id])
            )
    return steps


async def test_a_sandbox_that_will_not_go_fails_the_run_closed_without_a_second_attempt(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 600, "text": "never"}, {"text": "must never be asked"})
    stack = await start_stack(bridge=False)
    stack.sandbox_settings["release_timeout_seconds"] = 10
    await stack.start("bridge")
    worker = stack.processes.pop("worker")  # started before the setting: start it again with it
    worker.terminate()
    worker.wait(20)
    await stack.start("worker")
    pod = await thinking_in_its_sandbox(stack, model, "stuck")
    name = pod["metadata"]["name"]
    stack.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        stack.namespace,
        "--type=merge",
        "-p",
        json.dumps({"metadata": {"finalizers": [HOLD]}}),
    )
    try:
        # Its containers die; its object stays (as a pod on a node that stopped answering does).
        stack.kubectl("delete", "pod", name, "-n", stack.namespace, "--wait=false")
        job = pod["metadata"]["labels"]["job-name"]
        await failed_closed(stack, model, "stuck", f"sandbox {stack.namespace}/{job} still exists after 10s")
    finally:
        stack.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            stack.namespace,
            "--type=merge",
            "-p",
            json.dumps({"metadata": {"finalizers": None}}),
        )


def refuse_job_deletes(namespace: str) -> list[dict[str, Any]]:
    """A ValidatingAdmissionPolicy, and its binding, by which the API server refuses every delete of a Job in
    `namespace` (as a cluster's own policy or a broken RBAC rule would)."""
    name = f"test-refuse-job-deletes-{namespace}"
    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["batch"],
                            "apiVersions": ["v1"],
                            "operations": ["DELETE"],
                            "resources": ["jobs"],
                        }
                    ]
                },
                "validations": [{"expression": "false", "message": "Job deletes are refused here (a test)"}],
            },
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        },
    ]


async def test_a_sandbox_whose_delete_the_api_server_refuses_fails_the_run_closed(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 600, "text": "never"}, {"text": "must never be asked"})
    stack = await start_stack()
    pod = await thinking_in_its_sandbox(stack, model, "undeletable")
    job = pod["metadata"]["labels"]["job-name"]
    policy = refuse_job_deletes(stack.namespace)
    stack.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": policy}))
    try:
        # A policy takes a moment to be enforced: until a dry run of the delete is refused.
        for _ in range(100):
            dry = stack.kubectl("delete", "job", job, "-n", stack.namespace, "--dry-run=server", check=False)
            if dry.returncode != 0:
                break
            await asyncio.sleep(0.2)
        assert "Job deletes are refused here" in dry.stderr, dry.stderr
        kill(stack, pod)
        await failed_closed(
            stack, model, "undeletable", f"the API server refused to delete sandbox {stack.namespace}/{job}"
        )
    finally:
        stack.kubectl(
            "delete", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": policy})
        )
