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

from temporal_client.chains import Chains
from temporal_client.proofs import SignalKey, Signing, signing_as
from temporal_client.seal import Sealer, Unsealed
from workflows.activity_types import (
    UNSEALED,
    Activity,
    AgentInvocation,
    EntitySignal,
    Sandbox,
    SandboxRequest,
)
from workflows.inbox import SIGNAL_PROOF, Sender

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
        with signing_as(self._signing(input)):
            return await self._checked(input)

    def _signing(self, input: ExecuteActivityInput) -> Signing:
        """The signals an activity sends go as the worker, for the workflow it runs for; a run's messages to its
        entities also say which execution of the run sends them (the gates key their slots by it). They come
        from a local activity, whose input never left this worker: the chain is the workflow's own."""
        info = activity.info()
        chain = ""
        if info.activity_type == Activity.SIGNAL_WITH_START and info.is_local:
            (message,) = input.args
            assert isinstance(message, EntitySignal)
            chain = message.chain or ""
        return Signing(Sender.WORKER, info.workflow_id or "", chain)

    async def _checked(self, input: ExecuteActivityInput) -> Any:
        kind = activity.info().activity_type
        try:
            if kind == Activity.ACQUIRE_SANDBOX:
                (request,) = input.args
                assert isinstance(request, SandboxRequest)
                self.sealer.check_contract(request.contract, request.policy)
                sandbox = await super().execute_activity(input)
                assert isinstance(sandbox, Sandbox)
                return self.sealer.seal_sandbox(request.contract, sandbox)
            if kind == Activity.INVOKE_AGENT:
                (invocation,) = input.args
                assert isinstance(invocation, AgentInvocation)
                self.sealer.check_contract(invocation.contract)
                self.sealer.check_endpoint(invocation.contract, invocation.endpoint, invocation.sandbox)
        except Unsealed as err:
            info = activity.info()
            log.warning("refused %s of workflow %s: %s", kind, info.workflow_id, err)
            raise ApplicationError(str(err), type=UNSEALED, non_retryable=True) from None
        return await super().execute_activity(input)
