"""RunWorkflow: one Run's whole lifecycle as a durable Temporal workflow.

    Pending -> Queued? -> Claiming -> Running -> Succeeded | Failed | Cancelled, plus Paused and Cancelling.

Durable timers implement rate-limit resume, retry backoff and every phase's timeout; activities (called by
name, see `workflows.activity_types`) do the side effects. Every state change bumps `status.revision` and is
mirrored to the Run's status by a coalesced, non-blocking sender. The flow, in `_lifecycle`:

1. Pending: resolve references (bridge activity); missing ones are named in a condition and waited for.
2. Queued: take a slot of every concurrency scope (namespace, Team, Project) from its gate workflow.
3. Attempts, until success or the retry budget is spent. Each attempt: wait while the credential is
   throttled (no calls), claim the work item (a new fence), get a sandbox, invoke the agent in turns
   (a fallback model, input or a refreshed credential continue the same attempt), publish outputs.
   A failure fences the claim, deletes the sandbox and confirms it is gone, releases the claim, backs off.
4. Cancellation (Temporal cancel, or the `cancel` signal) interrupts any phase; teardown then runs to the
   end, shielded from further interruption.
"""

import asyncio
import contextlib
import functools
from collections.abc import Awaitable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.exceptions import CancelledError as TemporalCancelledError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.workflow import ActivityCancellationType

from workflows import search_attributes as sa
from workflows.activity_types import (
    BRIDGE_TASK_QUEUE,
    CLAIM_LEASE_SECONDS,
    SANDBOX_MISCONFIGURED,
    Activity,
    AgentError,
    AgentInvocation,
    AgentResult,
    Claim,
    ClaimRequest,
    ClaimUpdate,
    ContinueTask,
    EntitySignal,
    FailureDetails,
    OutputsRequest,
    PublishedOutputs,
    RateLimitDetails,
    ResolveRequest,
    RunRef,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
    TaskPause,
)
from workflows.carry import RunCarry
from workflows.contract import (
    ConcurrencyScope,
    ExecutionContract,
    ModelRef,
    Resolution,
    ResolvedAgent,
    RunIdentity,
)
from workflows.entity_types import (
    CREDENTIAL_THROTTLED,
    DEFAULT_RESUME_PER_SECOND,
    SLOT_GRANTED,
    SLOT_QUEUED,
    CredentialLimit,
    CredentialSubscription,
    ResumePlaceRequest,
    SlotNotice,
    SlotRelease,
    SlotRequest,
    ThrottleNotice,
    credential_workflow_id,
    gate_workflow_id,
)
from workflows.model import KsquadModel
from workflows.policies import (
    RateLimitAction,
    RateLimitThresholds,
    decide_rate_limit,
    equal_jitter_backoff,
    parse_retry_after,
    set_condition,
    transition,
)
from workflows.spec import RunInput
from workflows.status import (
    MAX_EVENTS_PER_SNAPSHOT,
    ConditionType,
    PauseReason,
    Phase,
    PhaseEvent,
    RunStatus,
    StatusSnapshot,
    WorkflowRef,
    WorkItemStatus,
)

T = TypeVar("T")

# Patches (workflow.patched): each changes the commands the workflow issues, so histories recorded before it
# take the old path. tests/workflows/test_replay.py replays such histories.
PATCH_SHIELDED_TEARDOWN = "shielded-teardown"
PATCH_FAILURES_FAIL_THE_RUN = "failures-fail-the-run"
PATCH_EXPIRED_NOTICES = "expired-notices"  # a notice of a limit already over does not interrupt an attempt
PATCH_WAITED_OUT = "waited-out"  # a throttle interrupt is spent once the run has waited the limit out
PATCH_LOCAL_ENTITY_SIGNALS = "local-entity-signals"  # messages to entities as local activities
PATCH_MISCONFIGURED_SANDBOX = (
    "misconfigured-sandbox"  # a sandbox the cluster cannot run fails the run at once
)
PATCH_RESUME_RAMP = (
    "resume-ramp"  # a paused run takes its place in the ramp after the limit (reserve_resume_place)
)

AGENT_HEARTBEAT_TIMEOUT = timedelta(seconds=30)
MIRROR_FLUSH_SECONDS = 60.0  # at the end, wait this long for the last status to be mirrored
RESOLVE_RETRY_MAX_SECONDS = 30.0
RATE_LIMITS = RateLimitThresholds()

# Short activities retry until their phase's deadline (schedule-to-close), with capped backoff.
_RETRY_UNTIL_DEADLINE = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
# Bookkeeping activities (publish, fence, release, entity signals) are bounded per attempt and by attempts,
# never by schedule-to-close: that clock includes time spent waiting in the task queue, so a busy worker
# (thousands of runs resuming) would fail runs whose work was never even tried.
_RETRY_BOOKKEEPING = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=10
)


class Interrupt(StrEnum):
    CANCEL = "cancel"
    PAUSE = "pause"
    THROTTLED = "throttled"  # another run's 429 throttled the credential this run uses


class Interrupted(Exception):
    def __init__(self, kind: Interrupt) -> None:
        super().__init__(kind.value)
        self.kind = kind


class PhaseTimeout(Exception):
    pass


class AttemptFailed(Exception):
    """The attempt failed; the run retries (fence, delete the sandbox, release, back off) while it may."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RunFailed(Exception):
    """The run fails now, without retrying (it can never succeed as written, or a phase ran out of time)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RateLimitPause(Exception):
    def __init__(self, until: datetime, message: str) -> None:
        super().__init__(message)
        self.until = until
        self.message = message


class Reroute(Exception):
    def __init__(self, agent_index: int, message: str) -> None:
        super().__init__(message)
        self.agent_index = agent_index
        self.message = message


