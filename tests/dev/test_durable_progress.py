"""Durable agent progress on the embedded default (Temporal's dev server, the worker, SQLite, local sandboxes of the
reference agent, the scripted model, an MCP server over HTTP, ksquad's API): an agent of ten steps, each a model
turn and a call of the MCP tool, has its sandbox SIGKILLed while the tool of step seven runs. The retry, in a new
sandbox, reads the seven recorded steps through the API, is told that step seven's tool call was in flight, and
makes exactly three model turns to the answer; the usage rows say seven and three. The same with the worker killed
at the same moment (its own process, started again)."""

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp.server.mcpserver import MCPServer

from activities.sandboxes.manifests import job_name
from dev.stack import DevStack, dev_stack
from testbed.asgi import serving
from testbed.embedded import stack_options, start_workers, stop_workers, wait_terminal
from testbed.isolate import service_address

NS = "bench"  # wait_terminal's namespace
API = "ksquad.io/v1alpha1"
STEPS = 10
KILLED_AT = 7
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "stepper": [
        *({"tool_calls": [{"name": "notes", "arguments": {"text": f"step {n}"}}]} for n in range(1, STEPS)),
        {"text": f"all {STEPS} steps done"},
    ]
}


@dataclass
class HeldTool:
    """A real MCP server (streamable HTTP) whose add_note holds the call of one step until the test lets it go."""

    url: str = ""
    notes: list[str] = field(default_factory=list)
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


@pytest.fixture
async def tool() -> AsyncIterator[HeldTool]:
    held = HeldTool()
    mcp = MCPServer("steps", log_level="WARNING")

    @mcp.tool()
    async def add_note(text: str) -> str:
        """Add a note."""
        if text == f"step {KILLED_AT}" and not held.reached.is_set():
            held.reached.set()
            await held.release.wait()
        held.notes.append(text)
        return f"noted: {text}"

    async with serving(
        mcp.streamable_http_app(streamable_http_path="/mcp", host=service_address()), lifespan="on"
    ) as url:
        held.url = f"{url}/mcp"
        yield held
        held.release.set()


def objects(dev: DevStack, tool: HeldTool) -> list[dict[str, Any]]:
    def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}

    return [
        # The scripted model without a key: a worker process of the test bed gives its local agents none.
        obj("ModelEndpoint", "scripted", {"url": dev.model_url}),
        obj("MCPServer", "steps", {"url": tool.url}),
        obj("Tool", "notes", {"mcpServerRef": "steps", "toolName": "add_note"}),
        obj(
            "Agent",
            "stepper",
            {
                "modelEndpointRef": "scripted",
                "model": "stepper",
                "tools": ["notes"],
                "allowedTools": ["notes"],
            },
        ),
        obj(
            "Run",
            "ten-steps",
            {
                "agents": ["stepper"],
                "inputs": {"task": "Take ten steps."},
                "retryPolicy": {"backoffSeconds": 1, "maxBackoffSeconds": 1},
            },
        ),
    ]


def sandbox_pid(state_dir: Path, attempt: int) -> int:
    """The local agent of the attempt, by the pid file its worker wrote (an in-process worker's, in the state
    folder; a worker process's, in its working directory, the state folder too)."""
    name = f"{job_name('ten-steps', attempt)}.pid"
    for pid_file in (state_dir / "sandboxes" / name, state_dir / ".ksquad" / "sandboxes" / name):
        if pid_file.exists():
            return int(pid_file.read_text())
    raise AssertionError(f"no pid file {name} under {state_dir}")


async def kill_at_step_seven(dev: DevStack, tool: HeldTool, worker: Any = None) -> None:
    await asyncio.wait_for(tool.reached.wait(), 120)
    os.kill(sandbox_pid(dev.state_dir, 1), signal.SIGKILL)
    if worker is not None:
        worker.kill()
        worker.wait(10)
    tool.release.set()  # the dead agent's call completes on the tool's side: it took effect, nobody heard


async def check_the_retry_made_three_turns(dev: DevStack, tool: HeldTool) -> None:
    run = await dev.runs.get(NS, "ten-steps")
    assert run.status is not None and run.status["attempt"] == 2, run.status
    assert dev.scripted is not None
    calls = [c for c in dev.scripted.calls if c.model == "stepper"]
    assert len(calls) == STEPS, f"{len(calls)} model calls, {STEPS} steps: the retry asked nothing twice"
    first, retry = calls[KILLED_AT - 1], calls[KILLED_AT]
    assert retry.messages == first.messages + 2, (
        "the retry's first call carries the conversation to step seven (its turn, and its tool call's answer)"
    )
    assert "in flight when attempt 1 stopped" in retry.tool_results[-1], retry.tool_results
    assert [u.calls for u in [await dev.store.run_usage(run.uid, a) for a in (1, 2)]] == [KILLED_AT, 3]
    assert tool.notes == [f"step {n}" for n in range(1, STEPS)], "each step's tool ran once"
    assert await dev.store.checkpoints(run.uid) == [], "the Run ended: its steps are forgotten"


async def test_a_sandbox_killed_after_step_seven_is_retried_from_step_eight(
    tmp_path: Path, tool: HeldTool
) -> None:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as dev:
        await dev.runs.apply(objects(dev, tool))
        await kill_at_step_seven(dev, tool)
        assert await wait_terminal(dev, ["ten-steps"], within=180) == {"ten-steps": "Succeeded"}
        await check_the_retry_made_three_turns(dev, tool)


@pytest.mark.timeout(600)
async def test_the_sandbox_and_the_worker_killed_together_after_step_seven_lose_no_step(
    tmp_path: Path, tool: HeldTool
) -> None:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT, serve_worker=False)) as dev:
        [worker] = await start_workers(dev, 1)
        try:
            await dev.runs.apply(objects(dev, tool))
            await kill_at_step_seven(dev, tool, worker)
            started = time.monotonic()
            [worker] = await start_workers(dev, 1)
            assert await wait_terminal(dev, ["ten-steps"], within=300) == {"ten-steps": "Succeeded"}
            print(
                f"[durable] the retry succeeded {time.monotonic() - started:.1f}s after the worker restarted"
            )
            await check_the_retry_made_three_turns(dev, tool)
        finally:
            stop_workers([worker])
