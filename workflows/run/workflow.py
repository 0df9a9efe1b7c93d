"""RunWorkflow: one Run's whole lifecycle as a durable Temporal workflow.

    Pending -> Queued? -> Claiming -> Running -> Succeeded | Failed | Cancelled, plus Paused and Cancelling.

Durable timers implement rate-limit resume, retry backoff and every phase's timeout; activities (typed stubs,
`workflows.activity_types`) do the side effects. The parts, each owning its state (`workflows.run.state`):
the status mirror (status, revision, events, search attributes), the throttles (credential limits and the
resume ramp), the holdings (claim and sandbox, fence-then-release), the interrupt slot. The flow, in `_lifecycle`:

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
import functools
from collections.abc import Sequence
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.workflow import ActivityCancellationType

from workflows import metrics
from workflows.activity_types import (
    USAGE_DETAIL,
    AgentError,
    AgentInvocation,
    AgentResult,
    ContinueTask,
    FailureDetails,
    OutputsRequest,
    RateLimitDetails,
    RunEnding,
    Sandbox,
    SandboxRequest,
    TaskPause,
    invoke_agent,
    publish_outputs,
    record_run_ending,
)
from workflows.entity_types import (
    DEFAULT_RESUME_PER_SECOND,
    SlotNotice,
    ThrottleNotice,
    gate_workflow_id,
)
from workflows.envelope import Warrant, continued_by_itself
from workflows.inbox import Accepts, Handler, Inbox, Proof, Refused, Sender, printable, refused
from workflows.patches import Patches
from workflows.policies import (
    equal_jitter_backoff,
)
from workflows.run.gates import Gates
from workflows.run.holdings import Holdings
from workflows.run.interrupts import (
    ANY_INTERRUPT,
    CANCEL_OR_PAUSE,
    Interrupt,
    Interrupted,
    Interrupts,
    PhaseTimeout,
)
from workflows.run.mirror import StatusMirror
from workflows.run.options import AGENT_HEARTBEAT_TIMEOUT, call, call_local, later, tenant_priority
from workflows.run.outcomes import AttemptFailed, RateLimitPause, Reroute, RunFailed, cause, refusal
from workflows.run.pauses import Pauses
from workflows.run.references import References
from workflows.run.route import Router
from workflows.run.state import RunCarry, RunInput
from workflows.run.throttles import Throttles
from workflows.signals import STATE_QUERY, RunSignal
from workflows.status import PauseReason, Phase, RunStatus, UsageStatus, WorkflowRef

_AGENT_ERRORS = [e.value for e in AgentError]  # in the enum's order: a set's would be the hash seed's
# Outputs are published by a local activity (one short write: a ConfigMap, or nothing embedded); runs that
# scheduled it as an activity before replay as they ran.
LOCAL_PUBLISH_PATCH = "publish-outputs-local"
# Every ending is recorded on the Run's work item and its agent's checkpoints forgotten (workflow.patched: runs
# that ended without it replay as they ran).
RUN_ENDING_PATCH = "run-ending-recorded"
# A new Run's first status (Pending, resolving references) goes to the bridge with the next one: the bridge showed
# Pending when it started the workflow (its acknowledgement), and every wait before the next phase (a reference
# missing, a queue) is a change of its own that sends it. One status write, one activity and one workflow task
# less a Run (workflow.patched: runs that sent it alone replay as they ran).
FIRST_STATUS_WITH_NEXT_PATCH = "first-status-with-next"
# The agent call outlives the attempt's deadline by this much: the deadline cancels it and the workflow waits for
# the cancellation to reach the agent, instead of finding the call timed out by itself and starting the next
# attempt beside an agent still at work.
AGENT_CANCEL_GRACE_SECONDS = 60.0


@workflow.defn(name="RunWorkflow")
class RunWorkflow:
    @workflow.init
    def __init__(self, input: RunInput) -> None:
        self.run_input = input
        self.envelope = input.envelope()
        self.spec = input.spec
        self.run_ref = input.run_ref
        # A carry is this workflow's own (its continue-as-new); one handed to it by a starter is never taken.
        carried = input.carry if continued_by_itself() else None
        carry = carried or RunCarry(status=RunStatus(triggered_by=input.triggered_by))
        self.patches = Patches()
        self.mirror = StatusMirror(input, carry.status, self.patches)
        self.interrupts = Interrupts(self.patches)
        self.throttles = Throttles(carry.throttles, input.workflow_id, self.warrant, self.patches)
        self.route = Router(input, carry.route, carry.resolution, self.mirror, self.throttles)
        self.gates = Gates(
            carry.slots,
            input.workflow_id,
            self.spec.timeouts.queued_seconds,
            self.mirror,
            self.interrupts,
            self.warrant,
        )
        self.references = References(self.envelope, self.mirror, self.interrupts)
        self.held = Holdings(
            self.run_ref,
            self.spec,
            carry.claim_fence,
            self.mirror,
            self.interrupts,
            self.warrant,
            self.patches,
        )
        self.pauses = Pauses(self.spec, self.mirror, self.interrupts, self.held)
        self.cancel_reason = ""
        self.inbox = self._inbox(carry.nonces)
        # Model usage: what earlier workflows of this Run counted (continued as new only between attempts), and
        # each attempt's running total since.
        self.usage_carried = carry.status.usage or UsageStatus()
        self.usage_by_attempt: dict[int, UsageStatus] = {}

    @property
    def status(self) -> RunStatus:
        return self.mirror.status

    def warrant(self) -> Warrant:
        """What every activity that acts is given: the envelope and the resolution the bridge sealed for this
        execution (workflows.envelope)."""
        assert self.route.resolution is not None, "no activity acts before references are resolved"
        return Warrant(envelope=self.envelope, resolution=self.route.resolution)

    # --- signals and query --------------------------------------------------------------------------------

    def _inbox(self, nonces: list[str]) -> Inbox:
        """Every signal the Run takes (workflows.inbox): only `cancel` from anyone; what users ask for (pause,
        resume, input) and credential rotations from the bridge, which checked who asked; limits and slots from
        the entity workflows."""
        bridge = frozenset({Sender.BRIDGE})
        entities = frozenset({Sender.WORKFLOW, Sender.WORKER})
        return Inbox(
            "RunWorkflow",
            {
                RunSignal.CANCEL: Handler(Accepts(str, optional=True, in_clear=True), self.cancel),
                RunSignal.PAUSE: Handler(Accepts(str, optional=True, proven_by=bridge), self.pause),
                RunSignal.RESUME: Handler(Accepts(proven_by=bridge), self.resume),
                RunSignal.CREDENTIAL_REFRESHED: Handler(
                    Accepts(str, optional=True, proven_by=bridge), self.credential_refreshed
                ),
                RunSignal.INPUT: Handler(Accepts(str, proven_by=bridge), self.input),
                RunSignal.REFERENCES_UPDATED: Handler(Accepts(proven_by=bridge), self.references_updated),
                RunSignal.CREDENTIAL_THROTTLED: Handler(
                    Accepts(ThrottleNotice, proven_by=entities), self.credential_throttled
                ),
                RunSignal.SLOT_GRANTED: Handler(Accepts(SlotNotice, proven_by=entities), self.slot_granted),
                RunSignal.SLOT_QUEUED: Handler(Accepts(SlotNotice, proven_by=entities), self.slot_queued),
            },
            nonces,
            self.patches.patched,
        )

    @workflow.signal(dynamic=True)
    def signal(self, name: str, args: Sequence[RawValue]) -> None:
        self.inbox.deliver(name, args)

    def cancel(self, reason: str | None, _: Proof | None = None) -> None:
        """Cancel the run from any phase (also: `temporal workflow cancel`, kubectl delete, the annotation)."""
        self.cancel_reason = printable(reason) if reason else "cancel requested"
        self.interrupts.pending = Interrupt.CANCEL

    def pause(self, reason: str | None, _: Proof | None) -> None:
        """Paused(Manual) until `resume`. From another pause (a rate limit, input, a credential) too: the manual
        pause takes over, and after `resume` the run waits again for what it was waiting for."""
        self.pauses.requested(printable(reason) if reason else None)

    def resume(self, _: None, __: Proof | None) -> None:
        self.pauses.resumed()

    def credential_refreshed(self, credential: str | None, _: Proof | None) -> None:
        """A credential was rotated; `credential` ("<namespace>/<secret>") names which, None means any."""
        if credential is None or credential == self.route.credential_key():
            self.pauses.credential_refreshes += 1

    def input(self, text: str, _: Proof | None) -> None:
        self.pauses.pending_input = text

    def references_updated(self, _: None, __: Proof | None) -> None:
        """From the embedded stack: an object this run may reference changed; resolve again now. (On a cluster
        the bridge sends none: a run waiting for references looks again on its backoff, at most 30 s apart.)"""
        self.references.changed = True

    def credential_throttled(self, notice: ThrottleNotice, _: Proof | None = None) -> None:
        self.throttles.noticed(notice)
        in_flight = self.status.phase in (Phase.CLAIMING, Phase.RUNNING)
        # A notice of a limit that has already ended (it crossed the run's own resumption) stops nothing.
        expired = notice.until <= workflow.now()
        if (
            in_flight
            and not expired
            and self.interrupts.pending is None
            and notice.key == self.route.credential_key()
        ):
            self.interrupts.pending = Interrupt.THROTTLED

    def slot_granted(self, notice: SlotNotice, proof: Proof | None) -> None:
        if self._from_gate(RunSignal.SLOT_GRANTED, notice, proof):
            self.gates.granted(notice)

    def slot_queued(self, notice: SlotNotice, proof: Proof | None) -> None:
        if self._from_gate(RunSignal.SLOT_QUEUED, notice, proof):
            self.gates.queued_at(notice)

    def _from_gate(self, signal: RunSignal, notice: SlotNotice, proof: Proof | None) -> bool:
        """A slot's notice comes from that scope's own gate, for this execution of the run (not an earlier Run of
        its name, whose notices a copy could bring)."""
        if proof is None:
            return True  # a history from before proofs
        if proof.sender != gate_workflow_id(notice.scope):
            refused(
                "RunWorkflow", signal, Refused("wrong_sender", f"{notice.scope}'s notice from {proof.sender}")
            )
            return False
        if notice.chain is not None and notice.chain != workflow.info().first_execution_run_id:
            refused(
                "RunWorkflow", signal, Refused("replayed", f"{notice.scope}'s notice for another execution")
            )
            return False
        return True

    @workflow.query(name=STATE_QUERY)
    def state(self) -> RunStatus:
        return self.status

    # --- the lifecycle ------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: RunInput) -> RunStatus:
        self.patches.current()  # at the start: a history is current or not from its first workflow task
        info = workflow.info()
        self.status.workflow = WorkflowRef(
            id=info.workflow_id, run_id=info.run_id, first_run_id=info.first_execution_run_id
        )
        if not continued_by_itself() or input.carry is None:
            self.mirror.move(
                Phase.PENDING,
                reason="Created",
                message="resolving references",
                send=not self.patches.patched(FIRST_STATUS_WITH_NEXT_PATCH),
            )
        try:
            await self._lifecycle()
        except (asyncio.CancelledError, Interrupted) as err:
            if isinstance(err, Interrupted) and err.kind != Interrupt.CANCEL:
                raise AssertionError(f"unhandled interrupt {err.kind}") from err
            temporal_cancel = isinstance(err, asyncio.CancelledError)
            # A reason signalled with the cancellation (the bridge's "the Run was deleted") wins over the generic one.
            await self._cancel_teardown(self.cancel_reason or "cancelled through Temporal")
            await self._finish()
            if temporal_cancel:
                raise  # the workflow ends Canceled in Temporal too
            return self.status
        except RunFailed as err:
            message = err.message
            try:
                await self.held.teardown()
            except RunFailed as teardown:
                message = f"{message}; {teardown.message}"
            self.mirror.move(Phase.FAILED, reason=err.reason, message=message)
        except FailureError as err:
            # Anything else that failed for good (an activity past its retries): the run ends Failed with the
            # reason on its status, not a failed workflow behind a Run that keeps showing its last phase.
            message = (
                f"{err.message}: {err.cause}" if err.cause is not None and str(err.cause) else err.message
            )
            try:
                await self.held.teardown()
            except (RunFailed, FailureError) as teardown:
                message = f"{message}; teardown: {getattr(teardown, 'message', teardown)}"
            self.mirror.move(Phase.FAILED, reason=refusal(err) or "InternalError", message=message[:2000])
        await self._finish()
        return self.status

    async def _lifecycle(self) -> None:
        await self._resolve()
        for notice in await self.throttles.subscribe(self.route.credential_keys()):
            self.credential_throttled(notice)  # limited right now: pause before the first call
        await self._admit()
        while True:
            if workflow.info().is_continue_as_new_suggested():
                await self._continue_as_new()
            try:
                await self._attempt()
                return
            except RateLimitPause as pause:  # the agent's task ended (FAILED): nothing to fence
                await self.held.teardown(fence=False, release=False)
                await self.held.renew_for(pause.until)
            except Reroute as reroute:
                await self.held.teardown()
                self.route.reroute(reroute.agent_index)
                self.mirror.move(Phase.CLAIMING, reason="Rerouted", message=reroute.message)
            except Interrupted as interrupted:
                if interrupted.kind == Interrupt.CANCEL:
                    raise
                # The agent was stopped mid-task: fence its writes, keep the claim through the pause.
                await self.held.teardown(fence=True, release=False)
                if interrupted.kind == Interrupt.PAUSE:
                    await self.pauses.manual()
                else:  # throttled by another run's limit
                    await self.held.renew_for(
                        self.throttles.until(self.route.credential_key()) or workflow.now()
                    )
            except AttemptFailed as failed:
                await self.held.teardown()
                await self._retry_or_fail(failed)

    async def _attempt(self) -> None:
        await self._wait_while_throttled()
        self.status.attempt += 1
        attempt = self.status.attempt
        agent = self.route.agent()
        self.status.agent, self.status.model = agent.name, self.route.model().name
        self.mirror.move(Phase.CLAIMING, reason="Claiming", message=f"attempt {attempt}: claiming")
        claim_deadline = later(self.spec.timeouts.claim_seconds)
        fence = await self.held.claim(attempt, claim_deadline)
        if agent.endpoint:  # an already-running A2A agent: nothing to make
            sandbox = Sandbox(name=agent.name, kind="external", endpoint=agent.endpoint)
            self.held.hold_sandbox(sandbox)
        else:
            timeout = max(1, int((claim_deadline - workflow.now()).total_seconds()))
            request = SandboxRequest(
                warrant=self.warrant(),
                route=self.route.choice(),
                attempt=attempt,
                fence=fence,
                timeout_seconds=timeout,
            )
            sandbox = await self.held.acquire_sandbox(request, claim_deadline, attempt)
        self.mirror.move(
            Phase.RUNNING, reason="Running", message=f"attempt {attempt}: {agent.name} on {sandbox.name}"
        )
        result = await self._invoke(attempt, fence, sandbox)
        outputs = OutputsRequest(
            warrant=self.warrant(),
            attempt=attempt,
            fence=fence,
            outputs=result.outputs,
            artifacts=result.artifacts,
        )
        if self.patches.patched(LOCAL_PUBLISH_PATCH):
            published = await call_local(publish_outputs, outputs, summary="publish outputs")
        else:
            published = await call(publish_outputs, outputs, summary="publish outputs")
        self.status.outputs = published.outputs
        self.status.artifacts = result.artifacts
        await self.held.release_sandbox(confirm=False)
        await self.held.release_claim()
        await self.throttles.cleared(self.route.credential_key())
        self.mirror.move(
            Phase.SUCCEEDED, reason="Succeeded", message=result.summary or f"attempt {attempt} succeeded"
        )

    # --- Pending: references ------------------------------------------------------------------------------

    async def _resolve(self) -> None:
        while self.route.resolution is None:
            try:
                self.route.resolution = await self.references.resolve()
            except Interrupted as interrupted:
                await self.pauses.hold_or_raise(interrupted, Phase.PENDING)

    # --- Queued: concurrency gates ------------------------------------------------------------------------

    async def _admit(self) -> None:
        assert self.route.resolution is not None
        # One global order of scopes: no deadlock between runs.
        for scope in sorted(self.route.resolution.scopes, key=lambda s: s.key):
            while scope.key not in self.gates.slots:
                try:
                    await self.gates.request(scope, self.route.share())
                except Interrupted as interrupted:
                    await self.pauses.hold_or_raise(interrupted, Phase.QUEUED)

    # --- Running ------------------------------------------------------------------------------------------

    async def _invoke(self, attempt: int, fence: int, sandbox: Sandbox) -> AgentResult:
        """The agent's task, in turns: a fallback model, input or a refreshed credential continue it."""
        run_deadline = later(self.spec.timeouts.run_seconds)
        turn = 0
        follow_up: ContinueTask | None = None
        while True:
            refreshes_before_call = self.pauses.credential_refreshes
            budget_left = self._token_budget_left()
            invocation = AgentInvocation(
                warrant=self.warrant(),
                route=self.route.choice(),
                attempt=attempt,
                fence=fence,
                sandbox=sandbox,
                turn=turn,
                continue_task=follow_up,
                token_budget_left=budget_left,
            )
            message_id = invocation.message_id
            remaining = (run_deadline - workflow.now()).total_seconds()
            agent_call = call(
                invoke_agent,
                invocation,
                start_to_close=max(1.0, remaining) + AGENT_CANCEL_GRACE_SECONDS,
                heartbeat=AGENT_HEARTBEAT_TIMEOUT,
                retry=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_attempts=5,
                    non_retryable_error_types=_AGENT_ERRORS,
                ),
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                summary=f"{self.route.agent().name}: {self.route.model().name}, message {message_id}",
                priority=tenant_priority(self.run_ref.namespace),
            )
            try:
                result = await self.interrupts.interruptible(
                    agent_call,
                    ANY_INTERRUPT,
                    timeout=max(0.001, remaining),
                    deadline_summary=f"attempt {attempt}: timeouts.runSeconds",
                )
                self.route.answered()
                self._count_usage(attempt, result.usage)
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
                if app is not None and len(app.details) > USAGE_DETAIL:
                    self._count_usage(attempt, UsageStatus.model_validate(app.details[USAGE_DETAIL]))
                if refused := refusal(err):
                    raise RunFailed(refused, cause(err)) from err
                if kind == AgentError.TOKEN_BUDGET_SPENT:
                    raise RunFailed(kind, app.message if app is not None else cause(err)) from err
                if kind == AgentError.RATE_LIMITED:
                    await self.route.on_rate_limit(RateLimitDetails.model_validate(details))
                    turn, follow_up = turn + 1, None  # the fallback model answers a fresh message
                    continue
                if kind not in (AgentError.INPUT_REQUIRED, AgentError.CREDENTIAL_EXPIRED):
                    if app is not None and kind in _AGENT_ERRORS:
                        message = FailureDetails.model_validate(details).message if details else app.message
                        raise AttemptFailed(str(kind), message) from err
                    raise AttemptFailed("AgentUnavailable", cause(err)) from err
                # The agent's task waits: pause (the running time stops), then continue the same task.
                task = TaskPause.model_validate(details)
                paused_since = workflow.now()
                text = ""
                if kind == AgentError.INPUT_REQUIRED:
                    text = await self.pauses.for_input(task)
                else:
                    await self.pauses.for_credential(task, refreshes_before_call, self.route.model().name)
                run_deadline += workflow.now() - paused_since
                turn += 1
                follow_up = ContinueTask(task_id=task.task_id, context_id=task.context_id, text=text)
                message = f"attempt {attempt}: {self.route.agent().name} continues its task"
                self.mirror.move(Phase.RUNNING, reason="Resumed", message=message)

    def _token_budget_left(self) -> int | None:
        """Tokens the Run may still use, or None without a budget; a Run that has used it all ends here, before
        another call (an attempt that ended on the very call that reached it, then a retry)."""
        assert self.route.resolution is not None
        budget = self.spec.token_budget or self.route.resolution.token_budget
        if budget is None:
            return None
        used = self.status.usage or UsageStatus()
        left = budget - used.input_tokens - used.output_tokens
        if left <= 0:
            raise RunFailed(
                AgentError.TOKEN_BUDGET_SPENT.value,
                f"the Run used {budget - left} of its {budget} token budget: no further model call is made",
            )
        return left

    def _count_usage(self, attempt: int, usage: UsageStatus | None) -> None:
        """The attempt's usage so far (each report is its running total), into the Run's over all attempts."""
        if usage is None:
            return
        self.usage_by_attempt[attempt] = usage
        total = self.usage_carried
        for each in self.usage_by_attempt.values():
            total = total.plus(each)
        self.status.usage = total

    # --- Paused -------------------------------------------------------------------------------------------

    async def _wait_while_throttled(self) -> None:
        """Paused(RateLimited) until the credential's resumeAt: one durable timer, no calls meanwhile."""
        while True:
            key = self.route.credential_key()
            await self.throttles.take_place(
                key,
                self.route.model().resume_per_second or DEFAULT_RESUME_PER_SECOND,
                self.route.share(),
            )
            until = self.throttles.until(key)
            now = workflow.now()
            if until is None or until <= now:
                # A notice that came while no attempt was in flight (a continued-as-new run's status still says
                # Running when it subscribes again) has been waited out here: it must not end the next attempt.
                if self.interrupts.pending == Interrupt.THROTTLED:
                    self.interrupts.pending = None
                return
            bound = self.spec.timeouts.rate_limited_seconds
            budget = bound - self.throttles.state.waited_seconds
            if budget <= 0:
                raise RunFailed(
                    "RateLimitedTimeout",
                    f"{key} kept answering 429: rate limited for timeouts.rateLimitedSeconds ({bound}s) in all",
                )
            if self.status.phase != Phase.PAUSED or self.status.resume_at != until:
                if self.status.pause_reason != PauseReason.RATE_LIMITED:
                    metrics.rate_limit_paused(key)
                self.mirror.move(
                    Phase.PAUSED,
                    pause_reason=PauseReason.RATE_LIMITED,
                    reason="RateLimited",
                    resume_at=until,
                    message=f"{key} is rate limited; resuming at {until.isoformat()}",
                )
            try:
                await self.interrupts.interruptible(
                    workflow.wait_condition(
                        functools.partial(self.throttles.moved, key, until),
                        timeout=min((until - now).total_seconds(), budget),
                        timeout_summary=f"rate limited: resume at {until.isoformat()}",
                    ),
                    CANCEL_OR_PAUSE,
                )
            except TimeoutError:
                if workflow.now() >= until:
                    metrics.resumed_late(key, workflow.now() - until)
            except Interrupted as interrupted:
                self.throttles.state.waited_seconds += (workflow.now() - now).total_seconds()
                await self.pauses.hold_or_raise(interrupted)
                continue
            self.throttles.state.waited_seconds += (workflow.now() - now).total_seconds()

    # --- retries ------------------------------------------------------------------------------------------

    async def _retry_or_fail(self, failed: AttemptFailed) -> None:
        policy = self.spec.retry_policy
        self.status.retries += 1
        retry = self.status.retries
        if retry > policy.max_retries:
            raise RunFailed(failed.reason, f"{failed.message} (after {policy.max_retries} retries)")
        delay = equal_jitter_backoff(
            retry, policy.backoff_seconds, policy.max_backoff_seconds, workflow.random().random()
        )
        resume_at = later(delay)
        self.mirror.move(
            Phase.PENDING,
            reason="RetryBackoff",
            resume_at=resume_at,
            message=f"attempt {self.status.attempt} failed ({failed.reason}: {failed.message}); "
            f"retry {retry} of {policy.max_retries} at {resume_at.isoformat()}",
        )
        try:
            await self.interrupts.interruptible(
                workflow.sleep(delay, summary=f"backoff before retry {retry}"), CANCEL_OR_PAUSE
            )
        except Interrupted as interrupted:
            await self.pauses.hold_or_raise(interrupted)

    # --- the end ------------------------------------------------------------------------------------------

    async def _cancel_teardown(self, reason: str) -> None:
        """Shielded: runs to the end whatever else is signalled; the agent's task was cancelled already."""
        self.interrupts.pending = None
        self.mirror.move(Phase.CANCELLING, reason="Cancelling", message=reason)
        try:
            await self.held.teardown()
        except RunFailed as teardown:
            reason = f"{reason}; {teardown.message}"
        await self.gates.withdraw_queued()
        self.mirror.move(Phase.CANCELLED, reason="Cancelled", message=reason)

    async def _finish(self) -> None:
        """Free the run's slots and subscriptions, record the ending on the work item (and forget the agent's
        checkpoints), then flush the last status (bounded)."""
        await self.gates.release_all()
        await self.throttles.unsubscribe_all()
        if self.route.resolution is not None and self.patches.patched(RUN_ENDING_PATCH):
            ending = RunEnding(
                warrant=self.warrant(),
                attempt=self.status.attempt,
                phase=self.status.phase.value,
                reason=self.status.reason or "",
            )
            await call_local(record_run_ending, ending, summary=f"record the Run's ending ({ending.phase})")
        await self.mirror.flush()

    async def _continue_as_new(self) -> None:
        await self.mirror.flush()
        await workflow.wait_condition(workflow.all_handlers_finished)
        carry = RunCarry(
            status=self.status,
            resolution=self.route.resolution,
            route=self.route.state,
            throttles=self.throttles.state,
            slots=self.gates.slots,
            claim_fence=self.held.claim_fence,
            nonces=self.inbox.nonces,
        )
        workflow.continue_as_new(self.run_input.model_copy(update={"carry": carry}))
