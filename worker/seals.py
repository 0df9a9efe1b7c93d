"""The worker acts only on what it can verify (temporal_client.seal): before it makes a sandbox or calls an
agent, the contract's agent must carry the bridge's seal for that Run, and the endpoint must be that agent's own
or a sandbox this worker sealed for the attempt. Checked here, around the activities, so that no sandbox backend
or agent client can forget it; the sandbox an acquisition returns is sealed here too.

Signals too (temporal_client.proofs): around each signal handler of a ksquad workflow, the proof its payload
carries is checked, unwrapped and handed to the workflow's inbox (workflows.inbox.SIGNAL_PROOF); the signals the
workflows send each other (an entity's notices to runs) are signed on their way out."""

import logging
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
    Sandbox,
    SandboxRequest,
)
from workflows.envelope import NotInWarrant, Warrant
from workflows.inbox import SIGNAL_PROOF, Refused, Sender
from workflows.inbox import refused as signal_refused

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


def refused(kind: str, info: activity.Info, err: Exception) -> None:
    """A refusal is visible: a log line naming the workflow, and a counter."""
    reason = "copy" if isinstance(err, Copied) else "unsealed"
    log.warning("refused %s of workflow %s run %s: %s", kind, info.workflow_id, info.workflow_run_id, err)
    ACTIVITIES_REFUSED.labels(kind, reason).inc()
