"""RunWorkflow: one Run's whole lifecycle as a durable Temporal workflow.

    Pending -> Queued? -> Claiming -> Running -> Succeeded | Failed | Cancelled, plus Paused and Cancelling.

Durable timers implement rate-limit resume, retry backoff and every phase's timeout; activities (typed stubs,
`workflows.activity_types`) do the side effects. The parts, each owning its state (`workflows.run.state`):
the status mirror (status, revision, events, search attributes), the throttles (credential limits and the
resume ramp), the holdings (claim and sandbox, fence-then-release), the interrupt slot, the agent call (the
agent's task in turns, the Run's model usage), the backoffs (Paused(RateLimited), the retry backoff). The flow,
in `_lifecycle`:

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
from collections.abc import Sequence

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import FailureError

from workflows.activity_types import (
    OutputsRequest,
    RunEnding,
    Sandbox,
    SandboxRequest,
    publish_outputs,
    record_run_ending,
)
from workflows.entity_types import SlotNotice, ThrottleNotice, gate_workflow_id
from workflows.envelope import Warrant, continued_by_itself
from workflows.inbox import Accepts, Handler, Inbox, Proof, Refused, Sender, printable, refused
from workflows.patches import Patches
from workflows.run.agent_call import AgentCall
from workflows.run.backoff import Backoff
from workflows.run.gates import Gates
from workflows.run.holdings import Holdings
from workflows.run.interrupts import Interrupt, Interrupted, Interrupts
from workflows.run.mirror import StatusMirror
from workflows.run.options import call, call_local, later
from workflows.run.outcomes import AttemptFailed, RateLimitPause, Reroute, RunFailed, refusal
from workflows.run.pauses import Pauses
from workflows.run.references import References
from workflows.run.route import Router
from workflows.run.state import RunCarry, RunInput
from workflows.run.throttles import Throttles
from workflows.signals import STATE_QUERY, RunSignal
from workflows.status import ConditionType, Phase, RunStatus, WorkflowRef

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
            carry.slot_asks,
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
        self.inbox = self._inbox(carry.nonces, carry.proof_floor)
        self.agent_call = AgentCall(
            self.run_ref,
            self.spec,
            carry.status.usage,
            self.mirror,
            self.interrupts,
            self.route,
            self.pauses,
            self.warrant,
        )
        self.backoff = Backoff(
            self.spec, self.mirror, self.interrupts, self.route, self.throttles, self.pauses
        )

    @property
    def status(self) -> RunStatus:
        return self.mirror.status

    def warrant(self) -> Warrant:
        """What every activity that acts is given: the envelope and the resolution the bridge sealed for this
        execution (workflows.envelope)."""
        assert self.route.resolution is not None, "no activity acts before references are resolved"
        return Warrant(envelope=self.envelope, resolution=self.route.resolution)

    # --- signals and query --------------------------------------------------------------------------------

    def _inbox(self, nonces: list[str], proof_floor: int) -> Inbox:
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
            floor=proof_floor,
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
                await self.backoff.retry_or_fail(failed)

    async def _attempt(self) -> None:
        await self.backoff.while_throttled()
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
        result = await self.agent_call.invoke(attempt, fence, sandbox)
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
        stopped = self.status.condition(ConditionType.AGENT_STOPPED)
        if stopped is not None and stopped.reason == "CancelUnconfirmed":
            reason = (
                f"{reason}; {stopped.message}"  # the agent's task may go on: say so where the phase is read
            )
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
            slot_asks=self.gates.asks,
            claim_fence=self.held.claim_fence,
            nonces=self.inbox.nonces,
            proof_floor=self.inbox.floor,
        )
        workflow.continue_as_new(self.run_input.model_copy(update={"carry": carry}))
