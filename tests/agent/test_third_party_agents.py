"""A standard A2A agent, knowing nothing of ksquad, serves Runs as an Agent's `endpoint` on the real stack (the
embedded Temporal, worker and store): it reads the Run's task in the message's text, and the Run's
status.message is its answer, whether it answers with a message or with an artifact."""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from a2a.helpers import get_message_text, new_task_from_user_message, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette

from dev.stack import DevStack, dev_stack
from testbed.asgi import serving
from testbed.embedded import stack_options, wait_terminal

NAMESPACE = "bench"  # wait_terminal's


class Echo(AgentExecutor):
    """As the a2a-samples helloworld agent does: one text message back, no task. Or, as agents built on
    TaskUpdater do: the answer as an artifact, then a generic final status."""

    def __init__(self, as_artifact: bool) -> None:
        self.as_artifact = as_artifact
        self.heard: list[str] = []

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        text = get_message_text(context.message)
        self.heard.append(text)
        if not self.as_artifact:
            await event_queue.enqueue_event(new_text_message(f"echo: {text}"))
            return
        assert context.task_id and context.context_id
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await event_queue.enqueue_event(new_task_from_user_message(context.message))
        await updater.add_artifact([new_text_part(f"echo: {text}")])
        await updater.complete(updater.new_agent_message([new_text_part("Request is completed!")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def echo_app(url: str, echo: Echo) -> Starlette:
    card = AgentCard(
        name="echo",
        description="Says back what it was told.",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echo", tags=["echo"])],
    )
    handler = DefaultRequestHandler(agent_executor=echo, task_store=InMemoryTaskStore(), agent_card=card)
    return Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/"))


@contextlib.asynccontextmanager
async def echo_agent(as_artifact: bool) -> AsyncIterator[tuple[str, Echo]]:
    echo, root = Echo(as_artifact), Starlette()
    async with serving(root, host="127.0.0.1") as url:
        root.mount("/", echo_app(f"{url}/", echo))
        yield f"{url}/", echo


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    options = stack_options(tmp_path / ".ksquad")
    async with dev_stack(options) as stack:
        yield stack


@pytest.mark.parametrize(
    "as_artifact", [False, True], ids=["answers-with-a-message", "answers-with-an-artifact"]
)
async def test_a_standard_a2a_agent_gets_the_task_and_its_answer_is_the_runs_message(
    dev: DevStack, as_artifact: bool
) -> None:
    # Third-party agents never saw the task (it travelled in ksquad's data part; the text said "Attempt 1 of
    # run ..."), and status.message was their last status text ("Request is completed!").
    task = "Summarize the flaky-test report for the reviewers."
    async with echo_agent(as_artifact) as (url, echo):
        await dev.runs.apply(
            [
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Agent",
                    "metadata": {"name": "echo", "namespace": NAMESPACE},
                    "spec": {"endpoint": url},
                },
                {
                    "apiVersion": "ksquad.io/v1alpha1",
                    "kind": "Run",
                    "metadata": {"name": "echoed", "namespace": NAMESPACE},
                    "spec": {"agents": ["echo"], "inputs": {"task": task, "branch": "main"}},
                },
            ]
        )
        phases = await wait_terminal(dev, ["echoed"], within=60)
    assert phases == {"echoed": "Succeeded"}
    assert echo.heard == [f"{task}\nbranch: main"], "the task, then the other inputs, in the text"
    run = await dev.runs.get(NAMESPACE, "echoed")
    status = run.status or {}
    assert status["message"] == f"echo: {task}\nbranch: main", status
    if as_artifact:
        assert [a["name"] for a in status["artifacts"]] == ["artifact-1"], "named by its place, not a UUID"
