"""Real things agents talk to, shared by the agent and sandbox tests: the scripted model and an MCP server,
served in-process over HTTP on loopback, and a contract that points at them."""

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from mcp.server.mcpserver import Context, MCPServer

from agent.scripted_model import ScriptedModel, build_app
from tests.support.asgi import serving
from workflows.contract import (
    CredentialRef,
    ExecutionContract,
    MCPServerRef,
    ModelRef,
    ResolvedAgent,
    RunIdentity,
    SkillSpec,
    ToolSpec,
)

MODEL_KEY = "sk-test-model-key"


@dataclass
class ModelEndpoint:
    url: str  # the OpenAI base URL (…/v1)
    state: ScriptedModel

    def script(self, model: str, *steps: dict[str, Any]) -> None:
        self.state.script[model] = list(steps)
        self.state.positions.pop(model, None)


@pytest.fixture
async def model() -> AsyncIterator[ModelEndpoint]:
    state = ScriptedModel()
    async with serving(build_app(state)) as url:
        yield ModelEndpoint(f"{url}/v1", state)


@dataclass
class ToolServer:
    url: str
    calls: list[dict[str, Any]] = field(default_factory=list)  # every call any tool received, with its _meta


@pytest.fixture
async def tool_server() -> AsyncIterator[ToolServer]:
    mcp = MCPServer("test-tools", log_level="WARNING")
    record = ToolServer("")

    @mcp.tool()
    def add_note(text: str, ctx: Context) -> str:
        """Add a note to the work item."""
        record.calls.append({"tool": "add_note", "text": text, "meta": dict(ctx.request_context.meta or {})})
        return f"noted: {text}"

    @mcp.tool()
    def run_shell(command: str, ctx: Context) -> str:
        """Run a shell command (dangerous: not allowed for the test agent)."""
        record.calls.append(
            {"tool": "run_shell", "command": command, "meta": dict(ctx.request_context.meta or {})}
        )
        return "ran"

    async with serving(
        mcp.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1"), lifespan="on"
    ) as url:
        record.url = f"{url}/mcp"
        yield record


def contract(model: ModelEndpoint, tools: ToolServer | None = None, *, attempt: int = 1, fence: int = 1,
             work_item_ref: str | None = "wi-1", uid: str = "uid-r", model_name: str = "dev-model",
             namespace: str = "payments", name: str = "r", skills: list[SkillSpec] | None = None) -> ExecutionContract:  # fmt: skip
    tool_specs = []
    if tools is not None:
        server = MCPServerRef(name="kb", url=tools.url)
        tool_specs = [ToolSpec(name="notes", tool_name="add_note", mcp_server=server),
                      ToolSpec(name="shell", tool_name="run_shell", mcp_server=server)]  # fmt: skip
    model_ref = ModelRef(name=model_name, url=model.url, credential=CredentialRef(secret_name="model-key"))
    agent = ResolvedAgent(name="dev-1", model=model_ref, system_prompt="You fix flaky tests.", tools=tool_specs,
                          allowed_tools=["notes"], skills=skills or [])  # fmt: skip
    run = RunIdentity(namespace=namespace, name=name, uid=uid, attempt=attempt, fence=fence,
                      triggered_by="alice@example.com", work_item_ref=work_item_ref)  # fmt: skip
    return ExecutionContract(run=run, inputs={"task": "Stabilize the flaky payment-retry test."}, agent=agent,
                             model=model_ref)  # fmt: skip
