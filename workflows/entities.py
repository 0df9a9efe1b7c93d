"""Entity workflows shared by runs: per credential, an announcer of its limits (and the throttle it replaced),
and one per concurrency scope (a gate).

Runs talk to them by signal-with-start (the `signal_with_start` activity, run as a local activity) and they
answer by signalling the runs back. None polls: a limit is a timestamp handed to every subscribed run, a slot is
handed to the next waiting run when a holder releases it. Each finishes when idle and continues-as-new when its
history grows.
"""

import asyncio
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import metrics
from workflows.activity_types import WorkflowIds, announce_credential_limit, find_closed_workflows
from workflows.entity_types import (
    CREDENTIAL_THROTTLED,
    REMEMBERED_RELEASES,
    SLOT_GRANTED,
    SLOT_QUEUED,
    THROTTLED_UNTIL_MEMO,
    AnnouncerState,
    CredentialLimit,
    CredentialState,
    CredentialSubscription,
    GateState,
    LimitAnnouncement,
    SlotNotice,
    SlotRelease,
    SlotRequest,
    ThrottleNotice,
    key_run,
    run_key,
)
from workflows.envelope import continued_by_itself
from workflows.inbox import Accepts, Handler, Inbox, Proof, Refused, Sender, refused
from workflows.model import KsquadModel

SIGNAL_BATCH = 500
IDLE_SECONDS = 3600.0  # an entity with nothing to do lingers this long, then finishes
ANNOUNCER_IDLE_SECONDS = 300.0  # an announcer keeps nothing between limits: it need not linger long
LIVENESS_CHECK_SECONDS = 300.0  # a full gate with waiters checks this often for holders that were terminated


S = TypeVar("S", GateState, CredentialState, AnnouncerState)
# Runs message the entities through the worker's signal_with_start activity, which proves each message on behalf
# of the run it runs for (worker.seals): the entities take messages from nothing else.
FROM_RUNS = frozenset({Sender.WORKER})


def carried(state: S) -> S:
    """An entity's state comes from its own continue-as-new only. Started by anyone else (a client of the
    namespace could start a gate full of holders, or with a cron schedule or retry policy that would carry such a
    state on), it starts empty; only its renewal pace is taken."""
    if continued_by_itself():
        return state
    key = workflow.info().workflow_id.split("/", 1)[1]
    if isinstance(state, GateState):
        return GateState(scope=key, signals_per_run=state.signals_per_run)
    return type(state)(key=key, signals_per_run=state.signals_per_run)


def from_sender(kind: str, signal: str, run_id: str, proof: Proof | None) -> bool:
    """A run's message names the run that the proof says sent it (None: a history from before proofs)."""
    if proof is None or proof.sender == run_id:
        return True
    refused(kind, signal, Refused("wrong_sender", f"a message for {run_id} sent for {proof.sender}"))
    return False


def renewal_due(signals: int, signals_per_run: int) -> bool:
    """An entity continues as new when the server suggests it or past its own signal budget."""
    return workflow.info().is_continue_as_new_suggested() or signals >= signals_per_run


async def signal_runs(signals: Iterable[tuple[str, KsquadModel]], signal: str) -> list[str]:
    """Send each run its argument; return the runs that are gone (closed workflows cannot be signalled)."""

    async def one(run_id: str, arg: KsquadModel) -> str | None:
        try:
            await workflow.get_external_workflow_handle(run_id).signal(signal, arg)
            return None
        except ApplicationError:
            return run_id

    results = await asyncio.gather(*(one(run_id, arg) for run_id, arg in signals))
    return [r for r in results if r is not None]


# --- credentials ------------------------------------------------------------------------------------------


