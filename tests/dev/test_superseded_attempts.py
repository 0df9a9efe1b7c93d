"""A superseded attempt spends nothing (embedded default: Temporal's dev server, the worker, SQLite, ksquad's API, the
scripted model, an MCP server over HTTP). A Run's first attempt outlives timeouts.runSeconds while its model call is
held, and its cancel is lost: for an Agent's `endpoint` (a shared reference agent behind a proxy that drops
CancelTask) the agent goes on working when the held call answers; for a local sandbox the agent is stopped
(SIGSTOP) and hears nothing. The fence moves, attempt 2 runs and succeeds, writing to the item; then the held call
is let go. Zero model calls and zero tool calls are made after the fence moved but attempt 2's; the endpoint agent
asks the API before acting on the answer, is told 409 and stops (its stats count it superseded); the local agent
was killed before the claim was released, and a write with attempt 1's token is refused."""

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp.server.mcpserver import MCPServer

from activities.sandboxes.manifests import job_name
from agent.callers import ItemAccess, item_token, read_key
from dev.stack import ITEM_KEY_FILE, TOKEN_FILE, DevStack, dev_stack
from store import work_item_key
from store.objects import StoredObject
from testbed.asgi import serving
from testbed.embedded import stack_options, start_agent, wait_terminal
from testbed.isolate import service_address
from tests.support.a2a_proxy import dropping_cancels

NS = "bench"  # the test bed's instant agent serves this namespace
API = "ksquad.io/v1alpha1"
ITEM = "PAY-7"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "held": [
        {"hold": True, "tool_calls": [{"name": "notes", "arguments": {"text": "attempt 1"}}]},
        {"tool_calls": [{"name": "notes", "arguments": {"text": "attempt 2"}}]},
        {"text": "done"},
    ]
}


@dataclass
class Notes:
    url: str = ""
    taken: list[str] = field(default_factory=list)


@pytest.fixture
async def notes() -> AsyncIterator[Notes]:
    served = Notes()
    mcp = MCPServer("notes", log_level="WARNING")

    @mcp.tool()
    def add_note(text: str) -> str:
        """Add a note."""
        served.taken.append(text)
        return f"noted: {text}"

    async with serving(
        mcp.streamable_http_app(streamable_http_path="/mcp", host=service_address()), lifespan="on"
    ) as url:
        served.url = f"{url}/mcp"
        yield served


def objects(dev: DevStack, notes: Notes, agent: dict[str, Any]) -> list[dict[str, Any]]:
    def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}

    return [
        obj("MCPServer", "notes", {"url": notes.url}),
        obj("Tool", "notes", {"mcpServerRef": "notes", "toolName": "add_note"}),
        obj("Agent", "held", {"model": "held", "tools": ["notes"], "allowedTools": ["notes"], **agent}),
        obj(
            "Run",
            "outlived",
            {
                "agents": ["held"],
                "inputs": {"task": "Take a note."},
                "workItemRef": ITEM,
                "timeouts": {
                    "runSeconds": 8
                },  # attempt 2 starts a sandbox and calls twice within it, on a busy machine
                "retryPolicy": {"maxRetries": 1, "backoffSeconds": 1, "maxBackoffSeconds": 1},
            },
        ),
    ]


