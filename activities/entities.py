"""Activities that talk to Temporal itself on behalf of a workflow: messages to entity workflows.

A workflow cannot signal-with-start another workflow, and an entity (a credential's throttle, a concurrency
gate) must exist before it can be signalled, so runs send their messages through `signal_with_start` (a local activity of the run's own worker: two
short RPCs, not worth a task the server dispatches).
Gates use `find_closed_workflows` to free the slots of runs that were terminated without cleaning up. Runs
paused by a rate limit take their place in the ramp after it from `reserve_resume_place`.
"""

import hashlib
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.claims import as_activity_error
from store import Store, StoreError
from workflows.activity_types import Activity, EntitySignal, WorkflowIds
from workflows.entity_types import (
    THROTTLED_UNTIL_MEMO,
    CredentialLimit,
    CredentialState,
    GateState,
    ResumePlaceRequest,
    ThrottleNotice,
)


class EntityActivities:
    """With a `store`, a credential's limits are also kept there: the run that got a 429 writes it before it tells
    the throttle, and a subscribing run reads it there at once. Without one (tests of the workflows alone), a
    subscriber reads the throttle's memo, which lags behind its signals by the throttle's next workflow task."""

    def __init__(self, client: Client, task_queue: str, store: Store | None = None) -> None:
        self.client = client
        self.task_queue = task_queue
        self.store = store

    @activity.defn(name=Activity.SIGNAL_WITH_START)
    async def signal_with_start(self, message: EntitySignal) -> ThrottleNotice | None:
        """Signal the entity, starting it if needed. A subscription to a credential that is limited right now
        answers with the limit, so the run pauses before its first call instead of after it."""
        # The entity's key is the workflow id's tail: "credential/<ns>/<secret>" -> "<ns>/<secret>".
        key = message.workflow_id.split("/", 1)[1]
        state = CredentialState(key=key) if message.workflow == "CredentialThrottle" else GateState(scope=key)
        throttle = message.workflow == "CredentialThrottle"
        if throttle and self.store is not None and message.signal in ("limited", "cleared"):
            await self._record(key, message)
        notice = None
        if throttle and message.signal == "subscribe":
            notice = await (
                self._stored_limit(key)
                if self.store is not None
                else self._current_limit(message.workflow_id, key)
            )
        arg = message.arg
        if notice is not None:  # the throttle need not signal back what the subscriber already knows
            arg = {**arg, "knownUntil": notice.until.isoformat()}
        await self.client.start_workflow(
            message.workflow,
            state,
            id=message.workflow_id,
            task_queue=self.task_queue,
            start_signal=message.signal,
            start_signal_args=[arg],
        )
        return notice

    async def _record(self, key: str, message: EntitySignal) -> None:
        """A 429 or a success on the credential, into the store before the throttle hears of it."""
        assert self.store is not None
        try:
            if message.signal == "limited":
                limit = CredentialLimit.model_validate(message.arg)
                await self.store.record_credential_limit(key, limit.until)
            else:
                await self.store.clear_credential_strikes(key)
        except StoreError as err:
            raise as_activity_error(err) from None

    async def _stored_limit(self, key: str) -> ThrottleNotice | None:
        """The credential's limit in the store, if it is limited now. Read before subscribing, as the memo is."""
        assert self.store is not None
        try:
            limit = await self.store.credential_limit(key)
        except StoreError as err:
            raise as_activity_error(err) from None
        if limit is None or limit[0] <= datetime.now(UTC):
            return None
        return ThrottleNotice(key=key, until=limit[0], strikes=limit[1])

    async def _current_limit(self, workflow_id: str, key: str) -> ThrottleNotice | None:
        """The limit in the throttle's memo, if it is running and limited now. Read before subscribing: a limit
        set after this read reaches the subscriber as a signal (its subscription names what it knew)."""
        try:
            description = await self.client.get_workflow_handle(workflow_id).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        if description.status != WorkflowExecutionStatus.RUNNING:
            return None
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


class ResumePlaces:
    """Places in the ramp after a rate limit, handed out by the store (one counter per credential and limit):
    unique and in order across every worker, whatever the throttle workflow is busy with."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=Activity.RESERVE_RESUME_PLACE)
    async def reserve_resume_place(self, req: ResumePlaceRequest) -> datetime:
        digest = hashlib.sha256(f"{req.key}@{req.until.isoformat()}".encode()).hexdigest()[:40]
        try:
            place = await self.store.next_in_line(f"resume:{digest}")
        except StoreError as err:
            raise as_activity_error(err) from None
        return req.until + timedelta(seconds=(place - 1) / req.resume_per_second)
