"""Activities that talk to Temporal itself on behalf of a workflow: messages to entity workflows.

A workflow cannot signal-with-start another workflow, and an entity (a credential's throttle, a concurrency
gate) must exist before it can be signalled, so runs send their messages through `signal_with_start` (a local
activity of the run's own worker: two short RPCs, not worth a task the server dispatches). With a store, a
run's subscription to a credential is a row there and needs no RPC at all; a limit is announced to those rows by
the credential's announcer (`announce_credential_limit`).
Gates use `find_closed_workflows` to free the slots of runs that were terminated without cleaning up. Runs
paused by a rate limit take their place in the ramp after it from `reserve_resume_place`.
"""

import asyncio
import contextlib
import hashlib
import logging
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.claims import store_errors_as_activity_errors
from activities.metrics import ENTITY_IMPOSTORS
from store import Store
from workflows.activity_types import Activity, EntitySignal, WorkflowIds
from workflows.entity_types import (
    CREDENTIAL_THROTTLED,
    THROTTLED_UNTIL_MEMO,
    AnnouncerState,
    CredentialLimit,
    CredentialState,
    GateState,
    LimitAnnouncement,
    ResumePlaceRequest,
    ThrottleNotice,
    credential_announcer_id,
)
from workflows.model import KsquadModel

log = logging.getLogger(__name__)
SUBSCRIBERS_PAGE = 1000  # subscribers read and signalled at a time by an announcement
# Entity runs found to be ksquad's own, remembered (each is checked once: one describe, one history page).
MAX_OWNED_REMEMBERED = 10_000
# An impostor under an entity's id is terminated and the signal sent again; this many in a row and it gives up.
IMPOSTORS_IN_A_ROW = 3
SIGNALS_IN_FLIGHT = 50  # concurrent signals of an announcement


