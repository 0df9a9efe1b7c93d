"""A standard A2A agent, knowing nothing of ksquad, serves Runs as an Agent's `endpoint` on the real stack (the
embedded Temporal, worker and store): it reads the Run's task in the message's text, and the Run's
status.message is its answer, whether it answers with a message or with an artifact. One that reads the
documented `workItem` of the contract's data part comments on the Run's work item over plain HTTP (docs/operating.md,
"Work items"), as the attempt it serves."""

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.helpers import (
    get_data_parts,
    get_message_text,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette

from dev.stack import TOKEN_FILE, DevStack, dev_stack
from testbed.asgi import serving
from testbed.embedded import stack_options, wait_terminal

NAMESPACE = "bench"  # wait_terminal's


class Echo(AgentExecutor):
    """As the a2a-samples helloworld agent does: one text message back, no task. Or, as agents built on
    TaskUpdater do: the answer as an artifact, then a generic final status. Given a work item in the contract
    (the data part `ksquad.io/contract`, its `workItem`), it first says on the item what it heard, through the
    items API with nothing but httpx."""

    def __init__(self, as_artifact: bool) -> None:
        self.as_artifact = as_artifact
        self.heard: list[str] = []
        self.item_answers: list[int] = []  # the HTTP status of each comment it wrote

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        text = get_message_text(context.message)
        self.heard.append(text)
        for part in get_data_parts(list(context.message.parts)):
            item = (part.get("ksquad.io/contract") or {}).get("workItem")
            if item:
                async with httpx.AsyncClient(timeout=30) as http:
                    answer = await http.post(
                        f"{item['url']}/items/{item['namespace']}/{item['id']}/comments",
                        json={"body": f"echo heard: {text}"},
                        headers={"Authorization": f"Bearer {item['token']}"},
                    )
                self.item_answers.append(answer.status_code)
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


def echo_run(url: str, name: str, inputs: dict[str, str], **spec: str) -> list[dict[str, Any]]:
    """The Agent `echo` at `url` and a Run of it."""
    return [
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "echo", "namespace": NAMESPACE},
            "spec": {"endpoint": url},
        },
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"agents": ["echo"], "inputs": inputs, **spec},
        },
    ]


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
        await dev.runs.apply(echo_run(url, "echoed", {"task": task, "branch": "main"}))
        phases = await wait_terminal(dev, ["echoed"], within=60)
    assert phases == {"echoed": "Succeeded"}
    assert echo.heard == [f"{task}\nbranch: main"], "the task, then the other inputs, in the text"
    run = await dev.runs.get(NAMESPACE, "echoed")
    status = run.status or {}
    assert status["message"] == f"echo: {task}\nbranch: main", status
    if as_artifact:
        assert [a["name"] for a in status["artifacts"]] == ["artifact-1"], "named by its place, not a UUID"


async def test_a_standard_a2a_agent_comments_on_the_runs_work_item_through_the_documented_http_api(
    dev: DevStack,
) -> None:
    token = (dev.state_dir / TOKEN_FILE).read_text().strip()
    person = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=dev.api_url, headers=person, timeout=30) as api:
        made = await api.post(f"/items/{NAMESPACE}", json={"id": "DOC-3", "title": "Summarize the report"})
        assert made.status_code == 201, made.text
        async with echo_agent(as_artifact=False) as (url, echo):
            await dev.runs.apply(echo_run(url, "doc-3", {"task": "Summarize."}, workItemRef="DOC-3"))
            assert await wait_terminal(dev, ["doc-3"], within=60) == {"doc-3": "Succeeded"}
        entries = (await api.get(f"/items/{NAMESPACE}/DOC-3/entries")).json()["entries"]
    assert echo.item_answers == [201], "its comment was taken"
    (comment,) = [e for e in entries if e["kind"] == "comment"]
    assert comment["body"] == "echo heard: Summarize."
    assert comment["author"] == {
        "user": dev.runs.user,
        "run": f"{NAMESPACE}/doc-3",
        "run_uid": comment["author"]["run_uid"],
        "attempt": 1,
    }
    run = await dev.runs.get(NAMESPACE, "doc-3")
    assert comment["author"]["run_uid"] == run.uid
    assert (run.status or {})["workItem"]["item"] is True, "the status says the ref names an item"
