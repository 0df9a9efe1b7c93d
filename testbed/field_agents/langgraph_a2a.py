"""A LangGraph graph served over A2A by a2a-sdk's server, as a2a-samples' LangGraph agent serves one (an
AgentExecutor that runs the graph per task and maps its interrupts to `input-required`), its model any
OpenAI-compatible server through langchain-openai. A task that asks "which branch" interrupts for the person's
answer before the model is called (human in the loop); the answer resumes the graph where it stopped.

    python langgraph_a2a.py HOST PORT MODEL_BASE_URL MODEL_NAME   (OPENAI_API_KEY: the model's key)
"""

import logging
import os
import sys
from typing import Any, TypedDict

import uvicorn
from a2a.helpers import get_message_text, new_task_from_user_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from starlette.applications import Starlette

logging.basicConfig(level=logging.WARNING)
host, port, base_url, model_name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
model = ChatOpenAI(model=model_name, base_url=base_url, api_key=os.environ.get("OPENAI_API_KEY") or "none")


class State(TypedDict):
    task: str
    branch: str
    answer: str


def ask(state: State) -> dict[str, Any]:
    if "which branch" not in state["task"].lower():
        return {"branch": ""}
    return {"branch": interrupt("Which branch should I work on?")}


async def work(state: State) -> dict[str, Any]:
    prompt = state["task"] + (f"\nbranch: {state['branch']}" if state["branch"] else "")
    reply = await model.ainvoke([("system", "You answer briefly."), ("user", prompt)])
    return {"answer": str(reply.content)}


graph = (
    StateGraph(State)
    .add_node("ask", ask)
    .add_node("work", work)
    .add_edge(START, "ask")
    .add_edge("ask", "work")
    .add_edge("work", END)
    .compile(checkpointer=InMemorySaver())
)


class GraphExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None and context.task_id and context.context_id
        text = get_message_text(context.message)
        config: Any = {"configurable": {"thread_id": context.task_id}}
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))
            result = await graph.ainvoke({"task": text, "branch": "", "answer": ""}, config)
        else:  # the person's answer to the interrupt
            result = await graph.ainvoke(Command(resume=text), config)
        interrupts = result.get("__interrupt__")
        if interrupts:
            await updater.requires_input(updater.new_agent_message([new_text_part(str(interrupts[0].value))]))
            return
        await updater.add_artifact([new_text_part(result["answer"])], name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


card = AgentCard(
    name="langgraph-agent",
    description="A LangGraph graph that may ask which branch to work on.",
    version="1.0.0",
    supported_interfaces=[
        AgentInterface(url=f"http://{host}:{port}/", protocol_binding="JSONRPC", protocol_version="1.0")
    ],
    capabilities=AgentCapabilities(streaming=True),
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
    skills=[AgentSkill(id="fix", name="fix", description="Fixes what it is asked to.", tags=["langgraph"])],
)
handler = DefaultRequestHandler(
    agent_executor=GraphExecutor(), task_store=InMemoryTaskStore(), agent_card=card
)
app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/"))
uvicorn.run(app, host=host, port=port, log_level="warning")
