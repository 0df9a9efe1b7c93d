"""The worker acts only on what it can verify (temporal_client.seal): before it makes a sandbox or calls an
agent, the contract's agent must carry the bridge's seal for that Run, and the endpoint must be that agent's own
or a sandbox this worker sealed for the attempt. Checked here, around the activities, so that no sandbox backend
or agent client can forget it; the sandbox an acquisition returns is sealed here too.

Signals too (temporal_client.proofs): around each signal handler of a ksquad workflow, the proof its payload
carries is checked, unwrapped and handed to the workflow's inbox (workflows.inbox.SIGNAL_PROOF); the signals the
workflows send each other (an entity's notices to runs) are signed on their way out."""

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    HandleSignalInput,
    Interceptor,
    SignalExternalWorkflowInput,
    WorkflowInboundInterceptor,
    WorkflowInterceptorClassInput,
    WorkflowOutboundInterceptor,
)

from activities.metrics import ACTIVITIES_REFUSED
from temporal_client.chains import Chains, ChainUnknown
from temporal_client.proofs import SignalKey, Signing, signing_as
from temporal_client.seal import Copied, Sealer, Unsealed
from workflows.activity_types import (
    ACTING,
    COPY_REFUSED,
    UNSEALED,
    Activity,
    AgentInvocation,
    EntitySignal,
    Sandbox,
    SandboxRequest,
)
from workflows.entity_types import (
    CredentialLimit,
    ResumePlaceRequest,
    SlotRequest,
    credential_workflow_id,
    gate_workflow_id,
)
from workflows.envelope import NotInWarrant, Warrant
from workflows.inbox import SIGNAL_PROOF, Refused, Sender
from workflows.inbox import refused as signal_refused
from workflows.policies import RateLimitThresholds

log = logging.getLogger(__name__)


class SealCheck(Interceptor):
    def __init__(self, sealer: Sealer, chains: Chains) -> None:
        self.sealer = sealer
        self.chains = chains

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Checked(next, self.sealer, self.chains)

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[WorkflowInboundInterceptor]:
        key = self.sealer.signals

        class Proven(_ProvenSignals):
            signal_key = key

        return Proven


class _ProvenSignals(WorkflowInboundInterceptor):
    signal_key: SignalKey

    def init(self, outbound: WorkflowOutboundInterceptor) -> None:
        super().init(_SignedSignals(outbound, self.signal_key))

    async def handle_signal(self, input: HandleSignalInput) -> None:
        """The one entry of every signal into a ksquad workflow, guarded: whatever a signal makes its unwrapping or
        its handler raise is recorded and the signal ignored (an exception let through fails the workflow task on
        every retry, and the workflow takes nothing more, not even a cancel). The inbox refuses what it can name;
        this catches what nobody listed."""
        try:
            await self._handle_signal(input)
        except Exception as err:
            signal_refused(
                workflow.info().workflow_type,
                input.signal,
                Refused("raised", f"handling it raised {type(err).__name__}"),
                known=False,
            )

    async def _handle_signal(self, input: HandleSignalInput) -> None:
        # A ksquad workflow's one dynamic handler gets [name, raw payloads]: the proof is unwrapped from those.
        proof = None
        if len(input.args) == 2 and isinstance(input.args[1], list | tuple):
            raws = [raw.payload for raw in input.args[1] if isinstance(raw, RawValue)]
            info = workflow.info()
            payloads, proof = self.signal_key.unwrap(
                info.workflow_id, info.first_execution_run_id, input.signal, raws
            )
            input.args = [input.args[0], [RawValue(p) for p in payloads]]
        token = SIGNAL_PROOF.set(proof)
        try:
            await super().handle_signal(input)
        finally:
            SIGNAL_PROOF.reset(token)


class _SignedSignals(WorkflowOutboundInterceptor):
    """The signals a workflow sends, signed as that workflow; the nonce counts its signals (the same on replay)."""

    def __init__(self, next: WorkflowOutboundInterceptor, key: SignalKey) -> None:
        super().__init__(next)
        self.key = key
        self.sent = 0

    async def signal_external_workflow(self, input: SignalExternalWorkflowInput) -> None:
        info = workflow.info()
        self.sent += 1
        signing = Signing(Sender.WORKFLOW, info.workflow_id, info.first_execution_run_id)
        input.args = self.key.signed_args(
            workflow.payload_converter(),
            input.workflow_id,
            input.signal,
            input.args,
            signing,
            nonce=f"{info.run_id}/{self.sent}",
        )
        await super().signal_external_workflow(input)


