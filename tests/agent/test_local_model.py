"""A real model, locally (testbed/local_model.py: llama.cpp's server with SmolLM2-135M-Instruct), behind the embedded
stack's `local` endpoint as `OPENAI_BASE_URL` sets it. What the model says is its own: these tests assert that
whatever it produces is handled, never what it says.

- The server streams, and its last chunk carries the call's usage, as the reference agent asks (the property
  ksquad's accounting rests on).
- The seed's squad runs a Run on it to Succeeded, with an MCP tool the model may call (mcp-server-time behind
  mcp-proxy); a question it asks the person is answered; its tokens are charged to the credential and the person.
- Behind a gateway that takes one request at a time (429 with Retry-After past it, as operators bound self-hosted
  models), a Run whose call finds the model busy pauses RateLimited, resumes by itself, and succeeds."""

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from dev.stack import DevStack, dev_stack
from testbed.embedded import stack_options
from testbed.field_mcp import FieldMcp, serving_field_mcp
from testbed.local_model import LocalModel, gated, serving_local_model
from workflows.signals import RunSignal
from workflows.status import Phase

NS = "bench"
API = "ksquad.io/v1alpha1"
KEY = "local-model-key"  # llama-server's --api-key: the agent must send the local credential


@pytest.fixture(scope="module")
async def local_model(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalModel]:
    async with serving_local_model(tmp_path_factory.mktemp("llama"), api_key=KEY) as model:
        yield model


@pytest.fixture(scope="module")
async def field(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FieldMcp]:
    async with serving_field_mcp(tmp_path_factory.mktemp("field-mcp")) as served:
        yield served


def real_model_stack(root: Path, url: str, model: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_MODEL", model)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    options = stack_options(root / ".ksquad")
    options.scripted_model = False
    return dev_stack(options)


def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}


async def until_done(dev: DevStack, name: str, within: float = 300) -> dict[str, Any]:
    """The Run's status once it ends; a question the model asks the person is answered once, as a person would."""
    deadline, answered = time.monotonic() + within, False
    while True:
        status: dict[str, Any] = (await dev.runs.get(NS, name)).status or {}
        phase = status.get("phase", "")
        if phase and Phase(phase).terminal:
            return status
        if phase == Phase.PAUSED and status.get("reason") == "InputRequired" and not answered:
            await dev.runs.signal(NS, name, RunSignal.INPUT, "Carry on with what you have.")
            answered = True
        assert time.monotonic() < deadline, (
            f"{name} did not end in {within:.0f} s: {json.dumps(status)[:1500]}"
        )
        await asyncio.sleep(0.5)


async def test_the_model_server_streams_and_its_last_chunk_carries_the_usage(local_model: LocalModel) -> None:
    body = {
        "model": local_model.name,
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 16,
    }
    chunks: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(timeout=120) as http,
        http.stream(
            "POST",
            f"{local_model.url}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        ) as answer,
    ):
        assert answer.status_code == 200, await answer.aread()
        assert answer.headers["content-type"].startswith("text/event-stream")
        async for line in answer.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append(json.loads(line[5:]))
    assert len(chunks) > 2, "streamed, a chunk at a time"
    usage = chunks[-1]["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, chunks[-1]
    async with httpx.AsyncClient(timeout=30) as http:
        unauthorized = await http.post(f"{local_model.url}/chat/completions", json=body)
    assert unauthorized.status_code == 401, "without the key the model answers nobody"


async def test_a_run_on_the_real_model_succeeds_with_a_tool_and_its_tokens_are_charged(
    local_model: LocalModel, field: FieldMcp, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with real_model_stack(tmp_path, local_model.url, local_model.name, monkeypatch) as dev:
        await dev.runs.apply(
            [
                obj("MCPServer", "time", {"url": field.url("time", "streamable-http")}),
                obj("Tool", "now", {"mcpServerRef": "time", "toolName": "get_current_time"}),
                obj(
                    "Agent",
                    "local",
                    {
                        "modelEndpointRef": "local",
                        "systemPrompt": "You answer briefly. Use the tool `now` to learn the time.",
                        "tools": ["now"],
                        "allowedTools": ["now"],
                    },
                ),
                obj(
                    "Run",
                    "asks-the-time",
                    {"agents": ["local"], "inputs": {"task": "What time is it in UTC?"}},
                ),
            ]
        )
        started = datetime.now(UTC)
        status = await until_done(dev, "asks-the-time")
        run = await dev.runs.get(NS, "asks-the-time")
        events = await dev.store.events(run.uid)
        usage = await dev.store.run_usage(run.uid)
        by_credential = await dev.store.usage("credential", started, namespace=NS)
        by_person = await dev.store.usage("triggered_by", started, namespace=NS)
    print(f"[local model] {status.get('phase')}: {json.dumps(status.get('outputs'))[:300]}")
    print("[local model] progress: " + " | ".join(e.message[:80] for e in events if e.kind != "phase"))
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert next(iter(status["outputs"].values())).strip(), "an answer, whatever it says"
    assert usage.calls >= 1 and usage.input_tokens > 0 and usage.output_tokens > 0, usage
    assert [(u.key, u.calls) for u in by_credential] == [(f"{NS}/local-model", usage.calls)], by_credential
    assert [(u.key, u.calls) for u in by_person] == [(dev.runs.user, usage.calls)], by_person


async def test_a_busy_model_pauses_the_run_rate_limited_and_it_resumes_by_itself(
    local_model: LocalModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        gated(local_model.url, retry_after=3) as gate,
        real_model_stack(tmp_path, gate.url, local_model.name, monkeypatch) as dev,
    ):
        gate.busy = True  # another client's request holds the model's one slot
        await dev.runs.apply(
            [
                obj("Agent", "local", {"modelEndpointRef": "local", "systemPrompt": "You answer briefly."}),
                obj("Run", "waits-its-turn", {"agents": ["local"], "inputs": {"task": "Say hello."}}),
            ]
        )
        deadline = time.monotonic() + 120
        while True:
            status = (await dev.runs.get(NS, "waits-its-turn")).status or {}
            if status.get("phase") == Phase.PAUSED and status.get("reason") == "RateLimited":
                break
            assert time.monotonic() < deadline, json.dumps(status)[:1500]
            await asyncio.sleep(0.2)
        assert gate.refused >= 1 and gate.served == 0, "refused at the gateway: the model never saw it"
        gate.busy = False  # the other request ended
        status = await until_done(dev, "waits-its-turn", within=300)
        run = await dev.runs.get(NS, "waits-its-turn")
        phases = [e.data["phase"] for e in await dev.store.events(run.uid) if e.kind == "phase"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert "Paused" in phases and phases[-1] == "Succeeded", phases
    assert gate.served >= 1
