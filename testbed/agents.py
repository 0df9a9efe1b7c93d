"""Real things agents talk to, shared by the agent and sandbox tests and the benchmarks: the scripted model and
an MCP server, served in-process over HTTP on loopback, the reference agent as its own process, and a contract
that points at them. tests/conftest.py makes fixtures of them."""

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from mcp.server.mcpserver import Context, MCPServer

from activities.agents.callers import process_keys
from agent.callers import ENDPOINT_KEY_ENV, POD_ANNOTATIONS_ENV, TOKEN_SHA256_ENV
from agent.scripted_model import ScriptedModel, build_app
from dev.binaries import dying_with_parent
from testbed.asgi import serving
from testbed.isolate import free_port, service_address
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
ROTATED_MODEL_KEY = "sk-test-rotated-key"  # what a test rotates MODEL_KEY to


@dataclass
class ModelEndpoint:
    url: str  # the OpenAI base URL (…/v1)
    state: ScriptedModel

    def script(self, model: str, *steps: dict[str, Any]) -> None:
        self.state.script[model] = list(steps)
        self.state.positions.pop(model, None)


@asynccontextmanager
async def serving_model() -> AsyncIterator[ModelEndpoint]:
    state = ScriptedModel()
    async with serving(build_app(state)) as url:
        yield ModelEndpoint(f"{url}/v1", state)


@dataclass
class ToolServer:
    url: str
    calls: list[dict[str, Any]] = field(default_factory=list)  # every call any tool received, with its _meta
    traceparents: list[str] = field(
        default_factory=list
    )  # the W3C trace context of each request that had one


@asynccontextmanager
async def serving_tools() -> AsyncIterator[ToolServer]:
    """An MCP server with a tool the test agent may call (add_note) and one it may not (run_shell)."""
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

    app = mcp.streamable_http_app(streamable_http_path="/mcp", host=service_address())

    async def noting_trace_context(scope: dict[str, Any], receive: Any, send: Any) -> None:
        for key, value in scope.get("headers", []):
            if key == b"traceparent":
                record.traceparents.append(value.decode())
        await app(scope, receive, send)

    async with serving(noting_trace_context, lifespan="on") as url:
        record.url = f"{url}/mcp"
        yield record


def contract(
    model: ModelEndpoint,
    tools: ToolServer | None = None,
    *,
    attempt: int = 1,
    fence: int = 1,
    work_item_ref: str | None = "wi-1",
    uid: str = "uid-r",
    model_name: str = "dev-model",
    namespace: str = "payments",
    name: str = "r",
    skills: list[SkillSpec] | None = None,
) -> ExecutionContract:
    tool_specs = []
    if tools is not None:
        server = MCPServerRef(name="kb", url=tools.url)
        tool_specs = [
            ToolSpec(name="notes", tool_name="add_note", mcp_server=server),
            ToolSpec(name="shell", tool_name="run_shell", mcp_server=server),
        ]
    # The key may go to the scripted model's host only (the Secret's ksquad.io/allowed-hosts annotation).
    allowed = [urlsplit(model.url).netloc]
    model_ref = ModelRef(
        name=model_name,
        url=model.url,
        credential=CredentialRef(secret_name="model-key", allowed_hosts=allowed),
    )
    agent = ResolvedAgent(
        name="dev-1",
        model=model_ref,
        system_prompt="You fix flaky tests.",
        tools=tool_specs,
        allowed_tools=["notes"],
        skills=skills or [],
    )
    run = RunIdentity(
        namespace=namespace,
        name=name,
        uid=uid,
        attempt=attempt,
        fence=fence,
        triggered_by="alice@example.com",
        work_item_ref=work_item_ref,
    )
    return ExecutionContract(
        run=run, inputs={"task": "Stabilize the flaky payment-retry test."}, agent=agent, model=model_ref
    )


@dataclass
class AgentProcess:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as http:
            response = await http.get(f"{self.url}ksquad/stats", timeout=5)
            result: dict[str, Any] = response.json()
            return result

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)


AgentFactory = Callable[..., Any]


@asynccontextmanager
async def agent_starter(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    """Start `ksquad-agent` as its own process: `await start(contract=None)`; each stopped afterwards.

    The agent answers only its caller (agent.callers): given a contract, it is that attempt's sandbox and knows the
    hash of the token this process's workers make for it (activities.agents.callers.process_keys); given
    `annotations`, it reads the hash from that file, as a pod does from its downward-API volume; given
    `endpoint_key`, it is a shared endpoint that checks signed tokens and reads credentials from
    `<secrets_dir>/<namespace>/<secret>/<key>`."""
    started: list[AgentProcess] = []

    async def start(
        contract: ExecutionContract | None = None,
        *,
        annotations: Path | None = None,
        endpoint_key: Path | None = None,
        secrets_dir: Path | None = None,
    ) -> AgentProcess:
        port = free_port()
        env = {
            **os.environ,
            "KSQUAD_CREDENTIAL_MODEL_KEY_APIKEY": MODEL_KEY,
            "KSQUAD_SECRETS_DIR": str(secrets_dir or tmp_path / "no-secrets"),
        }
        for name in (TOKEN_SHA256_ENV, POD_ANNOTATIONS_ENV, ENDPOINT_KEY_ENV):
            env.pop(name, None)
        if endpoint_key is not None:
            env[ENDPOINT_KEY_ENV] = str(endpoint_key)
        elif annotations is not None:
            env[POD_ANNOTATIONS_ENV] = str(annotations)
        elif contract is not None:
            env[TOKEN_SHA256_ENV] = process_keys().sandbox_token_sha256(contract.run)
        if contract is not None:
            env["KSQUAD_EXECUTION_CONTRACT"] = contract.model_dump_json()
        log = tmp_path / f"agent-{port}.log"
        process = subprocess.Popen(
            dying_with_parent(
                [sys.executable, "-m", "agent.server", "--host", "127.0.0.1", "--port", str(port)]
            ),
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        agent = AgentProcess(f"http://127.0.0.1:{port}/", process, log)
        started.append(agent)
        async with httpx.AsyncClient() as http:
            for _ in range(200):
                if process.poll() is not None:
                    raise RuntimeError(f"ksquad-agent exited {process.returncode}: {log.read_text()[-2000:]}")
                try:
                    if (await http.get(f"{agent.url}readyz", timeout=1)).status_code == 200:
                        return agent
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        raise RuntimeError(f"ksquad-agent not ready: {log.read_text()[-2000:]}")

    try:
        yield start
    finally:
        for agent in started:
            if agent.process.poll() is None:
                agent.process.kill()
            agent.process.wait(10)
