"""Workflows used only by the test bed's own tests (kept apart so the workflow sandbox imports little)."""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from workflows import search_attributes as sa
from workflows.activity_types import Activity, AgentInvocation, AgentResult


@workflow.defn
class SleepWorkflow:
    """Sleeps on a durable timer and reports how much workflow time passed."""

    @workflow.run
    async def run(self, seconds: float) -> float:
        start = workflow.now()
        await workflow.sleep(timedelta(seconds=seconds), summary="sleep on a durable timer")
        return (workflow.now() - start).total_seconds()


@workflow.defn
class TaggedWorkflow:
    """Sets KsquadPhase and KsquadAttempt, then completes."""

    @workflow.run
    async def run(self, phase: str) -> None:
        workflow.upsert_search_attributes([sa.PHASE.value_set(phase), sa.ATTEMPT.value_set(1)])


@workflow.defn
class InvokeAgentOnce:
    """Runs invoke_agent once with a short heartbeat timeout, so a killed worker is noticed quickly."""

    @workflow.run
    async def run(self, invocation: AgentInvocation) -> AgentResult:
        result: AgentResult = await workflow.execute_activity(
            Activity.INVOKE_AGENT,
            invocation,
            result_type=AgentResult,
            start_to_close_timeout=timedelta(seconds=120),
            heartbeat_timeout=timedelta(seconds=3),
            retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5),
        )
        return result


@workflow.defn
class MeasuredWorkflow:
    """Records one phase change, waits on a timer (a second workflow task: replayed when nothing is cached),
    then another change."""

    @workflow.run
    async def run(self) -> None:
        from workflows import metrics
        from workflows.status import Phase

        metrics.phase_changed(Phase.PENDING, Phase.RUNNING, "Started", timedelta(seconds=2))
        await workflow.sleep(timedelta(milliseconds=200), summary="a second workflow task")
        metrics.phase_changed(Phase.RUNNING, Phase.SUCCEEDED, "Done", timedelta(seconds=1))
