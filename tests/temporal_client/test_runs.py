"""A Run's workflow, as the bridge and the embedded stack handle it (temporal_client.runs): started once per
Run with its envelope sealed, an earlier Run's of the same name told apart by the uid of its sealed envelope (never
by its memo, which any client writes), one started under the Run's id by someone else terminated, cancelled and
waited for. On the dev server: the time-skipping one cannot describe a workflow with ksquad's datetime search
attribute."""

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import WorkflowExecutionStatus

from dev.devserver import DevServer
from temporal_client.runs import EarlierRunStillRunning, RunWorkflows
from tests.workflows.world import World, hang, run_input, running_world_on
from workflows.activity_types import WORKER_TASK_QUEUE, Activity


@pytest.fixture
async def served(dev_server: DevServer) -> AsyncIterator[tuple[RunWorkflows, World]]:
    """The Runs' workflows on the dev server, and the world of fake activities they run against."""
    world = World()
    async with running_world_on(dev_server.target, world) as client:
        yield RunWorkflows(client, WORKER_TASK_QUEUE, world.sealer), world


@pytest.fixture
def ns() -> str:
    """A namespace of the test's own: workflow ids never collide on the shared server."""
    return f"t-{uuid.uuid4().hex[:8]}"


async def test_a_run_gets_one_workflow_and_waits_for_an_earlier_runs_to_end(
    served: tuple[RunWorkflows, World], ns: str
) -> None:
    workflows, world = served
    world.scripts["r"] = [hang()]
    assert await workflows.find(ns, "r", "uid-1") is None, "no workflow yet: one may start"

    first = await workflows.start(run_input("r", namespace=ns, uid="uid-1"))
    again = await workflows.start(run_input("r", namespace=ns, uid="uid-1"))
    assert again.result_run_id == first.result_run_id, "never a second workflow for one Run"
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    found = await workflows.find(ns, "r", "uid-1")
    assert found is not None and found.uid == "uid-1" and not found.closed

    with pytest.raises(EarlierRunStillRunning, match=f"earlier Run {ns}/r is still running"):
        await workflows.find(ns, "r", "uid-2")
    assert await workflows.cancel_and_wait(ns, "r", "uid-2", within=5), "another Run's: nothing to wait for"
    found = await workflows.find(ns, "r", "uid-1")
    assert found is not None and not found.closed, "and it is left running"

    assert await workflows.cancel_and_wait(ns, "r", "uid-1", within=30)
    ended = await workflows.find(ns, "r", "uid-1")
    assert ended is not None and ended.closed
    status = await ended.handle.result()
    assert (status.phase, status.message) == ("Cancelled", "the Run was deleted"), "the status says why"

    assert await workflows.find(ns, "r", "uid-2") is None, "the earlier Run's ended: the new one may start"
    second = await workflows.start(run_input("r", namespace=ns, uid="uid-2"))
    assert second.result_run_id != first.result_run_id
    found = await workflows.find(ns, "r", "uid-2")
    assert found is not None and found.uid == "uid-2"
    assert await workflows.cancel_and_wait(ns, "r", "uid-2", within=30)


async def test_cancel_and_wait_says_when_the_workflow_did_not_end_in_time(
    served: tuple[RunWorkflows, World], ns: str
) -> None:
    workflows, world = served
    world.scripts["r"] = [hang()]
    await workflows.start(run_input("r", namespace=ns, uid="uid-1"))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    assert not await workflows.cancel_and_wait(ns, "r", None, within=0)
    assert await workflows.cancel_and_wait(ns, "r", None, within=30), "whichever Run's, without a uid"
    ended = await workflows.find(ns, "r", "uid-1")
    assert ended is not None and ended.closed


async def test_a_runs_workflow_that_takes_no_cancel_is_asked_by_temporal_then_terminated(
    served: tuple[RunWorkflows, World], ns: str
) -> None:
    """Deleting a Run stops its workflow whatever became of the cancel signal: here no worker takes its tasks (a
    worker down, or its signals jammed). After `within`, Temporal's own cancel request; after `terminate_after`
    more, a termination saying why. A Run that took the cancel is left to tear down (the test above)."""
    workflows, world = served
    unpolled = RunWorkflows(workflows.client, "nobody-polls-this", world.sealer)
    await unpolled.start(run_input("r", namespace=ns, uid="uid-1"))
    assert await workflows.cancel_and_wait(ns, "r", "uid-1", within=1, terminate_after=1)
    found = await workflows.find(ns, "r", "uid-1")
    assert found is not None and found.status == WorkflowExecutionStatus.TERMINATED
    history = [e async for e in found.handle.fetch_history_events()]
    asked = [e for e in history if e.HasField("workflow_execution_cancel_requested_event_attributes")]
    assert len(asked) == 1, "Temporal's cancel request came before the termination"
    (ended,) = [e for e in history if e.HasField("workflow_execution_terminated_event_attributes")]
    why = ended.workflow_execution_terminated_event_attributes.reason
    assert why.startswith("the Run was deleted: it took neither the cancel signal in 1s"), why

    # Without `terminate_after` (as every caller did before): it only says that the workflow did not end.
    await unpolled.start(run_input("r", namespace=ns, uid="uid-2"))
    assert not await workflows.cancel_and_wait(ns, "r", "uid-2", within=1)
    still = await workflows.find(ns, "r", "uid-2")
    assert still is not None and not still.closed
    assert await workflows.cancel_and_wait(ns, "r", "uid-2", within=0, terminate_after=1)


async def test_a_workflow_started_under_a_runs_id_by_someone_else_keeps_no_run_from_starting(
    served: tuple[RunWorkflows, World], ns: str
) -> None:
    """A client of the namespace starts a workflow under the id a Run will have, its memo naming the Run's uid:
    it is not taken for the Run's own (its start input is no sealed envelope), it is terminated, and the Run's own
    starts. A sealed envelope of an earlier Run of that name, started again by someone, is waited out instead (the
    bridge refuses it anything, so it ends), unless it waits on a task queue no ksquad worker polls: there it
    would never end, and is terminated too."""
    workflows, world = served
    client = workflows.client
    squatter = await client.start_workflow(
        "RunWorkflow",
        run_input("r", namespace=ns, uid="uid-1"),  # unsealed, with the Run's own uid
        id=f"{ns}/r",
        task_queue="nobody-polls-this",
        memo={"uid": "uid-1"},
    )
    assert await workflows.find(ns, "r", "uid-1") is None, "not the Run's: terminated, the Run's may start"
    assert (await squatter.describe()).status == WorkflowExecutionStatus.TERMINATED
    world.scripts["r"] = [hang()]
    own = await workflows.start(run_input("r", namespace=ns, uid="uid-1"))
    found = await workflows.find(ns, "r", "uid-1")
    assert found is not None and found.chain == own.first_execution_run_id
    assert await workflows.cancel_and_wait(ns, "r", "uid-1", within=30)

    copy = await client.start_workflow(
        "RunWorkflow",
        world.sealer.seal_envelope(run_input("r", namespace=ns, uid="uid-1")),
        id=f"{ns}/r",
        task_queue="nobody-polls-this",
    )
    replaced = await workflows.find(ns, "r", "uid-1", chain=own.first_execution_run_id)
    assert replaced is not None and replaced.closed and replaced.replaced, (
        "the Run's own ended; this one is not it"
    )
    # A sealed envelope, another Run's to this Run: where no ksquad worker polls, it would never end. Terminated.
    assert await workflows.find(ns, "r", "uid-2") is None, "the re-created Run may start"
    assert (await copy.describe()).status == WorkflowExecutionStatus.TERMINATED
