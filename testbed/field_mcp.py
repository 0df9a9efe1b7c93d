"""Real MCP servers, as users deploy them: the reference servers `mcp-server-time` and `mcp-server-git` (stdio
programs) behind `mcp-proxy`, which serves each on streamable HTTP (/servers/NAME/mcp) and on MCP's older HTTP+SSE
transport (/servers/NAME/sse). The git server reads a repository of two commits made here."""

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.isolate import free_port, service_address
from testbed.pyenvs import MCP_PROXY, MCP_SERVERS, field_env
from testbed.served import serving_process

COMMITS = ("first: the payment retry test", "second: the retry test freezes its clock")


@dataclass
class FieldMcp:
    base: str  # http://host:port of mcp-proxy
    repository: Path  # what the git server reads
    log: Path

    def url(self, server: str, transport: str) -> str:
        """`server` (time, git) on `transport` (streamable-http, sse)."""
        return f"{self.base}/servers/{server}/{'sse' if transport == 'sse' else 'mcp'}"


def repository(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)

    git("init", "-q", "-b", "main")
    for number, message in enumerate(COMMITS):
        (root / "notes.txt").write_text(f"{message}\n" * (number + 1))
        git("add", "notes.txt")
        git("-c", "user.name=Test", "-c", "user.email=test@example.com", "commit", "-q", "-m", message)
    return root


@asynccontextmanager
async def serving_field_mcp(root: Path) -> AsyncIterator[FieldMcp]:
    servers = await asyncio.to_thread(field_env, "mcp-servers", MCP_SERVERS)
    proxy = await asyncio.to_thread(field_env, "mcp-proxy", MCP_PROXY)
    repo = repository(root / "repo")
    host, port = service_address(), free_port()
    log = root / "mcp-proxy.log"
    command = [
        str(proxy / "mcp-proxy"),
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        "WARNING",
        "--named-server",
        "time",
        f"{servers / 'mcp-server-time'} --local-timezone UTC",
        "--named-server",
        "git",
        f"{servers / 'mcp-server-git'} --repository {repo}",
    ]
    base = f"http://{host}:{port}"
    async with serving_process("mcp-proxy", command, f"{base}/status", log):
        yield FieldMcp(base, repo, log)
