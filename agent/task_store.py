"""The agent's task store: the a2a-sdk's in-memory store, forgetting each task an hour after it ended.

A sandbox agent serves one attempt and goes; an agent named by an Agent's `endpoint` lives for months and
serves every run sent to it, and the SDK's store keeps every task forever (18 KB each, measured over 10,000
runs). Ended tasks stay readable long enough for the orchestrator to read an outcome it missed (a worker
that restarted finds its task again within seconds to minutes); paused ones (input or a credential awaited)
stay until they end.
"""

import time

from a2a.server.context import ServerCallContext
from a2a.server.tasks import InMemoryTaskStore, TaskStore
from a2a.types import ListTasksRequest, ListTasksResponse, Task, TaskState

TASK_RETENTION_SECONDS = 3600.0
ENDED = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
}


class RetainingTaskStore(TaskStore):
    def __init__(self, retention_seconds: float = TASK_RETENTION_SECONDS) -> None:
        self.tasks = InMemoryTaskStore()
        self.retention_seconds = retention_seconds
        # task id -> (when it ended, the context it was saved with), oldest first
        self._ended: dict[str, tuple[float, ServerCallContext]] = {}

    async def save(self, task: Task, context: ServerCallContext) -> None:
        await self.tasks.save(task, context)
        self._ended.pop(task.id, None)
        now = time.monotonic()
        if task.status.state in ENDED:
            self._ended[task.id] = (now, context)
        while self._ended:
            task_id, (ended_at, saved_with) = next(iter(self._ended.items()))
            if now - ended_at <= self.retention_seconds:
                break
            del self._ended[task_id]
            await self.tasks.delete(task_id, saved_with)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self.tasks.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self.tasks.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._ended.pop(task_id, None)
        await self.tasks.delete(task_id, context)