EntityKind = Literal["CredentialThrottle", "ConcurrencyGate"]


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    @workflow.init
    def __init__(self, input: RunInput) -> None:
        self.run_input = input
        self.spec = input.spec
        self.run_ref = RunRef(
            namespace=input.namespace, name=input.name, uid=input.uid, triggered_by=input.triggered_by
        )
        carry = input.carry or RunCarry(status=RunStatus(triggered_by=input.triggered_by))
        self.status = carry.status
        self.resolution = carry.resolution
        self.agent_index = carry.agent_index
        self.on_fallback = carry.on_fallback
        self.consecutive_limits = carry.consecutive_limits
        self.throttles = dict(carry.throttles)
        self.strikes = dict(carry.strikes)
        self.unplaced = dict(carry.unplaced)
        self.slots = list(carry.slots)
        self.claim_fence = carry.claim_fence
        self.queued: dict[str, int] = {}
        self.subscribed: list[str] = []
        self.sandbox: Sandbox | None = None
        self.interrupt: Interrupt | None = None
        self.resume_requested = False
        self.credential_refreshes = 0  # rotations of this run's credential seen so far
        self.pending_input: str | None = None
        self.references_changed = False
        self.cancel_reason = ""
        self.pause_message: str | None = None  # the `pause` signal's reason, shown while Paused(Manual)
        self._mirror_task: asyncio.Task[None] | None = None
        self._mirrored_revision = -1
        self._unsent_events: list[PhaseEvent] = []
        self._search_attributes: dict[str, Any] = {}

    # --- signals and query --------------------------------------------------------------------------------

    @workflow.signal
    def cancel(self, reason: str | None = None) -> None:
        """Cancel the run from any phase (also: `temporal workflow cancel`, kubectl delete, the annotation)."""
        self.cancel_reason = reason or "cancel requested"
        self.interrupt = Interrupt.CANCEL

    @workflow.signal
    def pause(self, reason: str | None = None) -> None:
        self.pause_message = reason
        if self.interrupt is None and self.status.phase != Phase.PAUSED:
            self.interrupt = Interrupt.PAUSE
        self.resume_requested = False

    @workflow.signal
    def resume(self) -> None:
        if self.interrupt == Interrupt.PAUSE:
            self.interrupt = None  # the pause had not taken effect yet
        self.resume_requested = True

    @workflow.signal(name="credential_refreshed")
    def on_credential_refreshed(self, credential: str | None = None) -> None:
        """A credential was rotated; `credential` ("<namespace>/<secret>") names which, None means any."""
        if credential is None or credential == self._credential_key():
            self.credential_refreshes += 1

    @workflow.signal(name="input")
    def on_input(self, text: str) -> None:
        self.pending_input = text

    @workflow.signal
    def references_updated(self) -> None:
        """From the bridge: an object this run may reference changed; resolve again now."""
        self.references_changed = True

    @workflow.signal(name=CREDENTIAL_THROTTLED)
    def credential_throttled(self, notice: ThrottleNotice) -> None:
        self._throttle(notice.key, notice.until)
        self.strikes[notice.key] = notice.strikes
        in_flight = self.status.phase in (Phase.CLAIMING, Phase.RUNNING)
        # A notice of a limit that has already ended (it crossed the run's own resumption) stops nothing.
        expired = notice.until <= workflow.now() and workflow.patched(PATCH_EXPIRED_NOTICES)
        if in_flight and not expired and self.interrupt is None and notice.key == self._credential_key():
            self.interrupt = Interrupt.THROTTLED

    @workflow.signal(name=SLOT_GRANTED)
    def slot_granted(self, notice: SlotNotice) -> None:
        if notice.scope not in self.slots:
            self.slots.append(notice.scope)
        self.queued.pop(notice.scope, None)

    @workflow.signal(name=SLOT_QUEUED)
    def slot_queued(self, notice: SlotNotice) -> None:
        if notice.scope not in self.slots:
            self.queued[notice.scope] = notice.position

    @workflow.query
    def state(self) -> RunStatus:
        return self.status

    # --- the lifecycle ------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: RunInput) -> RunStatus:
        info = workflow.info()
        self.status.workflow = WorkflowRef(id=info.workflow_id, run_id=info.run_id)
        if input.carry is None:
            self._move(Phase.PENDING, reason="Created", message="resolving references")
        try:
            await self._lifecycle()
        except (asyncio.CancelledError, Interrupted) as err:
            if isinstance(err, Interrupted) and err.kind != Interrupt.CANCEL:
                raise AssertionError(f"unhandled interrupt {err.kind}") from err
            temporal_cancel = isinstance(err, asyncio.CancelledError)
            await self._cancel_teardown(
                "cancelled through Temporal" if temporal_cancel else self.cancel_reason
            )
            await self._finish()
            if temporal_cancel:
                raise  # the workflow ends Canceled in Temporal too
            return self.status
        except RunFailed as err:
            message = err.message
            try:
                await self._teardown()
            except RunFailed as teardown:
                message = f"{message}; {teardown.message}"
            self._move(Phase.FAILED, reason=err.reason, message=message)
        except FailureError as err:
            # Anything else that failed for good (an activity past its retries): the run ends Failed with the
            # reason on its status. Without this the workflow failed and the Run kept showing its last phase.
            if not workflow.patched(PATCH_FAILURES_FAIL_THE_RUN):
                raise
            cause = str(err.cause) if err.cause is not None else ""
            message = f"{err.message}: {cause}" if cause else err.message
            try:
                await self._teardown()
            except (RunFailed, FailureError) as teardown:
                message = f"{message}; teardown: {getattr(teardown, 'message', teardown)}"
            self._move(Phase.FAILED, reason="InternalError", message=message[:2000])
        await self._finish()
        return self.status

    async def _lifecycle(self) -> None:
        if self.resolution is None:
            await self._resolve()
        await self._subscribe_credentials()
        await self._admit()
        while True:
            if workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()
            try:
                await self._attempt()
                return
            except RateLimitPause as pause:  # the agent's task ended (FAILED): nothing to fence
                await self._teardown(fence=False, release=False)
                await self._renew_claim_for(pause.until)
                self._throttle(self._credential_key(), pause.until)
            except Reroute as reroute:
                await self._teardown()
                self.agent_index, self.on_fallback, self.consecutive_limits = reroute.agent_index, False, 0
                self._move(Phase.CLAIMING, reason="Rerouted", message=reroute.message)
            except Interrupted as interrupted:
                if interrupted.kind == Interrupt.CANCEL:
                    raise
                # The agent was stopped mid-task: fence its writes, keep the claim through the pause.
                await self._teardown(fence=True, release=False)
                if interrupted.kind == Interrupt.PAUSE:
                    await self._manual_pause()
                else:  # throttled by another run's limit
                    await self._renew_claim_for(self.throttles.get(self._credential_key(), workflow.now()))
            except AttemptFailed as failed:
                await self._teardown()
                await self._retry_or_fail(failed)

    async def _attempt(self) -> None:
        await self._wait_while_throttled()
        self.status.attempt += 1
        attempt = self.status.attempt
        agent = self._agent()
        self.status.agent, self.status.model = agent.name, self._model().name
        self._move(Phase.CLAIMING, reason="Claiming", message=f"attempt {attempt}: claiming")
        claim_deadline = workflow.now() + timedelta(seconds=self.spec.timeouts.claim_seconds)
        fence = await self._claim(attempt, claim_deadline)
        self.sandbox = await self._acquire_sandbox(attempt, fence, claim_deadline)
        set_condition(
            self.status,
            ConditionType.SANDBOX_READY,
            True,
            self.sandbox.kind.capitalize(),
            self.sandbox.name,
            workflow.now(),
            self.run_input.generation,
        )
        self.status.sandbox = self.sandbox.status
        self._move(
            Phase.RUNNING, reason="Running", message=f"attempt {attempt}: {agent.name} on {self.sandbox.name}"
        )
        result = await self._invoke(attempt, fence)
        published = await self._activity(
            Activity.PUBLISH_OUTPUTS,
            OutputsRequest(
                run=self.run_ref,
                attempt=attempt,
                fence=fence,
                outputs=result.outputs,
                artifacts=result.artifacts,
            ),
            PublishedOutputs,
            start_to_close=60,
            summary="publish outputs",
        )
        self.status.outputs = published.outputs
        self.status.artifacts = result.artifacts
        await self._release_sandbox(confirm=False)
        await self._release_claim()
        if self.strikes.get(self._credential_key()):
            await self._entity_signal(
                "CredentialThrottle",
                credential_workflow_id(self._credential_key()),
                "cleared",
                CredentialSubscription(run_id=self._run_id()),
            )
        self._move(
            Phase.SUCCEEDED, reason="Succeeded", message=result.summary or f"attempt {attempt} succeeded"
        )

    # --- Pending: references ------------------------------------------------------------------------------

    async def _resolve(self) -> None:
        deadline = workflow.now() + timedelta(seconds=self.spec.timeouts.claim_seconds)
        delay = 1.0
        while True:
            self.references_changed = False
            remaining = (deadline - workflow.now()).total_seconds()
            try:
                resolution = await self._interruptible(
                    self._activity(
                        Activity.RESOLVE_REFERENCES,
                        ResolveRequest(run=self.run_ref, spec=self.spec),
                        Resolution,
                        task_queue=BRIDGE_TASK_QUEUE,
                        deadline=deadline,
                        summary="resolve references",
                    ),
                    {Interrupt.CANCEL, Interrupt.PAUSE},
                )
            except Interrupted as interrupted:
                if interrupted.kind == Interrupt.PAUSE:
                    await self._manual_pause(next_phase=Phase.PENDING)
                    deadline = workflow.now() + timedelta(seconds=self.spec.timeouts.claim_seconds)
                    continue
                raise
            except ActivityError as err:
                raise RunFailed("ResolutionFailed", f"could not resolve references: {_cause(err)}") from err
            now = workflow.now()
            if resolution.outcome == "resolved":
                if not resolution.agents:
                    raise RunFailed("NoEligibleAgents", "the Run names no agents and its Team has none")
                self.resolution = resolution
                set_condition(
                    self.status,
                    ConditionType.REFERENCES_RESOLVED,
                    True,
                    "Resolved",
                    f"agents: {', '.join(a.name for a in resolution.agents)}",
                    now,
                    self.run_input.generation,
                )
                return
            if resolution.outcome == "invalid":
                message = resolution.error or "invalid references"
                set_condition(
                    self.status,
                    ConditionType.REFERENCES_RESOLVED,
                    False,
                    "Invalid",
                    message,
                    now,
                    self.run_input.generation,
                )
                raise RunFailed("InvalidReferences", message)
            missing = ", ".join(resolution.missing)
            set_condition(
                self.status,
                ConditionType.REFERENCES_RESOLVED,
                False,
                "Missing",
                f"waiting for {missing}",
                now,
                self.run_input.generation,
            )
            if remaining <= 0 or now >= deadline:
                raise RunFailed(
                    "ReferencesNotFound",
                    f"{missing} not found within timeouts.claimSeconds ({self.spec.timeouts.claim_seconds}s)",
                )
            self._move(Phase.PENDING, reason="ReferencesMissing", message=f"waiting for {missing}")
            wait = min(delay, (deadline - now).total_seconds())
            delay = min(delay * 2, RESOLVE_RETRY_MAX_SECONDS)
            try:
                await self._interruptible(
                    workflow.wait_condition(
                        lambda: self.references_changed, timeout=wait, timeout_summary=f"wait for {missing}"
                    ),
                    {Interrupt.CANCEL, Interrupt.PAUSE},
                )
            except TimeoutError:
                pass
            except Interrupted as interrupted:
                if interrupted.kind != Interrupt.PAUSE:
                    raise
                await self._manual_pause(next_phase=Phase.PENDING)
                deadline = workflow.now() + timedelta(seconds=self.spec.timeouts.claim_seconds)

    # --- Queued: concurrency gates ------------------------------------------------------------------------

    async def _admit(self) -> None:
        assert self.resolution is not None
        for scope in sorted(self.resolution.scopes, key=lambda s: s.key):  # one global order: no deadlock
            while scope.key not in self.slots:
                await self._request_slot(scope)

    async def _request_slot(self, scope: ConcurrencyScope) -> None:
        await self._entity_signal(
            "ConcurrencyGate",
            gate_workflow_id(scope.key),
            "acquire",
            SlotRequest(run_id=self._run_id(), limit=scope.limit),
        )
        deadline = workflow.now() + timedelta(seconds=self.spec.timeouts.queued_seconds)
        while scope.key not in self.slots:
            if scope.key in self.queued and self.status.phase != Phase.QUEUED:
                set_condition(
                    self.status,
                    ConditionType.ADMITTED,
                    False,
                    "Queued",
                    scope.key,
                    workflow.now(),
                    self.run_input.generation,
                )
                self._move(
                    Phase.QUEUED,
                    reason="ConcurrencyLimit",
                    message=f"{scope.key} is full ({scope.limit}); position {self.queued[scope.key]}",
                )
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                await self._withdraw(scope.key)
                raise RunFailed("QueueTimeout", f"no slot of {scope.key} within timeouts.queuedSeconds")
            try:
                await self._interruptible(
                    workflow.wait_condition(
                        lambda: (
                            scope.key in self.slots
                            or (scope.key in self.queued and self.status.phase != Phase.QUEUED)
                        ),
                        timeout=remaining,
                        timeout_summary=f"wait for a slot of {scope.key}",
                    ),
                    {Interrupt.CANCEL, Interrupt.PAUSE},
                )
            except TimeoutError:
                continue
            except Interrupted as interrupted:
                await self._withdraw(scope.key)
                if interrupted.kind != Interrupt.PAUSE:
                    raise
                await self._manual_pause(next_phase=Phase.QUEUED)
                return  # ask again, at the back of the queue
        set_condition(
            self.status,
            ConditionType.ADMITTED,
            True,
            "SlotsHeld",
            ", ".join(self.slots),
            workflow.now(),
            self.run_input.generation,
        )

    async def _withdraw(self, scope: str) -> None:
        self.queued.pop(scope, None)
        await self._entity_signal(
            "ConcurrencyGate", gate_workflow_id(scope), "release", SlotRelease(run_id=self._run_id())
        )
        if scope in self.slots:
            self.slots.remove(scope)

    # --- Claiming -----------------------------------------------------------------------------------------

    async def _claim(self, attempt: int, deadline: datetime) -> int:
        ref = self.spec.work_item_ref
        if ref is None:  # no work item: writes are still fenced, by attempt
            return attempt
        try:
            claim = await self._interruptible(
                self._activity(
                    Activity.CLAIM_WORK_ITEM,
                    ClaimRequest(
                        run=self.run_ref,
                        work_item_ref=ref,
                        attempt=attempt,
                        lease_seconds=CLAIM_LEASE_SECONDS,
                    ),
                    Claim,
                    deadline=deadline,
                    summary=f"claim {ref}",
                ),
                {Interrupt.CANCEL, Interrupt.PAUSE, Interrupt.THROTTLED},
            )
        except ActivityError as err:
            raise RunFailed(
                "ClaimTimeout",
                f"could not claim {ref} within timeouts.claimSeconds ({self.spec.timeouts.claim_seconds}s): {_cause(err)}",
            ) from err
        self.claim_fence = claim.fence
        self.status.work_item = WorkItemStatus(ref=ref, fence=claim.fence)
        set_condition(
            self.status,
            ConditionType.WORK_ITEM_CLAIMED,
            True,
            "Claimed",
            f"{ref} fence {claim.fence}",
            workflow.now(),
            self.run_input.generation,
        )
        return claim.fence

    async def _acquire_sandbox(self, attempt: int, fence: int, deadline: datetime) -> Sandbox:
        agent = self._agent()
        if agent.endpoint:  # an already-running A2A agent: nothing to make
            return Sandbox(name=agent.name, kind="external", endpoint=agent.endpoint)
        remaining = max(1, int((deadline - workflow.now()).total_seconds()))
        try:
            return await self._interruptible(
                self._activity(
                    Activity.ACQUIRE_SANDBOX,
                    SandboxRequest(
                        contract=self._contract(attempt, fence),
                        policy=self.spec.sandbox_policy,
                        timeout_seconds=remaining,
                        run_seconds=self.spec.timeouts.run_seconds,
                    ),
                    Sandbox,
                    deadline=deadline,
                    heartbeat=AGENT_HEARTBEAT_TIMEOUT,
                    summary=f"sandbox for attempt {attempt}",
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                ),
                {Interrupt.CANCEL, Interrupt.PAUSE, Interrupt.THROTTLED},
            )
        except ActivityError as err:
            cause = err.cause
            if (
                isinstance(cause, ApplicationError)
                and cause.type == SANDBOX_MISCONFIGURED
                and workflow.patched(PATCH_MISCONFIGURED_SANDBOX)
            ):
                raise RunFailed(SANDBOX_MISCONFIGURED, _cause(err)) from err
            raise AttemptFailed("SandboxFailed", _cause(err)) from err

    # --- Running ------------------------------------------------------------------------------------------

    async def _invoke(self, attempt: int, fence: int) -> AgentResult:
        assert self.sandbox is not None
        run_deadline = workflow.now() + timedelta(seconds=self.spec.timeouts.run_seconds)
        turn = 0
        follow_up: ContinueTask | None = None
        uid = self.run_input.uid
        while True:
            message_id = f"{uid}-a{attempt}" + (f"-t{turn}" if turn else "")
            refreshes_before_call = self.credential_refreshes
            invocation = AgentInvocation(
                contract=self._contract(attempt, fence),
                endpoint=self.sandbox.endpoint,
                message_id=message_id,
                context_id=f"{uid}-a{attempt}",
                continue_task=follow_up,
            )
            remaining = (run_deadline - workflow.now()).total_seconds()
            try:
                result = await self._interruptible(
                    self._activity(
                        Activity.INVOKE_AGENT,
                        invocation,
                        AgentResult,
                        start_to_close=max(1.0, remaining),
                        heartbeat=AGENT_HEARTBEAT_TIMEOUT,
                        retry=RetryPolicy(
                            initial_interval=timedelta(seconds=1),
                            maximum_attempts=5,
                            non_retryable_error_types=[e.value for e in AgentError],
                        ),
                        cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                        summary=f"{self._agent().name}: {self._model().name}, message {message_id}",
                    ),
                    {Interrupt.CANCEL, Interrupt.PAUSE, Interrupt.THROTTLED},
                    timeout=max(0.001, remaining),
                    deadline_summary=f"attempt {attempt}: timeouts.runSeconds",
                )
                self.consecutive_limits = 0
                return result
            except PhaseTimeout as err:
                raise AttemptFailed(
                    "RunTimeout",
                    f"attempt {attempt} ran past timeouts.runSeconds ({self.spec.timeouts.run_seconds}s)",
                ) from err
            except ActivityError as err:
                app = err.cause if isinstance(err.cause, ApplicationError) else None
                kind = app.type if app is not None else None
                details = app.details[0] if app is not None and app.details else {}
                if kind == AgentError.RATE_LIMITED:
                    await self._on_rate_limit(RateLimitDetails.model_validate(details))
                    turn, follow_up = turn + 1, None  # the fallback model answers a fresh message
                    continue
                if kind not in (AgentError.INPUT_REQUIRED, AgentError.CREDENTIAL_EXPIRED):
                    if app is not None and kind in _AGENT_ERRORS:
                        message = FailureDetails.model_validate(details).message if details else app.message
                        raise AttemptFailed(str(kind), message) from err
                    raise AttemptFailed("AgentUnavailable", _cause(err)) from err
                # The agent's task waits: pause (the running time stops), then continue the same task.
                task = TaskPause.model_validate(details)
                paused_since = workflow.now()
                text = ""
                if kind == AgentError.INPUT_REQUIRED:
                    text = await self._wait_for_input(task)
                else:
                    await self._wait_for_credential(task, refreshes_before_call)
                run_deadline += workflow.now() - paused_since
                turn, follow_up = (
                    turn + 1,
                    ContinueTask(task_id=task.task_id, context_id=task.context_id, text=text),
                )
                self._move(
                    Phase.RUNNING,
                    reason="Resumed",
                    message=f"attempt {attempt}: {self._agent().name} continues its task",
                )

    async def _on_rate_limit(self, details: RateLimitDetails) -> None:
        """Apply the rate-limit policy: returns to switch to the fallback model, else raises."""
        now = workflow.now()
        key = self._credential_key()
        self.consecutive_limits += 1
        strikes = self.strikes.get(key, 0) + 1
        self.strikes[key] = strikes
        retry_after = parse_retry_after(
            details.retry_after,
            retry_after_ms=details.retry_after_ms,
            response_date=details.response_date,
            observed_at=details.observed_at or now,
            cap_seconds=RATE_LIMITS.cap_seconds,
        )
        agent = self._agent()
        fallback_ok = agent.fallback_model is not None and not self._is_throttled(
            agent.fallback_model.throttle_key(self.run_input.namespace)
        )
        decision = decide_rate_limit(
            on_fallback=self.on_fallback,
            fallback_available=fallback_ok,
            retry_after_seconds=retry_after,
            consecutive_limits=self.consecutive_limits,
            credential_strikes=strikes,
            next_agent=self._next_unthrottled_agent(),
            rand=workflow.random().random(),
            thresholds=RATE_LIMITS,
        )
        if decision.action == RateLimitAction.FALLBACK:
            self.on_fallback = True
            self.status.model = self._model().name
            self._move(
                Phase.RUNNING,
                reason="ModelFallback",
                message=f"{details.model or 'model'} rate limited; {decision.reason}",
            )
            return
        until = now + timedelta(seconds=decision.delay_seconds)
        await self._report_limit(key, until)
        if decision.action == RateLimitAction.REROUTE:
            assert decision.agent is not None
            assert self.resolution is not None
            index = [a.name for a in self.resolution.agents].index(decision.agent)
            raise Reroute(index, decision.reason)
        raise RateLimitPause(until, f"{details.model or 'model'} rate limited ({decision.reason})")

    async def _report_limit(self, key: str, until: datetime) -> None:
        """Tell the credential's workflow, so every other run on it pauses too."""
        self._throttle(key, until)
        await self._entity_signal(
            "CredentialThrottle",
            credential_workflow_id(key),
            "limited",
            CredentialLimit(run_id=self._run_id(), until=until),
        )

    def _throttle(self, key: str, until: datetime) -> None:
        """A limit on `key` until `until`: this run holds no place in the ramp after it yet."""
        if key not in self.throttles or until > self.throttles[key]:
            self.throttles[key] = until
            self.unplaced[key] = until

    async def _take_place(self, key: str) -> None:
        """This run's place in the ramp after the limit (the store hands them out, 1/resumePerSecond apart), so
        the runs paused by one limit do not all call the provider again in the same second."""
        limit = self.unplaced.pop(key)
        rate = self._model().resume_per_second or DEFAULT_RESUME_PER_SECOND
        try:
            place: datetime = await self._activity(
                Activity.RESERVE_RESUME_PLACE,
                ResumePlaceRequest(key=key, until=limit, resume_per_second=rate),
                datetime,
                start_to_close=30,
                summary=f"place in the ramp after {key}'s limit",
            )
        except (
            ActivityError
        ) as err:  # the ramp spares the provider; without a place the run resumes at the limit
            workflow.logger.warning("no place in the ramp after %s: %s", key, _cause(err))
            return
        if place > self.throttles.get(key, limit):
            self.throttles[key] = place

    def _throttle_moved(self, key: str, until: datetime) -> bool:
        return self.throttles.get(key) != until

    def _is_throttled(self, key: str) -> bool:
        until = self.throttles.get(key)
        return until is not None and until > workflow.now()

    def _next_unthrottled_agent(self) -> str | None:
        assert self.resolution is not None
        agents = self.resolution.agents
        for offset in range(1, len(agents)):
            candidate = agents[(self.agent_index + offset) % len(agents)]
            if not self._is_throttled(candidate.model.throttle_key(self.run_input.namespace)):
                return candidate.name
        return None

    # --- Paused -------------------------------------------------------------------------------------------

    async def _wait_while_throttled(self) -> None:
        """Paused(RateLimited) until the credential's resumeAt: one durable timer, no calls meanwhile."""
        while True:
            key = self._credential_key()
            if (
                key in self.unplaced
                and self.throttles[key] > workflow.now()
                and workflow.patched(PATCH_RESUME_RAMP)
            ):
                await self._take_place(key)
            until = self.throttles.get(key)
            now = workflow.now()
            if until is None or until <= now:
                # A notice that came while no attempt was in flight (a continued-as-new run's status still says
                # Running when it subscribes again) has been waited out here: it must not end the next attempt.
                if self.interrupt == Interrupt.THROTTLED and workflow.patched(PATCH_WAITED_OUT):
                    self.interrupt = None
                return
            if self.status.phase != Phase.PAUSED or self.status.resume_at != until:
                self._move(
                    Phase.PAUSED,
                    pause_reason=PauseReason.RATE_LIMITED,
                    reason="RateLimited",
                    resume_at=until,
                    message=f"{key} is rate limited; resuming at {until.isoformat()}",
                )
            try:
                await self._interruptible(
                    workflow.wait_condition(
                        functools.partial(self._throttle_moved, key, until),
                        timeout=(until - now).total_seconds(),
                        timeout_summary=f"rate limited: resume at {until.isoformat()}",
                    ),
                    {Interrupt.CANCEL, Interrupt.PAUSE},
                )
            except TimeoutError:
                pass
            except Interrupted as interrupted:
                if interrupted.kind != Interrupt.PAUSE:
                    raise
                await self._manual_pause()

    async def _manual_pause(self, next_phase: Phase = Phase.CLAIMING) -> None:
        """Paused(Manual) until `resume`, or Failed after timeouts.pausedSeconds."""
        self.resume_requested = False
        limit = self.spec.timeouts.paused_seconds
        self._move(
            Phase.PAUSED,
            pause_reason=PauseReason.MANUAL,
            reason="Paused",
            message=self.pause_message or "paused by request",
        )
        await self._renew_claim_for(workflow.now() + timedelta(seconds=limit))
        await self._wait_signal(lambda: self.resume_requested, limit, "resume", "wait for resume")
        self.resume_requested = False
        self._move(next_phase, reason="Resumed", message="resumed by request")

    async def _wait_for_input(self, task: TaskPause) -> str:
        self.pending_input = None
        self._move(
            Phase.PAUSED,
            pause_reason=PauseReason.INPUT_REQUIRED,
            reason="InputRequired",
            message=task.message or "the agent needs input",
        )
        await self._wait_signal(
            lambda: self.pending_input is not None,
            self.spec.timeouts.paused_seconds,
            "input",
            "wait for input",
        )
        text, self.pending_input = self.pending_input or "", None
        return text

    async def _wait_for_credential(self, task: TaskPause, refreshes_before_call: int) -> None:
        """Paused(CredentialExpired) until the credential rotates. A rotation that arrived while the refused
        call was still under way counts: the run goes on at once instead of waiting for another."""
        if self.credential_refreshes > refreshes_before_call:
            return
        self._move(
            Phase.PAUSED,
            pause_reason=PauseReason.CREDENTIAL_EXPIRED,
            reason="CredentialExpired",
            message=task.message or f"credential of {self._model().name} was refused",
        )
        await self._wait_signal(
            lambda: self.credential_refreshes > refreshes_before_call,
            self.spec.timeouts.paused_seconds,
            "credential_refreshed",
            "wait for a refreshed credential",
        )

    async def _wait_signal(self, arrived: Any, limit: int, signal: str, summary: str) -> None:
        try:
            await self._interruptible(
                workflow.wait_condition(arrived, timeout=limit, timeout_summary=summary), {Interrupt.CANCEL}
            )
        except TimeoutError as err:
            raise RunFailed(
                f"{self.status.pause_reason}Timeout",
                f"no `{signal}` signal within timeouts.pausedSeconds ({limit}s)",
            ) from err

    # --- retries ------------------------------------------------------------------------------------------

    async def _retry_or_fail(self, failed: AttemptFailed) -> None:
        policy = self.spec.retry_policy
        self.status.retries += 1
        if self.status.retries > policy.max_retries:
            raise RunFailed(failed.reason, f"{failed.message} (after {policy.max_retries} retries)")
        delay = equal_jitter_backoff(
            self.status.retries,
            policy.backoff_seconds,
            policy.max_backoff_seconds,
            workflow.random().random(),
        )
        resume_at = workflow.now() + timedelta(seconds=delay)
        self._move(
            Phase.PENDING,
            reason="RetryBackoff",
            resume_at=resume_at,
            message=f"attempt {self.status.attempt} failed ({failed.reason}: {failed.message}); "
            f"retry {self.status.retries} of {policy.max_retries} at {resume_at.isoformat()}",
        )
        try:
            await self._interruptible(
                workflow.sleep(delay, summary=f"backoff before retry {self.status.retries}"),
                {Interrupt.CANCEL, Interrupt.PAUSE},
            )
        except Interrupted as interrupted:
            if interrupted.kind != Interrupt.PAUSE:
                raise
            await self._manual_pause()

    # --- teardown -----------------------------------------------------------------------------------------

    async def _teardown(self, fence: bool = True, release: bool = True) -> None:
        """Fence-then-release: bump the fence (the old holder's writes are rejected from now on), delete the
        sandbox and, when fenced, confirm it is gone, then release the claim. Raises RunFailed when any step
        cannot be done: a retry must never start while the old holder may still act.

        Shielded: a cancellation that arrives meanwhile waits until the teardown is complete."""
        if not workflow.patched(PATCH_SHIELDED_TEARDOWN):  # histories recorded before the shield
            await self._teardown_steps(fence, release)
            return
        steps = asyncio.ensure_future(self._teardown_steps(fence, release))
        try:
            await asyncio.shield(steps)
        except asyncio.CancelledError:
            await steps
            raise

    async def _teardown_steps(self, fence: bool, release: bool) -> None:
        try:
            if fence and self.claim_fence is not None and self.spec.work_item_ref is not None:
                fenced = await self._activity(
                    Activity.FENCE_WORK_ITEM,
                    ClaimUpdate(
                        run=self.run_ref, work_item_ref=self.spec.work_item_ref, fence=self.claim_fence
                    ),
                    Claim,
                    start_to_close=60,
                    summary=f"fence {self.spec.work_item_ref}",
                )
                self.claim_fence = fenced.fence
                assert self.status.work_item is not None
                self.status.work_item.fence = fenced.fence
            await self._release_sandbox(confirm=fence)
            if release:
                await self._release_claim()
        except ActivityError as err:
            raise RunFailed("TeardownFailed", f"could not fence and release safely: {_cause(err)}") from err

    async def _release_sandbox(self, confirm: bool) -> None:
        if self.sandbox is None:
            return
        if self.sandbox.kind != "external":
            await self._activity(
                Activity.RELEASE_SANDBOX,
                SandboxRelease(run=self.run_ref, sandbox=self.sandbox, confirm=confirm),
                None,
                start_to_close=300,
                heartbeat=AGENT_HEARTBEAT_TIMEOUT,
                summary=f"delete sandbox {self.sandbox.name}"
                + (" and confirm it is gone" if confirm else ""),
            )
        set_condition(
            self.status,
            ConditionType.SANDBOX_READY,
            False,
            "Released",
            self.sandbox.name,
            workflow.now(),
            self.run_input.generation,
        )
        self.sandbox = None
        self.status.sandbox = None

    async def _release_claim(self) -> None:
        ref = self.spec.work_item_ref
        if ref is None or self.claim_fence is None:
            return
        await self._activity(
            Activity.RELEASE_WORK_ITEM,
            ClaimUpdate(run=self.run_ref, work_item_ref=ref, fence=self.claim_fence),
            None,
            start_to_close=60,
            summary=f"release {ref}",
        )
        set_condition(
            self.status,
            ConditionType.WORK_ITEM_CLAIMED,
            False,
            "Released",
            ref,
            workflow.now(),
            self.run_input.generation,
        )
        self.claim_fence = None

    async def _renew_claim_for(self, until: datetime) -> None:
        """A pause holds the claim: extend the lease to cover it (heartbeats are not renewing it)."""
        ref = self.spec.work_item_ref
        if ref is None or self.claim_fence is None:
            return
        lease = int((until - workflow.now()).total_seconds()) + CLAIM_LEASE_SECONDS
        await self._activity(
            Activity.RENEW_CLAIM,
            ClaimUpdate(run=self.run_ref, work_item_ref=ref, fence=self.claim_fence, lease_seconds=lease),
            Claim,
            start_to_close=60,
            summary=f"hold {ref} through the pause",
        )

    async def _cancel_teardown(self, reason: str) -> None:
        """Shielded: runs to the end whatever else is signalled; the agent's task was cancelled already."""
        self.interrupt = None
        self._move(Phase.CANCELLING, reason="Cancelling", message=reason)
        try:
            await self._teardown()
        except RunFailed as teardown:
            reason = f"{reason}; {teardown.message}"
        for scope in list(self.queued):
            await self._withdraw(scope)
        self._move(Phase.CANCELLED, reason="Cancelled", message=reason)

    async def _finish(self) -> None:
        """Free the run's slots and subscriptions, then flush the last status (bounded)."""
        for scope in list(self.slots):
            await self._withdraw(scope)
        for key in self.subscribed:
            await self._entity_signal(
                "CredentialThrottle",
                credential_workflow_id(key),
                "unsubscribe",
                CredentialSubscription(run_id=self._run_id()),
            )
        self.subscribed = []
        try:
            await workflow.wait_condition(
                lambda: self._mirrored_revision >= self.status.revision,
                timeout=MIRROR_FLUSH_SECONDS,
                timeout_summary="flush the last status",
            )
        except TimeoutError:
            workflow.logger.warning(
                "final status (revision %d) not mirrored yet; the bridge reconciles it", self.status.revision
            )

    async def _continue_as_new(self) -> None:
        await workflow.wait_condition(
            lambda: self._mirrored_revision >= self.status.revision, timeout=MIRROR_FLUSH_SECONDS
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        carry = RunCarry(
            status=self.status,
            resolution=self.resolution,
            agent_index=self.agent_index,
            on_fallback=self.on_fallback,
            consecutive_limits=self.consecutive_limits,
            throttles=self.throttles,
            strikes=self.strikes,
            unplaced=self.unplaced,
            slots=self.slots,
            claim_fence=self.claim_fence,
        )
        workflow.continue_as_new(self.run_input.model_copy(update={"carry": carry}))

    # --- entities -----------------------------------------------------------------------------------------

    async def _subscribe_credentials(self) -> None:
        assert self.resolution is not None
        keys: list[str] = []
        for agent in self.resolution.agents:
            for model in (agent.model, agent.fallback_model):
                if model is not None and (key := model.throttle_key(self.run_input.namespace)) not in keys:
                    keys.append(key)
        for key in keys:
            if key not in self.subscribed:
                notice = await self._entity_signal(
                    "CredentialThrottle",
                    credential_workflow_id(key),
                    "subscribe",
                    CredentialSubscription(run_id=self._run_id()),
                )
                self.subscribed.append(key)
                if notice is not None:  # limited right now: pause before the first call
                    self.credential_throttled(notice)

    async def _entity_signal(
        self, kind: EntityKind, workflow_id: str, signal: str, arg: KsquadModel
    ) -> ThrottleNotice | None:
        message = EntitySignal(
            workflow=kind, workflow_id=workflow_id, signal=signal, arg=arg.model_dump(mode="json")
        )
        summary = f"{signal} -> {workflow_id}"
        if workflow.patched(PATCH_LOCAL_ENTITY_SIGNALS):
            # Two short RPCs from this worker's own client: as a local activity the server dispatches no task
            # and records one marker. Every run sends at least two (subscribe, unsubscribe); as local activities
            # a run costs 9-17% less CPU (worker, Temporal and agent; three interleaved measurements).
            notice: ThrottleNotice | None = await workflow.execute_local_activity(
                Activity.SIGNAL_WITH_START.value,
                message,
                result_type=ThrottleNotice | None,  # type: ignore[arg-type]  # a credential subscription's answer
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=_RETRY_BOOKKEEPING,
                summary=summary,
            )
            return notice
        return await self._activity(
            Activity.SIGNAL_WITH_START,
            message,
            ThrottleNotice | None,  # type: ignore[arg-type]
            start_to_close=30,
            summary=summary,
        )

    # --- helpers ------------------------------------------------------------------------------------------

    def _run_id(self) -> str:
        return self.run_input.workflow_id

    def _agent(self) -> ResolvedAgent:
        assert self.resolution is not None
        return self.resolution.agents[self.agent_index]

    def _model(self) -> ModelRef:
        agent = self._agent()
        if self.on_fallback and agent.fallback_model is not None:
            return agent.fallback_model
        return agent.model

    def _credential_key(self) -> str:
        if self.resolution is None:
            return ""
        return self._model().throttle_key(self.run_input.namespace)

    def _contract(self, attempt: int, fence: int) -> ExecutionContract:
        return ExecutionContract(
            run=RunIdentity(
                namespace=self.run_input.namespace,
                name=self.run_input.name,
                uid=self.run_input.uid,
                attempt=attempt,
                fence=fence,
                triggered_by=self.run_input.triggered_by,
                work_item_ref=self.spec.work_item_ref,
            ),
            inputs=self.spec.inputs,
            agent=self._agent(),
            model=self._model(),
        )

    async def _interruptible(
        self,
        aw: Awaitable[T],
        kinds: set[Interrupt],
        timeout: float | None = None,  # noqa: ASYNC109
        deadline_summary: str | None = None,
    ) -> T:
        """Await `aw` unless an interrupt of `kinds` arrives first: then cancel it (an activity's cancellation
        completes first) and raise Interrupted. With `timeout`, raise PhaseTimeout when it runs out."""
        if self.interrupt in kinds:
            assert self.interrupt is not None
            kind, self.interrupt = (
                self.interrupt,
                (self.interrupt if self.interrupt == Interrupt.CANCEL else None),
            )
            if asyncio.iscoroutine(aw):
                aw.close()  # never started: close it, or Python warns that it was never awaited
            raise Interrupted(kind)
        task = asyncio.ensure_future(aw)
        try:
            await workflow.wait_condition(
                lambda: task.done() or self.interrupt in kinds,
                timeout=timeout,
                timeout_summary=deadline_summary,
            )
        except TimeoutError:
            await _cancel_and_wait(task)
            raise PhaseTimeout() from None
        except asyncio.CancelledError:
            await _cancel_and_wait(task)
            raise
        if task.done():
            return task.result()
        assert self.interrupt is not None
        kind = self.interrupt
        if kind != Interrupt.CANCEL:
            self.interrupt = None
        await _cancel_and_wait(task)
        raise Interrupted(kind)

    async def _activity(
        self,
        name: Activity,
        arg: Any,
        result_type: type[T] | None,
        *,
        summary: str,
        task_queue: str | None = None,
        deadline: datetime | None = None,
        start_to_close: float | None = None,
        heartbeat: timedelta | None = None,
        retry: RetryPolicy | None = None,
        cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
    ) -> T:
        """Run an activity by name. A `deadline` (a phase's bound, from the Run's timeouts) bounds it as a
        whole, queue time and retries included; without one it gets `start_to_close` per attempt and
        `_RETRY_BOOKKEEPING`'s attempts."""
        schedule_to_close = None
        if deadline is not None:
            schedule_to_close = timedelta(seconds=max(1.0, (deadline - workflow.now()).total_seconds()))
        result: T = await workflow.execute_activity(
            name.value,
            arg,
            result_type=result_type,
            task_queue=task_queue,
            schedule_to_close_timeout=schedule_to_close,
            start_to_close_timeout=timedelta(seconds=start_to_close)
            if start_to_close
            else timedelta(seconds=60),
            heartbeat_timeout=heartbeat,
            retry_policy=retry or (_RETRY_UNTIL_DEADLINE if deadline is not None else _RETRY_BOOKKEEPING),
            cancellation_type=cancellation_type,
            summary=summary,
        )
        return result

    # --- status -------------------------------------------------------------------------------------------

    def _move(
        self,
        phase: Phase,
        *,
        reason: str,
        message: str,
        pause_reason: PauseReason | None = None,
        resume_at: datetime | None = None,
    ) -> None:
        self.status = transition(
            self.status,
            phase,
            workflow.now(),
            reason=reason,
            message=message,
            pause_reason=pause_reason,
            resume_at=resume_at,
            generation=self.run_input.generation,
        )
        workflow.set_current_details(f"**{phase.value}**: {message}")
        self._unsent_events.append(
            PhaseEvent(
                revision=self.status.revision, phase=phase, reason=reason, message=message, at=workflow.now()
            )
        )
        self._publish()

    def _publish(self) -> None:
        """Search attributes now; the status to the bridge in the background, coalesced (latest wins)."""
        if self.status.revision <= self._mirrored_revision:
            return
        self._upsert_search_attributes()
        if self._mirror_task is None or self._mirror_task.done():
            self._mirror_task = asyncio.create_task(self._mirror())

    async def _mirror(self) -> None:
        while self._mirrored_revision < self.status.revision:
            events, self._unsent_events = self._unsent_events, []
            snapshot = StatusSnapshot(
                namespace=self.run_input.namespace,
                name=self.run_input.name,
                uid=self.run_input.uid,
                status=self.status.model_copy(deep=True),
                events=events[-MAX_EVENTS_PER_SNAPSHOT:],
                events_dropped=max(0, len(events) - MAX_EVENTS_PER_SNAPSHOT),
            )
            try:
                await workflow.execute_activity(
                    Activity.MIRROR_STATUS.value,
                    snapshot,
                    task_queue=BRIDGE_TASK_QUEUE,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
                    ),
                    summary=f"mirror status r{snapshot.status.revision}: {snapshot.status.phase.value}",
                )
            except ActivityError as err:  # only a non-retryable error ends here; the next change tries again
                workflow.logger.warning("mirroring status r%d failed: %s", snapshot.status.revision, err)
            self._mirrored_revision = max(self._mirrored_revision, snapshot.status.revision)

    def _upsert_search_attributes(self) -> None:
        wanted: dict[str, Any] = {
            sa.PHASE.name: self.status.phase.value,
            sa.NAMESPACE.name: self.run_input.namespace,
            sa.AGENT.name: self.status.agent,
            sa.TRIGGERED_BY.name: self.run_input.triggered_by,
            sa.RESUME_AT.name: self.status.resume_at,
            sa.ATTEMPT.name: self.status.attempt,
        }
        keys = {k.name: k for k in sa.ALL}
        updates = []
        for name, value in wanted.items():
            if self._search_attributes.get(name, _UNSET) == value:
                continue
            self._search_attributes[name] = value
            key = keys[name]
            updates.append(key.value_unset() if value is None else key.value_set(value))
        if updates:
            workflow.upsert_search_attributes(updates)


_UNSET = object()
_AGENT_ERRORS = {e.value for e in AgentError}


async def _cancel_and_wait(task: "asyncio.Future[Any]") -> None:
    if task.done():
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, ActivityError, TemporalCancelledError, ApplicationError):
        await task


def _cause(err: BaseException) -> str:
    """The innermost message of a Temporal failure chain: what actually went wrong."""
    while isinstance(err, ActivityError | TemporalTimeoutError) and err.cause is not None:
        err = err.cause
    if isinstance(err, TemporalTimeoutError):
        return f"timed out ({err.type.name if err.type else 'timeout'})"
    return str(err) or type(err).__name__