@workflow.defn(name="CredentialThrottle")
class CredentialThrottleWorkflow:
    """The throttle of one credential (`<namespace>/<secret>`), shared by every run that uses it.

    It tells subscribers when the credential is limited; it does not order their resumption (each run takes its
    own place in the ramp from the store: `reserve_resume_place`), so thousands of paused runs cost it no more
    than their subscriptions. A worker with a store subscribes runs there instead, and the credential's announcer
    tells them: this workflow still serves the runs that subscribed to it before, and workers without a store."""

    @workflow.init
    def __init__(self, state: CredentialState) -> None:
        self.state = state = carried(state)
        self.inbox = Inbox(
            "CredentialThrottle",
            {
                "subscribe": Handler(Accepts(CredentialSubscription, proven_by=FROM_RUNS), self.subscribe),
                "unsubscribe": Handler(
                    Accepts(CredentialSubscription, proven_by=FROM_RUNS), self.unsubscribe
                ),
                "limited": Handler(Accepts(CredentialLimit, proven_by=FROM_RUNS), self.limited),
                "cleared": Handler(Accepts(CredentialSubscription, proven_by=FROM_RUNS), self.cleared),
            },
            [],
            remembered=state.signals_per_run,  # all it takes before it continues as new
        )
        # Notices still to send; a continue-as-new carries the run ids (state.to_notify).
        self._outbox: list[tuple[str, ThrottleNotice]] = []
        if state.to_notify and state.throttled_until is not None:
            self._outbox = [(r, self._notice()) for r in state.to_notify]
        state.to_notify = []
        self._signals = 0  # received by this run of the workflow

    def _notice(self) -> ThrottleNotice:
        assert self.state.throttled_until is not None
        return ThrottleNotice(
            key=self.state.key, until=self.state.throttled_until, strikes=self.state.strikes
        )

    def _memo(self) -> dict[str, object]:
        if self.state.throttled_until is None:
            return {}
        return {THROTTLED_UNTIL_MEMO: self.state.throttled_until.isoformat(), "strikes": self.state.strikes}

    def _throttled(self) -> bool:
        return self.state.throttled_until is not None and self.state.throttled_until > workflow.now()

    @workflow.signal(dynamic=True)
    def signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._signals += 1  # every signal counts towards the server's limit per execution, refused or not
        self.inbox.deliver(name, args)

    def subscribe(self, sub: CredentialSubscription, proof: Proof | None) -> None:
        if not from_sender("CredentialThrottle", "subscribe", sub.run_id, proof):
            return
        if sub.run_id not in self.state.subscribers:
            self.state.subscribers.append(sub.run_id)
        # A run joining during a limit learns of it at once, unless its subscription already knew it (read from
        # the memo before subscribing): then no signal is needed, which matters when thousands subscribe.
        if self._throttled() and sub.known_until != self.state.throttled_until:
            self._outbox.append((sub.run_id, self._notice()))

    def unsubscribe(self, sub: CredentialSubscription, proof: Proof | None) -> None:
        if not from_sender("CredentialThrottle", "unsubscribe", sub.run_id, proof):
            return
        if sub.run_id in self.state.subscribers:
            self.state.subscribers.remove(sub.run_id)

    def limited(self, limit: CredentialLimit, proof: Proof | None) -> None:
        """A run hit a 429 on this credential: every other subscriber pauses until `until` too."""
        if not from_sender("CredentialThrottle", "limited", limit.run_id, proof):
            return
        if self.state.throttled_until is None or limit.until > self.state.throttled_until:
            self.state.throttled_until = limit.until
        self.state.strikes += 1
        # Readable without a workflow task (describe): a run subscribing during the limit learns of it before
        # its first call, not from a signal that may arrive after it.
        workflow.upsert_memo(self._memo())
        others = [r for r in self.state.subscribers if r != limit.run_id]
        self._outbox.extend((r, self._notice()) for r in others)

    def cleared(self, sub: CredentialSubscription, proof: Proof | None) -> None:
        """A call on this credential succeeded: the backoff starts over."""
        if not from_sender("CredentialThrottle", "cleared", sub.run_id, proof):
            return
        if not self._throttled():
            self.state.strikes = 0

    @workflow.query
    def state_query(self) -> CredentialState:
        return self.state

    def _renew_due(self) -> bool:
        return renewal_due(self._signals, self.state.signals_per_run)

    @workflow.run
    async def run(self, state: CredentialState) -> None:
        while True:
            idle = not self.state.subscribers and not self._throttled()
            try:
                await workflow.wait_condition(
                    lambda: bool(self._outbox) or self._renew_due(),
                    timeout=IDLE_SECONDS if idle else None,
                    timeout_summary="idle: finish",
                )
            except TimeoutError:
                if not self.state.subscribers and not self._throttled():
                    return
                continue
            while self._outbox and not self._renew_due():
                # The server refuses more than 2,000 signals in flight from one workflow: send in batches.
                notices, self._outbox = self._outbox[:SIGNAL_BATCH], self._outbox[SIGNAL_BATCH:]
                for gone in await signal_runs(notices, CREDENTIAL_THROTTLED):
                    if gone in self.state.subscribers:
                        self.state.subscribers.remove(gone)
            if self._renew_due():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self.state.to_notify = [run_id for run_id, _ in self._outbox]
                # The memo is not carried over by itself: without it, runs subscribing after the renewal would
                # not learn of the limit before their first call.
                workflow.continue_as_new(self.state, memo=self._memo())


