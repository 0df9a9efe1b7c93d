"""Workflows used only by the test bed's own tests (kept apart so the workflow sandbox imports little)."""

from datetime import timedelta

from temporalio import workflow

from workflows import search_attributes as sa


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