async def make_item(dev: DevStack) -> None:
    token = (dev.state_dir / TOKEN_FILE).read_text().strip()
    async with httpx.AsyncClient(base_url=dev.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
        made = await api.post(f"/items/{NS}", json={"id": ITEM, "title": "Take a note"})
        assert made.status_code == 201, made.text


async def until(what: str, check: Any, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"waited {within:.0f}s for {what}"
        await asyncio.sleep(0.1)


async def fence_moved_at(dev: DevStack) -> float:
    """When attempt 1's fence moved (the claim's history), once attempt 2 holds the item."""

    async def second_claim() -> bool:
        return (
            len([h for h in await dev.store.claim_history(work_item_key(NS, ITEM)) if h.action == "claimed"])
            >= 2
        )

    await until("attempt 2 to claim the item", second_claim)
    history = await dev.store.claim_history(work_item_key(NS, ITEM))
    return next(h.at.timestamp() for h in history if h.action == "fenced")


async def check_nothing_spent_after_the_fence(dev: DevStack, notes: Notes, fenced_at: float) -> None:
    assert dev.scripted is not None
    calls = [c for c in dev.scripted.calls if c.model == "held"]
    after = [c for c in calls if c.at > fenced_at]
    assert (len(calls), len(after)) == (3, 2), (
        f"attempt 1's one held call, attempt 2's two after the fence moved: {[(c.at, c.messages) for c in calls]}"
    )
    assert notes.taken == ["attempt 2"], "attempt 1's tool call never ran"
    entries = await dev.store.item_events(NS, ITEM)
    late = [e for e in entries if e.author.attempt == 1 and e.at.timestamp() > fenced_at]
    assert late == [], late
    finished = [e for e in entries if e.author.attempt == 2 and e.kind == "comment"]
    assert finished and "finished" in finished[-1].body, "attempt 2's write went through"


async def test_an_endpoint_agent_whose_cancel_is_lost_makes_no_call_after_the_fence_moved(
    tmp_path: Path, notes: Notes
) -> None:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as dev:
        assert dev.scripted is not None
        dev.scripted.held = True
        agent = await start_agent(dev)  # the shared reference agent, with the endpoint key of the stack
        try:
            instant = await dev.runs.objects.get("Agent", NS, "instant")
            assert instant is not None
            agent_url = instant.spec["endpoint"]
            proxy = dropping_cancels(agent_url)
            async with serving(proxy) as proxy_url:
                await make_item(dev)
                await dev.runs.apply(
                    objects(dev, notes, {"modelEndpointRef": "local", "endpoint": f"{proxy_url}/"})
                )
                fenced_at = await fence_moved_at(dev)
                assert proxy.state.dropped, "attempt 1's CancelTask was sent, and lost"
                assert await wait_terminal(dev, ["outlived"], within=120) == {"outlived": "Succeeded"}
                dev.scripted.held = False  # attempt 1's call answers now, to an agent nobody stopped

                async def stopped_superseded() -> bool:
                    async with httpx.AsyncClient() as http:
                        stats = (await http.get(f"{agent_url}ksquad/stats")).json()
                    return bool(stats["superseded"] == 1)

                await until("attempt 1's agent to stop, superseded", stopped_superseded, within=30)
                assert dev.scripted.abandoned == 0, "the held call was answered: its agent was alive to act"
                await check_nothing_spent_after_the_fence(dev, notes, fenced_at)
                stopped = agent_stopped(await dev.runs.get(NS, "outlived"))
                assert (stopped["status"], stopped["reason"]) == ("False", "CancelUnconfirmed"), stopped
                assert (
                    stopped["message"].startswith("attempt 1: ")
                    and proxy.state.dropped[0] in stopped["message"]
                )
        finally:
            agent.terminate()
            agent.wait(10)


async def test_a_local_agent_that_hears_no_cancel_is_killed_before_the_claim_is_released(
    tmp_path: Path, notes: Notes
) -> None:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as dev:
        assert dev.scripted is not None
        dev.scripted.held = True
        await make_item(dev)
        await dev.runs.apply(objects(dev, notes, {"modelEndpointRef": "local"}))

        async def held_call() -> bool:
            assert dev.scripted is not None
            return dev.scripted.in_flight == 1

        await until("attempt 1's model call", held_call)
        pid_file = dev.state_dir / "sandboxes" / f"{job_name('outlived', 1)}.pid"
        os.kill(int(pid_file.read_text()), signal.SIGSTOP)  # it hears no cancel from now on
        fenced_at = await fence_moved_at(dev)
        assert await wait_terminal(dev, ["outlived"], within=120) == {"outlived": "Succeeded"}
        dev.scripted.held = False
        await until("the held call's client to be gone", held_call_abandoned(dev))
        await check_nothing_spent_after_the_fence(dev, notes, fenced_at)

        run = await dev.runs.get(NS, "outlived")
        stopped = agent_stopped(run)  # it did not confirm the cancel; its sandbox's deletion settled it
        assert (stopped["status"], stopped["reason"]) == ("True", "SandboxGone"), stopped
        assert job_name("outlived", 1) in stopped["message"] and "attempt 1: " in stopped["message"]
        history = await dev.store.claim_history(work_item_key(NS, ITEM))
        first = ItemAccess(NS, ITEM, f"{NS}/outlived", run.uid, 1, history[0].fence, int(time.time()) + 600)
        async with as_attempt(dev, first) as api:
            late = await api.post("/attempts/checkpoints", json=one_step(1))
        assert late.status_code == 409, late.text
        assert "attempt 1" in late.json()["error"] and "no longer current" in late.json()["error"]


@asynccontextmanager
async def as_attempt(dev: DevStack, access: ItemAccess) -> AsyncIterator[httpx.AsyncClient]:
    """The embedded API, with the token the worker would have made for that attempt."""
    token = item_token(read_key(dev.state_dir / ITEM_KEY_FILE), access)
    async with httpx.AsyncClient(base_url=dev.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
        yield api


def one_step(step: int) -> dict[str, Any]:
    return {"steps": [{"step": step, "kind": "turn", "data": {"message": {}}}]}


def held_call_abandoned(dev: DevStack) -> Any:
    async def check() -> bool:
        assert dev.scripted is not None
        return dev.scripted.abandoned == 1

    return check


def agent_stopped(run: StoredObject) -> dict[str, Any]:
    (condition,) = [c for c in (run.status or {}).get("conditions", []) if c["type"] == "AgentStopped"]
    return dict(condition)


async def test_an_attempts_token_dies_with_its_run(tmp_path: Path) -> None:
    """A Run without a work item: once it has ended, its last attempt's token (good for hours) writes and reads
    no checkpoint. Before, the Run's fence stayed the attempt's and the token acted until it expired; a Run with a
    work item releases its claim at the end, which refuses its tokens the same way."""
    async with dev_stack(stack_options(tmp_path / ".ksquad", {"quick": [{"text": "done"}]})) as dev:
        agent = {"modelEndpointRef": "local", "model": "quick"}
        await dev.runs.apply(
            [
                {
                    "apiVersion": API,
                    "kind": "Agent",
                    "metadata": {"name": "quick", "namespace": NS},
                    "spec": agent,
                },
                {
                    "apiVersion": API,
                    "kind": "Run",
                    "metadata": {"name": "ended", "namespace": NS},
                    "spec": {"agents": ["quick"]},
                },
            ]
        )
        assert await wait_terminal(dev, ["ended"], within=60) == {"ended": "Succeeded"}
        run = await dev.runs.get(NS, "ended")
        access = ItemAccess(NS, "", f"{NS}/ended", run.uid, 1, 1, int(time.time()) + 600)
        async with as_attempt(dev, access) as api:
            late = await api.post("/attempts/checkpoints", json=one_step(9))
            read = await api.get("/attempts/checkpoints")
        assert (late.status_code, read.status_code) == (409, 409), (late.text, read.text)
        assert "attempt 1" in late.json()["error"] and "no longer current" in late.json()["error"]
        assert await dev.store.checkpoints(run.uid) == [], "nothing written after the Run's ending"
