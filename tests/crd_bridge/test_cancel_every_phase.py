"""Cancel a Run from every phase that waits, and mid-call, by each of the three ways users cancel, on the real stack
(the API server, the bridge, the worker, the store, an A2A agent and the scripted model): `kubectl delete`, the
`ksquad.io/cancel-requested` annotation, and `temporal workflow cancel`. Pending, Queued, Claiming, a retry's
backoff, Running and Paused(Manual): each run shows Cancelling, then ends Cancelled, and leaves nothing behind: no
slot or place in its Project's queue, no claim on its work item. (Paused(RateLimited) by the cancel signal:
tests/faults/test_long_retry_after.py; a cancelled Run's sandbox deleted: test_bridge_e2e.py.)"""

import asyncio
import json
from collections.abc import Callable
from typing import Any

from temporalio.client import WorkflowExecutionStatus

from store import Store, work_item_key
from testbed.agents import AgentFactory, ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, Stack, StackFactory
from tests.crd_bridge.test_bridge_e2e import in_order
from tests.crd_bridge.test_bridge_resilience import remote_agent
from workflows.entity_types import GateState, gate_workflow_id, key_run

HOWS = ("kubectl-delete", "annotation", "temporal-cancel")
SHARED_ITEM = "wi-shared"  # the holder's work item: the Claiming runs wait for it


def run_doc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": RUN_API,
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {"agents": ["remote"], **spec},
    }


async def wait_until(stack: Stack, name: str, what: str, holds: Callable[[dict[str, Any]], bool]) -> None:
    status: dict[str, Any] = {}
    for _ in range(1200):
        status = (await stack.run(name)).get("status", {})
        if holds(status):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(
        f"{name} never {what}: {json.dumps(status)[:1500]}\nworker: {stack.log('worker')[-2000:]}"
    )


def waiting_for_references(status: dict[str, Any]) -> bool:
    conditions = {c["type"]: c for c in status.get("conditions", [])}
    resolved = conditions.get("ReferencesResolved", {})
    return status.get("phase") == "Pending" and resolved.get("status") == "False"


# name prefix -> (the Run's extra spec, how to tell it waits in that phase)
PHASES: dict[str, tuple[Callable[[str], dict[str, Any]], Callable[[dict[str, Any]], bool]]] = {
    "pending": (lambda how: {"agents": ["ghost"]}, waiting_for_references),
    "queued": (lambda how: {"projectRef": "slots"}, lambda s: s.get("phase") == "Queued"),
    "claiming": (lambda how: {"workItemRef": SHARED_ITEM}, lambda s: s.get("phase") == "Claiming"),
    "backoff": (
        lambda how: {
            "workItemRef": f"wi-backoff-{how}",
            "model": "broken-model",
            "retryPolicy": {"backoffSeconds": 3600, "maxBackoffSeconds": 3600},
        },
        lambda s: s.get("phase") == "Pending" and s.get("reason") == "RetryBackoff",
    ),
    # mid-call: the agent's model call in flight (its task cancelled with the workflow's)
    "running": (
        lambda how: {"model": "slow-model", "workItemRef": f"wi-running-{how}"},
        lambda s: s.get("phase") == "Running",
    ),
    # paused by its user (the pause annotation, set once it runs: PAUSED_BY_ANNOTATION)
    "paused": (
        lambda how: {"model": "slow-model", "workItemRef": f"wi-paused-{how}"},
        lambda s: s.get("phase") == "Paused" and s.get("pauseReason") == "Manual",
    ),
}
PAUSED_BY_ANNOTATION = "paused"


async def cancel(stack: Stack, name: str, how: str) -> None:
    if how == "kubectl-delete":
        await asyncio.to_thread(stack.kubectl, "delete", "run", name, "-n", stack.namespace, "--wait=false")
    elif how == "annotation":
        await asyncio.to_thread(
            stack.kubectl,
            "annotate",
            "run",
            name,
            "-n",
            stack.namespace,
            f"ksquad.io/cancel-requested=stop {name}",
        )
    else:
        await stack.temporal.get_workflow_handle(f"{stack.namespace}/{name}").cancel()


