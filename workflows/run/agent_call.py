"""Running: the agent's task, in turns. Each turn builds the invocation (the warrant, the route, the attempt's fence
and sandbox, the token budget left), calls the agent within timeouts.runSeconds and reads what it answered: a
result, or an error that moves the route (a 429), pauses the task (input, a refused credential: the same task then
continues in a new turn), fails the attempt or fails the Run. It owns the Run's model usage: what earlier
workflows of the Run counted and each attempt's running total since."""

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

from workflows.activity_types import (
    USAGE_DETAIL,
    AgentError,
    AgentInvocation,
    AgentResult,
    ContinueTask,
    FailureDetails,
    RateLimitDetails,
    RunRef,
    Sandbox,
    TaskPause,
    invoke_agent,
)
from workflows.run.interrupts import ANY_INTERRUPT, Interrupted, Interrupts, PhaseTimeout
from workflows.run.mirror import StatusMirror
from workflows.run.options import AGENT_HEARTBEAT_TIMEOUT, WarrantOf, later, start, tenant_priority
from workflows.run.outcomes import AttemptFailed, RunFailed, cause, refusal
from workflows.run.pauses import Pauses
from workflows.run.route import Router
from workflows.spec import RunSpec
from workflows.status import ConditionType, Phase, UsageStatus

_AGENT_ERRORS = [e.value for e in AgentError]  # in the enum's order: a set's would be the hash seed's
# The agent call outlives the attempt's deadline by this much: the deadline cancels it and the workflow waits for
# the cancellation to reach the agent, instead of finding the call timed out by itself and starting the next
# attempt beside an agent still at work.
AGENT_CANCEL_GRACE_SECONDS = 60.0


class AgentCall:
    def __init__(
        self,
        run: RunRef,
        spec: RunSpec,
        usage_carried: UsageStatus | None,
        mirror: StatusMirror,
        interrupts: Interrupts,
        route: Router,
        pauses: Pauses,
        warrant: WarrantOf,
    ) -> None:
        self.run = run
        self.spec = spec
        self.mirror = mirror
        self.interrupts = interrupts
        self.route = route
        self.pauses = pauses
        self.warrant = warrant
        # Model usage: what earlier workflows of this Run counted (continued as new only between attempts), and
        # each attempt's running total since.
        self.usage_carried = usage_carried or UsageStatus()
        self.usage_by_attempt: dict[int, UsageStatus] = {}

    async def invoke(self, attempt: int, fence: int, sandbox: Sandbox) -> AgentResult:
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
            remaining = (run_deadline - workflow.now()).total_seconds()
            started: list[workflow.ActivityHandle[AgentResult]] = []
            try:
                try:
                    result = await self.interrupts.interruptible(
                        self._call_agent(invocation, remaining, started),
                        ANY_INTERRUPT,
                        timeout=max(0.001, remaining),
                        deadline_summary=f"attempt {attempt}: timeouts.runSeconds",
                    )
                except (Interrupted, PhaseTimeout, asyncio.CancelledError):
                    self._note_an_unconfirmed_cancel(attempt, started)
                    raise
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

    async def _call_agent(
        self,
        invocation: AgentInvocation,
        remaining: float,
        started: list[workflow.ActivityHandle[AgentResult]],
    ) -> AgentResult:
        """invoke_agent, outliving the attempt's deadline by the grace a cancel needs; its handle is kept in
        `started`, so that how a cancelled call ended can be read once its cancellation has completed."""
        handle = start(
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
            summary=f"{self.route.agent().name}: {self.route.model().name}, message {invocation.message_id}",
            priority=tenant_priority(self.run.namespace),
        )
        started.append(handle)
        return await handle

    def _note_an_unconfirmed_cancel(
        self, attempt: int, started: list[workflow.ActivityHandle[AgentResult]]
    ) -> None:
        """The call was cancelled and its cancellation has completed: if the agent did not confirm that its task
        stopped, the Run says so (AgentStopped=False) until a sandbox's confirmed deletion settles it."""
        if not started or not started[0].done() or started[0].cancelled():
            return
        err = started[0].exception()
        app = err.cause if isinstance(err, ActivityError) else None
        if isinstance(app, ApplicationError) and app.type == AgentError.CANCEL_UNCONFIRMED:
            if len(app.details) > USAGE_DETAIL:  # what the attempt used until it was cancelled
                self._count_usage(attempt, UsageStatus.model_validate(app.details[USAGE_DETAIL]))
            self.mirror.condition(
                ConditionType.AGENT_STOPPED, False, "CancelUnconfirmed", f"attempt {attempt}: {app.message}"
            )

    def _token_budget_left(self) -> int | None:
        """Tokens the Run may still use, or None without a budget; a Run that has used it all ends here, before
        another call (an attempt that ended on the very call that reached it, then a retry)."""
        assert self.route.resolution is not None
        budget = self.spec.token_budget or self.route.resolution.token_budget
        if budget is None:
            return None
        used = self.mirror.status.usage or UsageStatus()
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
        self.mirror.status.usage = total