class EntityActivities:
    """With a `store`, a credential's limits and subscribers are kept there: a run subscribes with a row and reads
    the limit in force at once; the run that gets a 429 writes it there before it tells the credential's announcer,
    which tells the subscribers. Without one (tests of the workflows alone), runs subscribe to the credential's
    throttle workflow, and a subscriber reads its memo, which lags behind its signals by the throttle's next
    workflow task."""

    def __init__(
        self,
        client: Client,
        task_queue: str,
        store: Store | None = None,
        subscribers_page: int = SUBSCRIBERS_PAGE,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.store = store
        self.subscribers_page = subscribers_page
        self._owned: set[tuple[str, str]] = (
            set()
        )  # (workflow id, run id) of entity runs checked to be ksquad's

    @activity.defn(name=Activity.SIGNAL_WITH_START)
    async def signal_with_start(self, message: EntitySignal) -> ThrottleNotice | None:
        """Signal the entity, starting it if needed. A subscription to a credential that is limited right now
        answers with the limit, so the run pauses before its first call instead of after it."""
        # The entity's key is the workflow id's tail: "credential/<ns>/<secret>" -> "<ns>/<secret>".
        key = message.workflow_id.split("/", 1)[1]
        if message.workflow == "ConcurrencyGate":
            await self._start(
                message.workflow, message.workflow_id, GateState(scope=key), message.signal, message.arg
            )
            return None
        if self.store is not None:
            if message.signal == "subscribe":
                return await self._subscribe_in_store(key, str(message.arg["runId"]))
            # A subscription the store does not hold was made with the throttle workflow (by a worker before it
            # had a store): the throttle is told of its end instead.
            if message.signal == "unsubscribe" and await self._unsubscribe_in_store(
                key, str(message.arg["runId"])
            ):
                return None
            if message.signal in ("limited", "cleared"):
                await self._record(key, message)
            if message.signal == "limited":
                announcer = credential_announcer_id(key)
                await self._start(
                    "CredentialAnnouncer", announcer, AnnouncerState(key=key), "limited", message.arg
                )
            # The throttle workflow still hears of limits and successes: it tells the runs that subscribed to it
            # before their worker had a store.
        notice = None
        arg = message.arg
        if message.signal == "subscribe":  # no store: the limit in the throttle's memo
            notice = await self._current_limit(message.workflow_id, key)
            if notice is not None:  # the throttle need not signal back what the subscriber already knows
                arg = {**arg, "knownUntil": notice.until.isoformat()}
        await self._start(
            message.workflow, message.workflow_id, CredentialState(key=key), message.signal, arg
        )
        return notice

    async def _start(
        self, workflow: str, workflow_id: str, state: KsquadModel, signal: str, arg: dict[str, object]
    ) -> None:
        """Signal-with-start: `state` is the entity's input if this starts it. The workflow that took the signal
        must be ksquad's own (`_impostor`): one started by someone else under the entity's id is terminated, and
        the signal sent again, which starts ksquad's."""
        for _ in range(IMPOSTORS_IN_A_ROW + 1):
            handle = await self.client.start_workflow(
                workflow,
                state,
                id=workflow_id,
                task_queue=self.task_queue,
                start_signal=signal,
                start_signal_args=[arg],
            )
            run_id = handle.result_run_id or ""
            why = await self._impostor(workflow, workflow_id, run_id, type(state))
            if why is None:
                return
            log.warning(
                "terminated workflow %s run %s, not ksquad's %s: %s", workflow_id, run_id, workflow, why
            )
            ENTITY_IMPOSTORS.labels(workflow).inc()
            with contextlib.suppress(RPCError):  # that run only: never one started since
                await self.client.get_workflow_handle(workflow_id, run_id=run_id).terminate(
                    reason=f"not ksquad's {workflow}: {why}"
                )
        raise ApplicationError(f"workflow {workflow_id} is started again by someone else each time: {why}")

    async def _impostor(
        self, workflow: str, workflow_id: str, run_id: str, state_type: type[KsquadModel]
    ) -> str | None:
        """Why the run `run_id` under an entity's id is not ksquad's own, or None: its type, its task queue (no
        ksquad worker polls another) and its start input (one this worker cannot read as the entity's state never
        runs: a payload in clear, say) are checked once per run and remembered."""
        if (workflow_id, run_id) in self._owned:
            return None
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
        try:
            description = await handle.describe()
            if description.workflow_type != workflow:
                return f"of type {description.workflow_type}"
            if description.task_queue != self.task_queue:
                return f"on task queue {description.task_queue}, which no ksquad worker polls"
            async for event in handle.fetch_history_events():
                started = event.workflow_execution_started_event_attributes
                try:
                    await self.client.data_converter.decode(started.input.payloads, [state_type])
                except Exception as err:  # whatever the codec or the converter makes of someone's bytes
                    return (
                        f"its input is no {state_type.__name__} this worker can read ({type(err).__name__})"
                    )
                break
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None  # gone since (ended, or continued as new): the signal was taken or is the next's
            raise
        if len(self._owned) >= MAX_OWNED_REMEMBERED:
            self._owned.clear()
        self._owned.add((workflow_id, run_id))
        return None

    async def _subscribe_in_store(self, key: str, run_id: str) -> ThrottleNotice | None:
        """The run is told of limits on `key` from now on; returns the limit in force, if any."""
        assert self.store is not None
        with store_errors_as_activity_errors():
            # The row first, the limit after it: a limit written after this read finds the row when it is
            # announced (announce_credential_limit reads the subscribers after the limit was written).
            await self.store.subscribe_to_credential(key, run_id)
        return await self._stored_limit(key)

    async def _unsubscribe_in_store(self, key: str, run_id: str) -> bool:
        """Forget the run's subscription in the store; False: the store held none."""
        assert self.store is not None
        with store_errors_as_activity_errors():
            return await self.store.unsubscribe_from_credential(key, [run_id]) > 0

    async def _record(self, key: str, message: EntitySignal) -> None:
        """A 429 or a success on the credential, into the store before the throttle hears of it."""
        assert self.store is not None
        with store_errors_as_activity_errors():
            if message.signal == "limited":
                limit = CredentialLimit.model_validate(message.arg)
                await self.store.record_credential_limit(key, limit.until)
            else:
                await self.store.clear_credential_strikes(key)

    async def _stored_limit(self, key: str) -> ThrottleNotice | None:
        """The credential's limit in the store, if it is limited now. Read before subscribing, as the memo is."""
        assert self.store is not None
        with store_errors_as_activity_errors():
            limit = await self.store.credential_limit(key)
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

    @activity.defn(name=Activity.ANNOUNCE_CREDENTIAL_LIMIT)
    async def announce_credential_limit(self, announcement: LimitAnnouncement) -> int:
        """Signal the credential's limit in the store to every run subscribed to it there, a page at a time
        (a retry goes on from the last page it heartbeated); forget the runs that are gone. Returns how many
        runs were subscribed."""
        if self.store is None:
            return 0
        key = announcement.key
        with store_errors_as_activity_errors():
            limit = await self.store.credential_limit(key)
        if limit is None or limit[0] <= datetime.now(UTC):
            return 0  # over before it could be announced: nothing to stop
        notice = ThrottleNotice(key=key, until=limit[0], strikes=limit[1])
        knowing = {r.run_id for r in announcement.reporters if r.until >= notice.until}
        details = activity.info().heartbeat_details
        after, subscribed = (str(details[0]), int(details[1])) if details else ("", 0)
        in_flight = asyncio.Semaphore(SIGNALS_IN_FLIGHT)

        async def tell(workflow_id: str) -> str | None:
            async with in_flight:
                try:
                    await self.client.get_workflow_handle(workflow_id).signal(CREDENTIAL_THROTTLED, notice)
                except RPCError as err:
                    if err.status == RPCStatusCode.NOT_FOUND:  # closed without unsubscribing (terminated)
                        return workflow_id
                    raise
            return None

        while True:
            with store_errors_as_activity_errors():
                page = await self.store.credential_subscribers(key, after=after, limit=self.subscribers_page)
            gone = await asyncio.gather(*(tell(w) for w in page if w not in knowing))
            with store_errors_as_activity_errors():
                await self.store.unsubscribe_from_credential(key, [w for w in gone if w is not None])
            subscribed += len(page)
            if len(page) < self.subscribers_page:
                return subscribed
            after = page[-1]
            activity.heartbeat(after, subscribed)

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
    """Turns in the ramp after a rate limit, handed out by the store (store.ramps: fair across the Teams whose
    runs wait, 1/resumePerSecond apart): one order across every worker, whatever the throttle workflow is busy
    with."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=Activity.RESERVE_RESUME_PLACE)
    async def reserve_resume_place(self, req: ResumePlaceRequest) -> datetime:
        """The instant the run may call again: its turn in the ramp, or the limit's end when that is now."""
        digest = hashlib.sha256(f"{req.key}@{req.until.isoformat()}".encode()).hexdigest()[:40]
        if req.run_id is None:
            with store_errors_as_activity_errors():
                place = await self.store.next_in_line(f"resume:{digest}")
            return req.until + timedelta(seconds=(place - 1) / req.resume_per_second)
        with store_errors_as_activity_errors():
            turn = await self.store.take_turn(
                digest, req.until, req.resume_per_second, req.run_id, req.tenant, req.weight
            )
        return turn or req.until