async def ended(stack: Stack, name: str, how: str) -> None:
    """Cancelled as its user sees it: the deleted Run gone once its workflow has ended; the others Cancelled."""
    handle = stack.temporal.get_workflow_handle(f"{stack.namespace}/{name}")
    for _ in range(1200):
        if how == "kubectl-delete":
            gone = stack.kubectl("get", "run", name, "-n", stack.namespace, check=False).returncode != 0
            if gone:
                break
        elif (await stack.run(name)).get("status", {}).get("phase") == "Cancelled":
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"{name} ({how}) never ended: {stack.log('worker')[-2000:]}")
    # The Cancelled status goes out (non-blocking) before the workflow's last steps (its slots given back, the
    # ending recorded on the item, the last status flushed): on a busy machine the workflow closes a moment later.
    for _ in range(300):
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    expected = (
        WorkflowExecutionStatus.CANCELED if how == "temporal-cancel" else WorkflowExecutionStatus.COMPLETED
    )
    assert description.status == expected, (name, description.status)
    final = await handle.query("state")
    assert final["phase"] == "Cancelled", (name, final)
    if how == "annotation":
        assert final["message"] == f"stop {name}"
    elif how == "kubectl-delete":
        assert final["message"].startswith("the Run was deleted"), final["message"]


def story(stack: Stack, name: str) -> list[str]:
    """The phases the Run's Events told, in the order of its status revisions (they outlive a deleted Run)."""
    events = json.loads(
        stack.kubectl(
            "get",
            "events",
            "-n",
            stack.namespace,
            "--field-selector",
            f"involvedObject.name={name}",
            "-o",
            "json",
        ).stdout
    )["items"]
    ordered = sorted(events, key=lambda e: int(e["metadata"]["annotations"]["ksquad.io/revision"]))
    return [e["reason"] for e in ordered]


async def test_a_run_cancelled_from_each_waiting_phase_each_way_shows_cancelling_and_leaves_nothing(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("slow-model", {"delay": 900, "text": "never"})
    model.script("broken-model", {"malformed": True})
    stack = await start_stack()
    await remote_agent(stack, model, start_agent)
    stack.apply(
        {
            "apiVersion": RUN_API,
            "kind": "Project",
            "metadata": {"name": "slots"},
            "spec": {"maxConcurrentRuns": 1},
        }
    )
    # The holder fills the Project's one slot and holds the shared work item while its model thinks.
    stack.apply(run_doc("holder", projectRef="slots", workItemRef=SHARED_ITEM, model="slow-model"))
    await stack.wait_phase("holder", {"Running"})
    names = {f"{phase}-{how}": (phase, how) for phase in PHASES for how in HOWS}
    stack.apply(*(run_doc(name, **PHASES[phase][0](how)) for name, (phase, how) in names.items()))
    pausing = [name for name, (phase, _) in names.items() if phase == PAUSED_BY_ANNOTATION]
    await asyncio.gather(
        *(wait_until(stack, n, "ran", lambda s: s.get("phase") == "Running") for n in pausing)
    )
    for name in pausing:
        stack.kubectl("annotate", "run", name, "-n", stack.namespace, "ksquad.io/pause-requested=hold on")
    await asyncio.gather(*(wait_until(stack, n, f"waited {p}", PHASES[p][1]) for n, (p, _) in names.items()))
    holder_uid = (await stack.run("holder"))["metadata"]["uid"]

    await asyncio.gather(*(cancel(stack, name, how) for name, (_, how) in names.items()))
    await asyncio.gather(*(ended(stack, name, how) for name, (_, how) in names.items()))

    for name in names:
        told = story(stack, name)
        assert in_order(told, ["Cancelling", "Cancelled"]), f"{name}: {told}"
    assert (await stack.run("holder"))["status"]["phase"] == "Running", "the holder went on"
    gate = await stack.temporal.get_workflow_handle(
        gate_workflow_id(f"project/{stack.namespace}/slots")
    ).query("state_query", result_type=GateState)
    assert [key_run(k)[0] for k in gate.holders] == [f"{stack.namespace}/holder"] and gate.waiting == [], gate
    store = await Store.open(stack.database_url, migrate=False)
    try:
        assert (await store.holder_of(work_item_key(stack.namespace, SHARED_ITEM)))[0] == holder_uid, (
            "the holder keeps its item"
        )
        for how in HOWS:
            for phase in ("backoff", "running", "paused"):
                item = work_item_key(stack.namespace, f"wi-{phase}-{how}")
                assert (await store.holder_of(item))[0] is None, f"{item} is released"
                actions = [h.action for h in await store.claim_history(item)]
                assert actions[-1] == "released", (item, actions)
    finally:
        await store.close()
    # No Job to look for: these Runs' agent is a running A2A endpoint (no sandbox); a cancelled sandbox is
    # deleted in test_bridge_e2e.py and tests/chart/test_install.py.
    await cancel(stack, "holder", "kubectl-delete")
    await ended(stack, "holder", "kubectl-delete")
    await wait_for_abandoned(model)


async def wait_for_abandoned(model: ModelEndpoint) -> None:
    """The holder's agent dropped its model call when its task was cancelled."""
    for _ in range(600):
        if model.state.abandoned >= 1:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the holder's model call was never dropped")
