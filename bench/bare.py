"""The baseline of bench.overhead: a bare Temporal workflow that runs N trivial activities one after another, and
M trivial local activities (a run sends its messages to entity workflows as local activities: the first before
its activities, the rest after), with nothing of ksquad in it (default data converter, no codec, no search
attributes)."""

from datetime import timedelta

from temporalio import activity, workflow

BARE_TASK_QUEUE = "bench-bare"


@activity.defn
async def noop(i: int) -> int:
    return i


@workflow.defn
class BareWorkflow:
    @workflow.run
    async def run(self, activities: int, local_activities: int = 0) -> int:
        timeout = timedelta(seconds=30)
        total = 0
        if local_activities:
            total += await workflow.execute_local_activity(noop, -1, start_to_close_timeout=timeout)
        for i in range(activities):
            total += await workflow.execute_activity(noop, i, start_to_close_timeout=timeout)
        for i in range(local_activities - 1):
            total += await workflow.execute_local_activity(noop, -i, start_to_close_timeout=timeout)
        return total
