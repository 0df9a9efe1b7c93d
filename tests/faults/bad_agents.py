"""A2A agents that misbehave, over real HTTP on loopback: each is a real a2a-sdk server (so the stream is valid
A2A) whose executor does the wrong thing, or a plain HTTP endpoint that does not speak JSON-RPC at all.

Mounted under `/<behaviour>/`: the Agent's `endpoint` names one behaviour."""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from a2a.helpers import new_data_part, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import TaskState
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from activities.agents import OUTPUTS_ARTIFACT
from activities.agents.a2a_compat import MAX_ANSWER_LINE
from activities.agents.recording import MAX_MODEL_CALLS, USAGE_KEY
from agent.server import agent_card
from testbed.asgi import serving

TEN_MB = 10 * 1024 * 1024
FLOOD_UPDATES = 5_000  # the a2a-sdk server copies the task per update (quadratic): more only slows the agent
MANY_ARTIFACTS = 1_000
SAME_CALL_REPORTS = 1_000  # one call's usage, reported again and again
MANY_CALLS = MAX_MODEL_CALLS + 1  # a new call id in every report, one past the bound


def usage_report(call_id: str) -> dict[str, dict[str, object]]:
    """A status update's metadata saying one model call cost 100 tokens in and 10 out (agent.reports.usage_report's shape)."""
    report = {"callId": call_id, "model": "scripted", "inputTokens": 100, "outputTokens": 10, "latencyMs": 1}
    return {USAGE_KEY: report}


@dataclass
class Seen:
    messages: int = 0
    cancelled: int = 0
    sent_updates: int = 0


class Misbehaving(AgentExecutor):
    def __init__(self, behaviour: str, seen: Seen) -> None:
        self.behaviour = behaviour
        self.seen = seen

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        self.seen.messages += 1
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await event_queue.enqueue_event(new_task_from_user_message(context.message))
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, updater.new_agent_message([new_text_part("on it")])
        )
        if self.behaviour == "hang":  # a task that never moves again, while the server stays up
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.seen.cancelled += 1
                raise
        elif self.behaviour == "flood":  # progress as fast as it can be written, then an answer
            for i in range(FLOOD_UPDATES):
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING, updater.new_agent_message([new_text_part(f"step {i}")])
                )
                self.seen.sent_updates += 1
            await self._complete(updater, "flooded")
        elif self.behaviour == "huge-artifact":
            await updater.add_artifact([new_text_part("x" * TEN_MB)], name="report")
            await self._complete(updater, "here is 10 MB")
        elif self.behaviour == "huge-answer":  # 10 MB in the final message and in an output value
            await updater.complete(
                updater.new_agent_message(
                    [new_text_part("y" * TEN_MB)], metadata={OUTPUTS_ARTIFACT: {"answer": "z" * TEN_MB}}
                )
            )
        elif self.behaviour == "many-artifacts":
            for i in range(MANY_ARTIFACTS):
                await updater.add_artifact([new_text_part(f"part {i}")], name=f"part-{i}")
            await self._complete(updater, "a thousand artifacts")
        elif self.behaviour in ("same-call", "many-calls"):  # usage reports: one call 1,000 times, or many
            count = SAME_CALL_REPORTS if self.behaviour == "same-call" else MANY_CALLS
            for i in range(count):
                call_id = "1" if self.behaviour == "same-call" else str(i)
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING,
                    updater.new_agent_message([new_text_part(f"call {call_id}")]),
                    metadata=usage_report(call_id),
                )
                self.seen.sent_updates += 1
            await self._complete(updater, f"{count} usage reports")
        else:
            raise AssertionError(f"unknown behaviour {self.behaviour}")

    async def _complete(self, updater: TaskUpdater, text: str) -> None:
        await updater.add_artifact([new_data_part({"answer": text})], name=OUTPUTS_ARTIFACT)
        await updater.complete(updater.new_agent_message([new_text_part(text)]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        with contextlib.suppress(RuntimeError):
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


A2A_BEHAVIOURS = [
    "hang",
    "flood",
    "huge-artifact",
    "huge-answer",
    "many-artifacts",
    "same-call",
    "many-calls",
]


async def endless_line() -> AsyncIterator[bytes]:
    """An event with no end as far as the worker reads (it stops at a2a_compat.MAX_ANSWER_LINE, a third of this):
    bounded, and yielding to the loop, so that a server in the test's process stops once the worker hangs up."""
    yield b'data: {"jsonrpc": "2.0", "id": 1, "result": {"text": "'
    for _ in range(3 * MAX_ANSWER_LINE // 65536):
        yield b"x" * 65536
        await asyncio.sleep(0)


# Endpoints with a valid agent card whose JSON-RPC endpoint answers with something that is not JSON-RPC.
NOT_JSON_RPC: dict[str, Callable[[], Response]] = {
    "truncated-json": lambda: Response('{"jsonrpc": "2.0", "result": ', media_type="application/json"),
    "json-not-rpc": lambda: JSONResponse({"hello": "world"}),
    "wrong-result": lambda: JSONResponse({"jsonrpc": "2.0", "id": 1, "result": {"unexpected": [1, 2, 3]}}),
    "rpc-error": lambda: JSONResponse(
        {"jsonrpc": "2.0", "id": 1, "error": {"code": -32603, "message": "internal kaboom"}}
    ),
    "html-500": lambda: HTMLResponse("<html><body>502 Bad Gateway</body></html>", status_code=500),
    "event-stream-garbage": lambda: Response(
        "data: {not json}\n\ndata: [1,2\n\n", media_type="text/event-stream"
    ),
    # An event that never ends: the worker reads up to its line bound (a2a_compat.MAX_ANSWER_LINE), no further.
    "endless-line": lambda: StreamingResponse(endless_line(), media_type="text/event-stream"),
}


@dataclass
class BadAgents:
    base_url: str
    seen: dict[str, Seen] = field(default_factory=dict)

    def endpoint(self, behaviour: str) -> str:
        return f"{self.base_url}/{behaviour}/"


def _a2a_app(behaviour: str, url: str, seen: Seen) -> Starlette:
    card = agent_card(url, name=f"bad-{behaviour}")
    handler = DefaultRequestHandler(
        agent_executor=Misbehaving(behaviour, seen), task_store=InMemoryTaskStore(), agent_card=card
    )
    return Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/"))


def _not_json_rpc_app(behaviour: str, url: str) -> Starlette:
    card = agent_card(url, name=f"bad-{behaviour}")
    card_routes = create_agent_card_routes(card)

    async def answer(_: Request) -> Response:
        return NOT_JSON_RPC[behaviour]()

    return Starlette(routes=[*card_routes, Route("/", answer, methods=["POST"])])


@contextlib.asynccontextmanager
async def bad_agents() -> AsyncIterator[BadAgents]:
    """Every behaviour, mounted on one loopback server."""
    root = Starlette()
    # The routes need the URL (agent cards name it): mounted once it is known.
    async with serving(root) as url:
        agents = BadAgents(url)
        for behaviour in A2A_BEHAVIOURS:
            agents.seen[behaviour] = Seen()
            app = _a2a_app(behaviour, agents.endpoint(behaviour), agents.seen[behaviour])
            root.router.routes.append(Mount(f"/{behaviour}", app))
        for behaviour in NOT_JSON_RPC:
            root.router.routes.append(
                Mount(f"/{behaviour}", _not_json_rpc_app(behaviour, agents.endpoint(behaviour)))
            )
        yield agents
