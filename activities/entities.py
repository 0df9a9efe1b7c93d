"""Activities that talk to Temporal itself on behalf of a workflow: messages to entity workflows.

A workflow cannot signal-with-start another workflow, and an entity (a credential's throttle, a concurrency
gate) must exist before it can be signalled, so runs send their messages through `signal_with_start`.
Gates use `find_closed_workflows` to free the slots of runs that were terminated without cleaning up.
"""

from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from workflows.activity_types import Activity, EntitySignal, WorkflowIds
from workflows.entity_types import THROTTLED_UNTIL_MEMO, CredentialState, GateState, ThrottleNotice


class EntityActivities:
    def __init__(self, client: Client, task_queue: str) -> None:
        self.client = client
        self.task_queue = task_queue

    @activity.defn(name=Activity.SIGNAL_WITH_START)
    async def signal_with_start(self, message: EntitySignal) -> ThrottleNotice | None:
        """Signal the entity, starting it if needed. A subscription to a credential that is limited right now
        answers with the limit, so the run pauses before its first call instead of after it."""
        # The entity's key is the workflow id's tail: "credential/<ns>/<secret>" -> "<ns>/<secret>".
        key = message.workflow_id.split("/", 1)[1]
        state = CredentialState(key=key) if message.workflow == "CredentialThrottle" else GateState(scope=key)
        handle = await self.client.start_workflow(
            message.workflow,
            state,
            id=message.workflow_id,
            task_queue=self.task_queue,
            start_signal=message.signal,
            start_signal_args=[message.arg],
        )
        if message.workflow != "CredentialThrottle" or message.signal != "subscribe":
            return None
        description = await handle.describe()
        until = await description.memo_value(THROTTLED_UNTIL_MEMO, None)
        if until is None or datetime.fromisoformat(str(until)) <= datetime.now(UTC):
            return None
        strikes = int(await description.memo_value("strikes", 1))
        return ThrottleNotice(key=key, until=datetime.fromisoformat(str(until)), strikes=strikes)

    @activity.defn(name=Activity.FIND_CLOSED_WORKFLOWS)
    async def find_closed_workflows(self, ids: WorkflowIds) -> list[str]:
        closed = []
        for workflow_id in ids.ids:
            try:
                description = await self.client.get_workflow_handle(workflow_id).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    closed.append(workflow_id)
                    continue
                raise
            if description.status != WorkflowExecutionStatus.RUNNING:
                closed.append(workflow_id)
        return closed