class _Checked(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, sealer: Sealer, chains: Chains) -> None:
        super().__init__(next)
        self.sealer = sealer
        self.chains = chains

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        kind = info.activity_type
        if kind not in ACTING:
            with signing_as(Signing(Sender.WORKER, info.workflow_id or "")):
                return await super().execute_activity(input)
        (request,) = input.args
        try:
            warrant = request.warrant
            chain = await self._check(warrant, info)
            if kind == Activity.INVOKE_AGENT:
                assert isinstance(request, AgentInvocation)
                self.sealer.check_endpoint(request.contract, request.endpoint, request.sandbox)
            if kind in (Activity.SIGNAL_WITH_START, Activity.RESERVE_RESUME_PLACE) and not info.is_local:
                # Scheduled through the server: by whoever answered the Run's workflow task. (A local activity runs
                # in the worker that runs the workflow's own code, this one.) "Now" as the server scheduled it.
                within_reach(request, warrant, info.current_attempt_scheduled_time or datetime.now(UTC))
        except (Unsealed, NotInWarrant, ChainUnknown) as err:
            refused(kind, info, err)
            kind_of = COPY_REFUSED if isinstance(err, Copied) else UNSEALED
            raise ApplicationError(str(err), type=kind_of, non_retryable=True) from None
        # The signals it sends (a run's messages to its entities) go as the worker, for this execution of the run.
        with signing_as(Signing(Sender.WORKER, info.workflow_id or "", chain)):
            result = await super().execute_activity(input)
        if kind == Activity.ACQUIRE_SANDBOX:
            assert isinstance(request, SandboxRequest) and isinstance(result, Sandbox)
            return self.sealer.seal_sandbox(request.contract, result)
        return result

    async def _check(self, warrant: Warrant, info: activity.Info) -> str:
        """The warrant is the bridge's, for this activity's own workflow id and execution, as the server says."""
        chain = self.sealer.check_warrant(warrant, info.workflow_id or "")
        run_id = info.workflow_run_id or ""
        if await self.chains.of(warrant.workflow_id, run_id, expected=chain) != chain:
            raise Copied(
                f"workflow {info.workflow_id} run {run_id} presented the warrant of Run "
                f"{warrant.envelope.namespace}/{warrant.envelope.name}'s execution {chain}, which it is not part "
                "of: a copy of that Run, refused"
            )
        return chain


# How far past the longest pause a limit may end (the clocks of the worker that heard the 429 and of this one).
LIMIT_SLACK = timedelta(minutes=5)


def within_reach(request: EntitySignal | ResumePlaceRequest, warrant: Warrant, now: datetime) -> None:
    """A Run's message to an entity, or its place in a ramp, only where its warrant reaches: the gates of its own
    concurrency scopes (asking with the scope's limit and the Run's share, as resolved), the credentials of its
    own agents' models, and a limit no longer than the longest pause. Raises NotInWarrant. (The worker checks the
    warrant is the activity's own Run's; this keeps a workflow task answered by someone else, who can schedule any
    activity under that Run, from pausing another tenant's Runs or changing another Team's limit.)"""
    namespace = warrant.envelope.namespace
    resolution = warrant.resolution
    credentials = {
        model.throttle_key(namespace)
        for agent in resolution.agents
        for model in (agent.model, agent.fallback_model, agent.project_fallback_model)
        if model is not None
    }
    latest = now + timedelta(seconds=RateLimitThresholds().cap_seconds) + LIMIT_SLACK
    if isinstance(request, ResumePlaceRequest):
        if request.key not in credentials:
            raise NotInWarrant(f"a ramp of {request.key}, none of the Run's credentials")
        if request.until > latest:
            raise NotInWarrant(f"a limit until {request.until.isoformat()}, past the longest pause")
        return
    if request.workflow == "ConcurrencyGate":
        scope = next((s for s in resolution.scopes if gate_workflow_id(s.key) == request.workflow_id), None)
        if scope is None:
            raise NotInWarrant(f"gate {request.workflow_id}, none of the Run's concurrency scopes")
        if request.signal == "acquire":
            slot = SlotRequest.model_validate(request.arg)
            share = resolution.share
            if (slot.limit, slot.tenant, slot.weight) != (scope.limit, share.tenant, share.weight):
                raise NotInWarrant(
                    f"a request to {scope.key} with a limit or a share not resolved for the Run"
                )
        return
    if request.workflow_id not in {credential_workflow_id(key) for key in credentials}:
        raise NotInWarrant(f"{request.workflow_id}, none of the Run's credentials")
    if request.signal == "limited" and CredentialLimit.model_validate(request.arg).until > latest:
        raise NotInWarrant("a limit past the longest pause")


def refused(kind: str, info: activity.Info, err: Exception) -> None:
    """A refusal is visible: a log line naming the workflow, and a counter."""
    reason = "copy" if isinstance(err, Copied) else "unsealed"
    log.warning("refused %s of workflow %s run %s: %s", kind, info.workflow_id, info.workflow_run_id, err)
    ACTIVITIES_REFUSED.labels(kind, reason).inc()
