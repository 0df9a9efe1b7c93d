"""The reference agent as its own process (ksquad-agent), for the agent tests; the scripted model and the MCP
server come from tests.support.agents."""

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agents import MODEL_KEY
from tests.support.asgi import free_port
from workflows.contract import ExecutionContract


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


@pytest.fixture
async def start_agent(tmp_path: Path) -> AsyncIterator[AgentFactory]:
    """Start `ksquad-agent` as its own process: `await start_agent(contract=None)`; stopped afterwards."""
    started: list[AgentProcess] = []

    async def start(contract: ExecutionContract | None = None) -> AgentProcess:
        port = free_port()
        env = {
            **os.environ,
            "KSQUAD_CREDENTIAL_MODEL_KEY_APIKEY": MODEL_KEY,
            "KSQUAD_SECRETS_DIR": str(tmp_path / "no-secrets"),
        }
        if contract is not None:
            env["KSQUAD_EXECUTION_CONTRACT"] = contract.model_dump_json()
        log = tmp_path / f"agent-{port}.log"
        process = subprocess.Popen(
            [sys.executable, "-m", "agent.server", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        )  # fmt: skip
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

    yield start
    for agent in started:
        if agent.process.poll() is None:
            agent.process.kill()
        agent.process.wait(10)


def tool_meta(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(json.dumps(c["meta"])) for c in calls]