@workflow.defn(name="CredentialAnnouncer")
class CredentialAnnouncerWorkflow:
    """Tells the runs subscribed to a credential in the store (`Store.credential_subscribers`) that it is limited.

    It holds no subscribers: a run subscribes with a row, so thousands of runs cost its history nothing, and a
    limit costs one activity that reads them and signals each. No run misses a limit: the run that got the 429
    writes it to the store before it signals here, and a subscriber writes its row before it reads the limit, so
    either the subscriber reads the limit or the activity, reading after it, finds the subscriber."""

    @workflow.init
    def __init__(self, state: AnnouncerState) -> None:
        self.state = state = carried(state)
        self.inbox = Inbox(
            "CredentialAnnouncer",
            {"limited": Handler(Accepts(CredentialLimit, proven_by=FROM_RUNS), self.limited)},
            [],
            remembered=state.signals_per_run,  # all it takes before it continues as new
        )
        self._reporters: list[CredentialLimit] = state.reporters
        state.reporters = []
        self._signals = 0  # received by this run of the workflow

    @workflow.signal(dynamic=True)
    def signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._signals += 1
        self.inbox.deliver(name, args)

    def limited(self, limit: CredentialLimit, proof: Proof | None) -> None:
        if from_sender("CredentialAnnouncer", "limited", limit.run_id, proof):
            self._reporters.append(limit)

    def _renew_due(self) -> bool:
        return renewal_due(self._signals, self.state.signals_per_run)

    @workflow.run
    async def run(self, state: AnnouncerState) -> None:
        while True:
            try:
                await workflow.wait_condition(
                    lambda: bool(self._reporters) or self._renew_due(),
                    timeout=ANNOUNCER_IDLE_SECONDS,
                    timeout_summary="idle: finish",
                )
            except TimeoutError:
                if not self._reporters:
                    return
            if self._reporters:
                # The limits reported while the last announcement went out go in one announcement: the store
                # holds the latest limit, and each subscriber needs to hear it once.
                reporters, self._reporters = self._reporters, []
                await self._announce(reporters)
            if self._renew_due():
                await workflow.wait_condition(workflow.all_handlers_finished)
                self.state.reporters = self._reporters
                workflow.continue_as_new(self.state)

    async def _announce(self, reporters: list[CredentialLimit]) -> None:
        try:
            subscribers = await workflow.execute_activity(
                announce_credential_limit,
                LimitAnnouncement(key=self.state.key, reporters=reporters),
                start_to_close_timeout=timedelta(minutes=10),
                heartbeat_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=10),
                summary=f"tell {self.state.key}'s subscribers of its limit",
            )
        except ActivityError as err:  # the subscribers still meet the limit themselves: a 429 each
            workflow.logger.warning("announcing %s's limit failed: %s", self.state.key, err)
            return
        metrics.throttle_size(self.state.key, subscribers)


# --- concurrency gates ------------------------------------------------------------------------------------


# Gates that admitted in arrival order before fair admission replay as they ran.
FAIR_ADMISSION_PATCH = "fair-admission"


