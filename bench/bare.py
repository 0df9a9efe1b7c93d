"""The baseline of bench.overhead and bench.throughput: a bare Temporal workflow that runs N trivial activities
one after another, with nothing of ksquad in it (default data converter, no codec, no search attributes)."""

from datetime import timedelta

from temporalio import activity, workflow

BARE_TASK_QUEUE = "bench-bare"


@activity.defn
async def noop(i: int) -> int:
    return i


@workflow.defn
class BareWorkflow:
    @workflow.run
    async def run(self, activities: int) -> int:
        total = 0
        for i in range(activities):
            total += await workflow.execute_activity(noop, i, start_to_close_timeout=timedelta(seconds=30))
        return total
