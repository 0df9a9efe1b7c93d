"""The activity of the small smoke-test workflow (`workflows.hello`)."""

from temporalio import activity

from workflows.hello import COMPOSE_GREETING


@activity.defn(name=COMPOSE_GREETING)
async def compose_greeting(name: str) -> str:
    return f"Hello, {name}! (from activity attempt {activity.info().attempt})"
