"""A Run's workflow, as the bridge and the embedded stack handle it (temporal_client.runs): started once per
Run, an earlier Run's of the same name told apart by the uid in its memo, cancelled and waited for. On the dev
server: the time-skipping one cannot describe a workflow with ksquad's datetime search attribute."""

import uuid
from collections.abc import AsyncIterator

import pytest

from dev.devserver import DevServer
from temporal_client.runs import EarlierRunStillRunning, RunWorkflows
from tests.workflows.world import World, hang, run_input, running_world_on
from workflows.activity_types import WORKER_TASK_QUEUE, Activity


@pytest.fixture
async def served(dev_server: DevServer) -> AsyncIterator[tuple[RunWorkflows, World]]:
    """The Runs' workflows on the dev server, and the world of fake activities they run against."""
    world = World()
    async with running_world_on(dev_server.target, world) as client:
        yield RunWorkflows(client, WORKER_TASK_QUEUE), world


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
