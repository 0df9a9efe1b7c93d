"""The reference agent with the MCP servers users already run: `mcp-server-time` and `mcp-server-git` behind
`mcp-proxy` (testbed/field_mcp.py), named by MCPServer and Tool objects on the embedded stack, one on streamable
HTTP and one on MCP's older SSE transport. A Run's model calls both and gets their real answers; a tool of the
server that the Agent's allowedTools leaves out is never offered and never reaches the server; a Tool naming what
the server does not have, a server that is down and one that refuses each fail the Run with a message that names
the server and the cause."""

import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest

from dev.stack import DevStack, dev_stack
from testbed.embedded import stack_options, wait_terminal
from testbed.field_mcp import FieldMcp, serving_field_mcp
from testbed.isolate import free_port, service_address

NS = "bench"  # wait_terminal's
API = "ksquad.io/v1alpha1"


@pytest.fixture(scope="module")
async def field(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FieldMcp]:
    async with serving_field_mcp(tmp_path_factory.mktemp("field-mcp")) as served:
        yield served


@pytest.fixture(scope="module")
async def dev(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path_factory.mktemp("mcp") / ".ksquad", {})) as stack:
        yield stack


def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}


def squad(
    name: str, tools: dict[str, tuple[str, str]], servers: dict[str, dict[str, str]]
) -> list[dict[str, Any]]:
    """MCPServers `servers`, Tools `tools` ({Tool name: (server, tool on it)}), an Agent `name` allowed exactly
    those tools on the scripted model `name`, and a Run of it that is not retried."""
    return [
        *(obj("MCPServer", server, spec) for server, spec in servers.items()),
        *(
            obj("Tool", tool, {"mcpServerRef": server, "toolName": remote})
            for tool, (server, remote) in tools.items()
        ),
        obj(
            "Agent",
            name,
            {"modelEndpointRef": "local", "model": name, "tools": list(tools), "allowedTools": list(tools)},
        ),
        obj(
            "Run",
            name,
            {"agents": [name], "inputs": {"task": f"the task of {name}"}, "retryPolicy": {"maxRetries": 0}},
        ),
    ]


async def finished(dev: DevStack, name: str) -> dict[str, Any]:
    phases = await wait_terminal(dev, [name], within=120)
    assert phases.get(name) in ("Succeeded", "Failed"), phases
    status: dict[str, Any] = (await dev.runs.get(NS, name)).status or {}
    return status


async def test_a_run_calls_the_time_and_git_servers_over_both_transports_and_only_its_allowed_tools(
    dev: DevStack, field: FieldMcp
) -> None:
    assert dev.scripted is not None
    repo = str(field.repository)
    dev.scripted.script["tools"] = [
        {
            "tool_calls": [
                {"name": "now", "arguments": {"timezone": "UTC"}},
                {"name": "log", "arguments": {"repo_path": repo, "max_count": 5}},
                # the git server has this tool; the Agent may not use it
                {"name": "git_create_branch", "arguments": {"repo_path": repo, "branch_name": "evil"}},
            ]
        },
        {"text": "It is late, and the clock fix is the newest commit."},
    ]
    servers = {
        "time": {"url": field.url("time", "streamable-http"), "transport": "streamable-http"},
        "git": {"url": field.url("git", "sse"), "transport": "sse"},
    }
    await dev.runs.apply(
        squad("tools", {"now": ("time", "get_current_time"), "log": ("git", "git_log")}, servers)
    )
    status = await finished(dev, "tools")
    assert status["phase"] == "Succeeded", status
    assert status["outputs"] == {"answer": "It is late, and the clock fix is the newest commit."}
    first, second = [c for c in dev.scripted.calls if c.model == "tools"]
    assert set(first.tools) == {"now", "log", "ksquad_request_input"}, "only the allowed tools are offered"
    now, log, refused = second.tool_results
    assert '"timezone": "UTC"' in now and '"datetime": "' in now, now
    assert "second: the retry test freezes its clock" in log and "first: the payment retry test" in log, log
    assert refused == "tool 'git_create_branch' is not available to this agent", refused
    branches = subprocess.run(["git", "-C", repo, "branch", "--list"], capture_output=True, text=True).stdout
    assert "evil" not in branches, "the refused call never reached the git server"


@pytest.mark.parametrize(
    ("case", "server", "remote", "expected"),
    [
        (
            "missing-tool",
            "field",
            "git_push",
            "MCP server git-field ({url}, streamable-http) has no tool git_push (Tool push); it offers: git_add,",
        ),
        ("server-down", "down", "git_log", "MCP server git-down ({url}, streamable-http) cannot be used: "),
        (
            "server-refuses",
            "refuses",
            "git_log",
            "MCP server git-refuses ({url}, streamable-http) cannot be used: ",
        ),
    ],
)
async def test_a_server_that_cannot_serve_the_runs_tools_fails_the_run_naming_it_and_why(
    dev: DevStack, field: FieldMcp, case: str, server: str, remote: str, expected: str
) -> None:
    urls = {
        "field": field.url("git", "streamable-http"),
        "down": f"http://{service_address()}:{free_port()}/mcp",  # nothing listens there
        "refuses": f"{field.base}/servers/nowhere/mcp",  # mcp-proxy answers 404
    }
    url = urls[server]
    name = f"git-{server}"
    await dev.runs.apply(
        squad(case, {"push" if case == "missing-tool" else "log": (name, remote)}, {name: {"url": url}})
    )
    status = await finished(dev, case)
    assert status["phase"] == "Failed", status
    message = status["message"]
    assert expected.format(url=url) in message, message
    assert "TaskGroup" not in message, message
    causes = {"server-down": "ConnectError", "server-refuses": "Not Found"}
    assert causes.get(case, "") in message, message
