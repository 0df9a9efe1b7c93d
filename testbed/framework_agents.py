"""Agents of other frameworks, served over A2A as their users serve them (testbed/field_agents/), each by its
framework's own virtualenv (testbed/pyenvs.py), talking to an OpenAI-compatible model."""

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed.isolate import free_port, service_address
from testbed.pyenvs import GOOGLE_ADK, LANGGRAPH, PYDANTIC_AI, field_env
from testbed.served import serving_process

AGENTS = Path(__file__).with_name("field_agents")
# framework -> (virtualenv name, its pins, the script that serves an agent)
FRAMEWORKS = {
    "pydantic-ai": ("pydantic-ai", PYDANTIC_AI, "pydantic_ai_fasta2a.py"),
    "google-adk": ("google-adk", GOOGLE_ADK, "google_adk_a2a.py"),
    "langgraph": ("langgraph", LANGGRAPH, "langgraph_a2a.py"),
}


@dataclass
class FrameworkAgent:
    url: str
    log: Path


@asynccontextmanager
async def serving_framework_agent(
    framework: str, model_url: str, model: str, root: Path
) -> AsyncIterator[FrameworkAgent]:
    env_name, pins, script = FRAMEWORKS[framework]
    bin_dir = await asyncio.to_thread(field_env, env_name, pins)
    host, port = service_address(), free_port()
    log = root / f"{framework}-{port}.log"
    command = [str(bin_dir / "python"), str(AGENTS / script), host, str(port), model_url, model]
    url = f"http://{host}:{port}/"
    env = {**os.environ, "OPENAI_API_KEY": "ksquad-dev"}
    async with serving_process(f"{framework} agent", command, f"{url}.well-known/agent-card.json", log, env):
        yield FrameworkAgent(url, log)
