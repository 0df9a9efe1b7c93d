"""A small workflow that exercises the stack end to end: an activity, a durable timer, search attributes.

`ksquad demo` runs it until the Run workflow takes its place; the test bed uses it as a smoke test.
"""

from datetime import timedelta

from temporalio import workflow

from workflows import search_attributes as sa

COMPOSE_GREETING = "compose_greeting"


@workflow.defn
class HelloWorkflow:
    @workflow.run
    async def run(self, name: str) -> str:
        workflow.upsert_search_attributes([sa.PHASE.value_set("Running")])
        greeting: str = await workflow.execute_activity(
            COMPOSE_GREETING,
            name,
            result_type=str,
            start_to_close_timeout=timedelta(seconds=30),
            summary=f"compose a greeting for {name}",
        )
        await workflow.sleep(timedelta(seconds=1), summary="a durable timer: survives a worker restart")
        workflow.upsert_search_attributes([sa.PHASE.value_set("Succeeded")])
        return greeting
