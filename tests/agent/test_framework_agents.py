"""Agents built with other frameworks serve Runs as an Agent's `endpoint` on the embedded stack, each as its users
serve it and with its framework's own dependencies (testbed/framework_agents.py), its model the scripted one:
a Run to Succeeded with the agent's answer as its message, a Run cancelled while the agent works, and (LangGraph's
interrupt) a Run that waits for the person's answer and goes on with it."""

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack import DevStack, dev_stack
from testbed.embedded import stack_options, wait_terminal
from testbed.framework_agents import serving_framework_agent
from workflows.signals import RunSignal
from workflows.status import Phase

NS = "bench"
API = "ksquad.io/v1alpha1"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "answers": [{"text": "The retry test waits for the clock now."}],
    "thinks": [{"delay": 600, "text": "never"}],
}


@pytest.fixture(scope="module")
async def dev(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path_factory.mktemp("frameworks") / ".ksquad", SCRIPT)) as stack:
        yield stack


def agent_and_run(
    name: str, url: str, task: str = "Fix the flaky retry test.", **spec: str
) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": API,
            "kind": "Agent",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"endpoint": url, **spec},
        },
        {
            "apiVersion": API,
            "kind": "Run",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "agents": [name],
                "inputs": {"task": task},
                "retryPolicy": {"maxRetries": 0},
            },
        },
    ]


# What each framework's agent needs of the Agent: FastA2A's pydantic-ai bridge (2.1.1) fails a task whose message
# has a data part ("Data parts are not supported yet"), so the contract goes in the message's metadata.
AGENT_SPEC: dict[str, dict[str, str]] = {
    "pydantic-ai": {"contractIn": "metadata"},
    "google-adk": {},
    "langgraph": {},
}


@pytest.mark.parametrize("framework", list(AGENT_SPEC))
async def test_a_framework_agent_serves_a_run_to_succeeded(
    dev: DevStack, framework: str, tmp_path: Path
) -> None:
    name = f"{framework}-answers"
    async with serving_framework_agent(framework, dev.model_url, "answers", tmp_path) as agent:
        await dev.runs.apply(agent_and_run(name, agent.url, **AGENT_SPEC[framework]))
        phases = await wait_terminal(dev, [name], within=120)
        status = (await dev.runs.get(NS, name)).status or {}
    assert phases == {name: "Succeeded"}, f"{status}\n{agent.log.read_text()[-4000:]}"
    assert status["message"] == "The retry test waits for the clock now.", status
    assert dev.scripted is not None
    asked = [c for c in dev.scripted.calls if c.model == "answers"]
    assert asked and "Fix the flaky retry test." in asked[-1].task, "the agent's model got the Run's task"


@pytest.mark.parametrize("framework", list(AGENT_SPEC))
async def test_a_framework_agents_run_is_cancelled_while_it_works(
    dev: DevStack, framework: str, tmp_path: Path
) -> None:
    name = f"{framework}-cancelled"
    assert dev.scripted is not None
    async with serving_framework_agent(framework, dev.model_url, "thinks", tmp_path) as agent:
        await dev.runs.apply(agent_and_run(name, agent.url, **AGENT_SPEC[framework]))
        deadline = time.monotonic() + 120
        while not [c for c in dev.scripted.calls if c.model == "thinks"]:
            assert time.monotonic() < deadline, agent.log.read_text()[-2000:]
            await asyncio.sleep(0.2)
        await dev.runs.signal(NS, name, RunSignal.CANCEL, "the test cancels it")
        phases = await wait_terminal(dev, [name], within=120)
        status = (await dev.runs.get(NS, name)).status or {}
    assert phases == {name: Phase.CANCELLED}, f"{status}\n{agent.log.read_text()[-2000:]}"


async def test_a_langgraph_interrupt_is_the_runs_question_and_the_persons_answer_resumes_it(
    dev: DevStack, tmp_path: Path
) -> None:
    name = "langgraph-asks"
    assert dev.scripted is not None
    async with serving_framework_agent("langgraph", dev.model_url, "answers", tmp_path) as agent:
        await dev.runs.apply(agent_and_run(name, agent.url, task="Fix the flaky retry test. Which branch?"))
        deadline = time.monotonic() + 120
        while True:
            status = (await dev.runs.get(NS, name)).status or {}
            if status.get("phase") == Phase.PAUSED and status.get("reason") == "InputRequired":
                break
            assert time.monotonic() < deadline, f"{status}\n{agent.log.read_text()[-2000:]}"
            await asyncio.sleep(0.2)
        assert "Which branch should I work on?" in status["message"], status
        asked_before = len([c for c in dev.scripted.calls if c.model == "answers"])
        await dev.runs.signal(NS, name, RunSignal.INPUT, "release-2")
        phases = await wait_terminal(dev, [name], within=120)
        status = (await dev.runs.get(NS, name)).status or {}
    assert phases == {name: "Succeeded"}, f"{status}\n{agent.log.read_text()[-2000:]}"
    assert status["message"] == "The retry test waits for the clock now.", status
    asked = [c for c in dev.scripted.calls if c.model == "answers"][asked_before:]
    assert len(asked) == 1 and "branch: release-2" in asked[0].task, asked
