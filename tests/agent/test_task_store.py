"""The reference agent's task store forgets ended tasks after its retention, never paused or working ones."""

from a2a.server.context import ServerCallContext
from a2a.types import ListTasksRequest, Task, TaskState, TaskStatus

from agent.task_store import RetainingTaskStore


def task(task_id: str, state: TaskState) -> Task:
    return Task(id=task_id, context_id=f"ctx-{task_id}", status=TaskStatus(state=state))


async def test_ended_tasks_are_forgotten_after_the_retention_paused_and_working_ones_are_kept() -> None:
    context = ServerCallContext()
    store = RetainingTaskStore(retention_seconds=0.0)
    await store.save(task("working", TaskState.TASK_STATE_WORKING), context)
    await store.save(task("paused", TaskState.TASK_STATE_INPUT_REQUIRED), context)
    ended = {
        "completed": TaskState.TASK_STATE_COMPLETED,
        "failed": TaskState.TASK_STATE_FAILED,
        "canceled": TaskState.TASK_STATE_CANCELED,
    }
    for task_id, state in ended.items():
        await store.save(task(task_id, state), context)
    await store.save(task("working", TaskState.TASK_STATE_WORKING), context)  # any later save sweeps
    listed = await store.list(ListTasksRequest(), context)
    assert sorted(t.id for t in listed.tasks) == ["paused", "working"]
    assert await store.get("completed", context) is None


async def test_an_ended_task_stays_readable_within_the_retention() -> None:
    context = ServerCallContext()
    store = RetainingTaskStore(retention_seconds=3600.0)
    await store.save(task("done", TaskState.TASK_STATE_COMPLETED), context)
    for i in range(100):
        await store.save(task(f"next-{i}", TaskState.TASK_STATE_COMPLETED), context)
    got = await store.get("done", context)
    assert got is not None and got.status.state == TaskState.TASK_STATE_COMPLETED
