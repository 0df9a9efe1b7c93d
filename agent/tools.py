"""The MCP tools a run may call: only those in the Agent's allowedTools, over MCP's streamable HTTP or its older
HTTP+SSE transport (as `mcp-proxy` serves a stdio server on both).

The model sees each tool under its Tool object's name (unique in the namespace), so two MCP servers with
a same-named tool never collide. Every call carries an idempotency key `<run-uid>-a<attempt>-<call-number>`
and the run's identity in the request's `_meta`, so a tool can refuse or deduplicate a side effect that a
retried attempt repeats.
"""

import asyncio
import contextlib
import importlib
import json
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import httpx2

import tracing
from agent.contract import Contract, Tool

if TYPE_CHECKING:
    from mcp import Client

META_IDEMPOTENCY_KEY = "ksquad.io/idempotency-key"
META_RUN = "ksquad.io/run"
META_RUN_UID = "ksquad.io/run-uid"
META_ATTEMPT = "ksquad.io/attempt"
CALL_TIMEOUT_SECONDS = 300.0


@dataclass
class OfferedTool:
    tool: Tool
    client: "Client"
    description: str
    input_schema: dict[str, Any]

    def definition(self) -> dict[str, Any]:
        """The tool as the OpenAI chat API takes it."""
        return {
            "type": "function",
            "function": {
                "name": self.tool.name,
                "description": self.description,
                "parameters": self.input_schema,
            },
        }


@dataclass
class ToolResult:
    text: str
    is_error: bool


class ToolServerError(Exception):
    """An MCP server the run's allowed tools need could not be used; the message names the server, where it is
    and why (what the Run's condition says)."""


def cause_of(err: BaseException) -> str:
    """What went wrong, from inside the MCP client's task groups (whose own message is only "unhandled errors in
    a TaskGroup")."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class ToolBox:
    """`async with ToolBox(contract) as tools:` connects to the MCP servers of the allowed tools (streamable HTTP,
    or MCP's older HTTP+SSE transport); ToolServerError when one cannot be used."""

    def __init__(self, contract: Contract) -> None:
        self.contract = contract
        self.offered: dict[str, OfferedTool] = {}
        self.calls = 0
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> "ToolBox":
        wanted = self.contract.offered_tools()
        by_server: dict[tuple[str, str, str], list[Tool]] = {}
        for tool in wanted:
            server = tool.mcp_server
            if server is None:
                raise ToolServerError(f"tool {tool.name} has no MCP server")
            by_server.setdefault((server.name, server.url, server.transport), []).append(tool)
        if not by_server:
            return self  # a run without tools never imports the MCP client (a cold sandbox's second-largest import)
        # A second of CPU or more: in a thread, so the task's stream (already open) goes on being served meanwhile.
        await asyncio.to_thread(importlib.import_module, "mcp.client.streamable_http")
        try:
            for (name, url, transport), tools in by_server.items():
                where = f"MCP server {name} ({url}, {transport})"
                try:
                    listed = await self._connect(url, transport, tools)
                except ToolServerError:
                    raise
                except Exception as err:
                    raise ToolServerError(f"{where} cannot be used: {cause_of(err)}") from None
                for tool in tools:
                    remote = listed.get(tool.tool_name)
                    if remote is None:
                        offers = ", ".join(sorted(listed)) or "none"
                        raise ToolServerError(
                            f"{where} has no tool {tool.tool_name} (Tool {tool.name}); it offers: {offers}"
                        )
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def _connect(self, url: str, transport: str, tools: list[Tool]) -> dict[str, Any]:
        """Connect to one server and offer its tools that are wanted; the server's tools by name."""
        from mcp import Client
        from mcp.client.sse import sse_client
        from mcp.client.streamable_http import streamable_http_client

        if transport == "sse":
            streams: Any = sse_client(url, timeout=30, sse_read_timeout=CALL_TIMEOUT_SECONDS)
        elif transport == "streamable-http":
            http = await self._stack.enter_async_context(
                httpx2.AsyncClient(
                    timeout=httpx2.Timeout(30, read=CALL_TIMEOUT_SECONDS),
                    # a tool server that traces joins the attempt's trace (its requests go out under the task)
                    event_hooks={"request": [tracing.inject_into_request]},
                )
            )
            streams = streamable_http_client(url, http_client=http)
        else:
            raise ToolServerError(f"MCP server at {url}: transport {transport!r} is not one the agent speaks")
        client = await self._stack.enter_async_context(Client(streams, read_timeout_seconds=30, cache=None))
        listed = {t.name: t for t in (await client.list_tools()).tools}
        for tool in tools:
            remote = listed.get(tool.tool_name)
            if remote is not None:
                self.offered[tool.name] = OfferedTool(
                    tool, client, tool.description or remote.description or "", dict(remote.input_schema)
                )
        return listed

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        await self._stack.aclose()

    def definitions(self) -> list[dict[str, Any]]:
        return [t.definition() for t in self.offered.values()]

    async def call(self, name: str, arguments: str) -> ToolResult:
        """Call a tool the model asked for. A tool that was not offered is refused, never run."""
        self.calls += 1
        offered = self.offered.get(name)
        if offered is None:
            return ToolResult(f"tool {name!r} is not available to this agent", is_error=True)
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as err:
            return ToolResult(f"arguments of {name} are not JSON: {err}", is_error=True)
        run = self.contract.run
        meta: Any = {  # RequestParamsMeta is an open TypedDict of namespaced keys
            META_IDEMPOTENCY_KEY: f"{run.uid}-a{run.attempt}-{self.calls}",
            META_RUN: f"{run.namespace}/{run.name}",
            META_RUN_UID: run.uid,
            META_ATTEMPT: run.attempt,
        }
        from mcp import MCPError  # imported already: a tool was offered

        try:
            result = await offered.client.call_tool(
                offered.tool.tool_name, args, meta=meta, read_timeout_seconds=CALL_TIMEOUT_SECONDS
            )
        except MCPError as err:
            return ToolResult(f"tool {name} failed: {err.error.message}", is_error=True)
        text = "".join(getattr(block, "text", "") for block in result.content)
        return ToolResult(text, bool(result.is_error))
