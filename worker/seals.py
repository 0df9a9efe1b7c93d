"""The worker acts only on what it can verify (temporal_client.seal): before it makes a sandbox or calls an
agent, the contract's agent must carry the bridge's seal for that Run, and the endpoint must be that agent's own
or a sandbox this worker sealed for the attempt. Checked here, around the activities, so that no sandbox backend
or agent client can forget it; the sandbox an acquisition returns is sealed here too."""

import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from temporal_client.seal import Sealer, Unsealed
from workflows.activity_types import UNSEALED, Activity, AgentInvocation, Sandbox, SandboxRequest

log = logging.getLogger(__name__)


class SealCheck(Interceptor):
    def __init__(self, sealer: Sealer) -> None:
        self.sealer = sealer

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Checked(next, self.sealer)


class _Checked(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, sealer: Sealer) -> None:
        super().__init__(next)
        self.sealer = sealer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
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