@workflow.defn(name="ConcurrencyGate")
class ConcurrencyGateWorkflow:
    """At most `limit` runs of one scope (a namespace, Team or Project) past Queued at a time."""

    @workflow.init
    def __init__(self, state: GateState) -> None:
        self.state = carried(state)
        self.inbox = Inbox(
            "ConcurrencyGate",
            {
                "acquire": Handler(Accepts(SlotRequest, proven_by=FROM_RUNS), self.acquire),
                "release": Handler(Accepts(SlotRelease, proven_by=FROM_RUNS), self.release),
            },
            [],
            remembered=state.signals_per_run,  # all it takes before it continues as new
        )
        self._granted: list[str] = []  # keys (GateState)
        self._queued: list[str] = []
        self._signals = 0  # received by this run of the workflow

    @workflow.signal(dynamic=True)
    def signal(self, name: str, args: Sequence[RawValue]) -> None:
        self._signals += 1
        self.inbox.deliver(name, args)

    def acquire(self, request: SlotRequest, proof: Proof | None) -> None:
        if not from_sender("ConcurrencyGate", "acquire", request.run_id, proof):
            return
        key = run_key(request.run_id, proof.sender_chain if proof else None)
        if key in self.state.released and request.asked <= self.state.released_asks.get(key, 1):
            refused(
                "ConcurrencyGate",
                "acquire",
                Refused("replayed", f"{key} released its slot already (request {request.asked})"),
            )
            return
        self.state.limit = request.limit
        if key in self.state.holders:
            # A repeated request (a retried activity) gets the same answer.
            self._granted.append(key)
        elif key not in self.state.waiting:
            self.state.waiting.append(key)
            start = max(self.state.virtual, self.state.tenant_finish.get(request.tenant, 0.0))
            finish = start + 1.0 / request.weight
            self.state.finish[key] = self.state.tenant_finish[request.tenant] = finish
            self._admit()
            if key in self.state.waiting:
                self._queued.append(key)
        else:
            self._queued.append(key)

    def release(self, release: SlotRelease, proof: Proof | None) -> None:
        if from_sender("ConcurrencyGate", "release", release.run_id, proof):
            self._free(run_key(release.run_id, proof.sender_chain if proof else None), release.asked)

    def _free(self, key: str, asked: int = 1) -> None:
        """The run's slot or place is free; a copy of its request (of `asked` or before) will be refused."""
        for queue in (self.state.holders, self.state.waiting):
            if key in queue:
                queue.remove(key)
        self.state.finish.pop(key, None)
        if key_run(key)[1] is not None:
            if key not in self.state.released:
                self.state.released.append(key)
            if asked > self.state.released_asks.get(key, 1):
                self.state.released_asks[key] = asked
            for forgotten in self.state.released[:-REMEMBERED_RELEASES]:
                self.state.released_asks.pop(forgotten, None)
            del self.state.released[:-REMEMBERED_RELEASES]
        self._admit()

    def _admit(self) -> None:
        fair = workflow.patched(FAIR_ADMISSION_PATCH)
        while self.state.waiting and len(self.state.holders) < self.state.limit:
            run_id = self._next_in_line() if fair else self.state.waiting[0]
            self.state.waiting.remove(run_id)
            self.state.virtual = max(self.state.virtual, self.state.finish.pop(run_id, 0.0))
            self.state.holders.append(run_id)
            self._granted.append(run_id)
        # A tenant whose last finish the clock has passed starts from the clock anyway: forget it.
        for tenant, finish in list(self.state.tenant_finish.items()):
            if finish <= self.state.virtual:
                del self.state.tenant_finish[tenant]
        metrics.gate_sizes(self.state.scope, len(self.state.waiting), len(self.state.holders))

    def _order(self, index: int) -> tuple[float, int]:
        """Where the index-th waiting run stands: by virtual finish, the later arrival first on a tie (which only
        happens between Teams: a Team's k-th run waits behind at most k-1 of each Team of the same weight)."""
        return self.state.finish.get(self.state.waiting[index], 0.0), -index

    def _next_in_line(self) -> str:
        return self.state.waiting[min(range(len(self.state.waiting)), key=self._order)]

    def _position(self, run_id: str) -> int:
        """1 for the run admitted next."""
        mine = self._order(self.state.waiting.index(run_id))
        return 1 + sum(1 for i in range(len(self.state.waiting)) if self._order(i) < mine)

    @workflow.query
    def state_query(self) -> GateState:
        return self.state

    def _renew_due(self) -> bool:
        return renewal_due(self._signals, self.state.signals_per_run)

    @workflow.run
    async def run(self, state: GateState) -> None:
        while True:
            busy = bool(self.state.holders or self.state.waiting)
            # With runs waiting on a full gate, look now and then for holders that can no longer release
            # (a terminated workflow runs no cleanup); otherwise sleep until something happens.
            timeout = LIVENESS_CHECK_SECONDS if self.state.waiting else (None if busy else IDLE_SECONDS)
            try:
                await workflow.wait_condition(
                    lambda: bool(self._granted or self._queued) or self._renew_due(),
                    timeout=timeout,
                    timeout_summary="check holders" if self.state.waiting else "idle: finish",
                )
            except TimeoutError:
                if not (self.state.holders or self.state.waiting):
                    return
                await self._free_slots_of_closed_runs()
            await self._notify()
            if self._renew_due():
                await workflow.wait_condition(workflow.all_handlers_finished)
                await self._notify()
                workflow.continue_as_new(self.state)

    def _notice(self, key: str, position: int = 0) -> tuple[str, SlotNotice]:
        run_id, chain = key_run(key)
        return run_id, SlotNotice(scope=self.state.scope, position=position, chain=chain)

    async def _notify(self) -> None:
        while self._granted or self._queued:
            granted, self._granted = self._granted, []
            queued, self._queued = self._queued, []
            notices = [self._notice(key) for key in granted]
            gone = set(await signal_runs(notices, SLOT_GRANTED))
            gone_keys = [key for key in granted if key_run(key)[0] in gone]
            for key in queued:
                notice = [self._notice(key, self._position(key))] if key in self.state.waiting else []
                if notice and await signal_runs(notice, SLOT_QUEUED):
                    gone_keys.append(key)
            for key in gone_keys:
                self._free(key)

    async def _free_slots_of_closed_runs(self) -> None:
        try:
            closed = await workflow.execute_activity(
                find_closed_workflows,
                WorkflowIds(ids=list(self.state.holders)),
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=30), maximum_attempts=5),
                summary=f"look for closed holders among {len(self.state.holders)}",
            )
        except ActivityError as err:  # try again at the next check; the gate itself must not fail
            workflow.logger.warning("gate %s: holder check failed: %s", self.state.scope, err)
            return
        for key in closed:
            self._free(key)
