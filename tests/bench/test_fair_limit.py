"""bench.fair_limit, the comparator bench.overhead measures ksquad against, makes the same A2A call as a ksquad Run:
on the embedded stack with the shared-endpoint reference agent and the scripted model, a Run and the fair limit's
workflow (given the contract read from that Run's history) send the same message to the same agent (read off the
wire: the same JSON-RPC method, text, contract and model; only the run's identity, the message's ids and the
checkpoint access ksquad alone grants differ), whose model sees the same request (model, credential, task,
messages, tools), and each gets its own call's answer (the script's next); the fair limit's history is the least a workflow can have: one
activity between two workflow tasks, two Temporal Cloud actions.

With a warm sandbox: tests/crd_bridge/test_fair_limit_sandboxed.py."""

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.fair_limit import (
    FAIR_TASK_QUEUE,
    FairLimitWorkflow,
    contract_of_a_run,
    fair_limit_worker,
    fair_task_for,
)
from bench.histories import shape_of
from testbed.embedded import AGENT, MODEL, NAMESPACE, bench_stack, run_docs

# Two different answers, one for each caller in turn: an answer found in the wrong order would show.
SCRIPT = {MODEL: [{"text": "the first answer"}, {"text": "the second answer"}]}


def seen(call: object) -> dict[str, object]:
    """A model call as the scripted model recorded it, less its time."""
    return {k: v for k, v in vars(call).items() if k != "at"}


def sent_messages(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, dict[str, Any]]]:
    """Every JSON-RPC request this process sends over HTTP, as (URL, method, params), as it goes on the wire:
    ksquad's worker (in this process: the embedded stack) and the fair limit's activity alike."""
    sent: list[tuple[str, str, dict[str, Any]]] = []
    send = httpx.AsyncHTTPTransport.handle_async_request

    async def recording(self: httpx.AsyncHTTPTransport, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.content.startswith(b"{"):
            body = json.loads(request.content)
            if isinstance(body, dict) and "jsonrpc" in body:
                sent.append((str(request.url), body["method"], body.get("params") or {}))
        return await send(self, request)

    monkeypatch.setattr(httpx.AsyncHTTPTransport, "handle_async_request", recording)
    return sent


def the_same_call(params: dict[str, Any]) -> dict[str, Any]:
    """A SendMessage's params less what is the attempt's own: the message's and the context's ids, the run's
    identity in the contract (and its name in the text of a task without inputs), and the checkpoint access
    (attemptApi) that only ksquad's attempts are given."""
    message = dict(params["message"])
    for own in ("messageId", "contextId"):
        message.pop(own)
    (contract_part,) = [part for part in message["parts"] if "data" in part]
    run = contract_part["data"]["ksquad.io/contract"]["run"]
    parts = []
    for part in message["parts"]:
        if "data" in part:
            contract = dict(part["data"]["ksquad.io/contract"])
            contract.pop("run")
            contract.pop("attemptApi", None)
            part = {**part, "data": {"ksquad.io/contract": contract}}
        elif "text" in part:
            part = {**part, "text": part["text"].replace(f"{run['namespace']}/{run['name']}", "<run>")}
        parts.append(part)
    return {**params, "message": {**message, "parts": parts}}


async def test_the_fair_limit_sends_a_ksquad_runs_task_to_the_same_agent_and_gets_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = sent_messages(monkeypatch)
    async with bench_stack(tmp_path, script=SCRIPT) as (dev, _agent):
        scripted = dev.scripted
        assert scripted is not None, "the bench stack runs the scripted model"
        await dev.runs.apply(run_docs("same", 1))
        run_id = f"{NAMESPACE}/same-00000"
        await dev.client.get_workflow_handle(run_id).result()
        template, run_answer = await contract_of_a_run(dev.client, run_id)
        assert run_answer == "the first answer"
        assert template.contract.agent.name == AGENT and template.contract.model.name == MODEL
        assert template.endpoint == template.contract.agent.endpoint, "the Agent's shared endpoint"
        (run_call,) = scripted.calls
        run_sent = [
            (url, method, params) for url, method, params in sent if url.startswith(template.endpoint)
        ]
        sent.clear()

        async with fair_limit_worker(dev) as client:
            fair_answer = await client.execute_workflow(
                FairLimitWorkflow.run,
                fair_task_for(template, "fair-0"),
                id="fair-0",
                task_queue=FAIR_TASK_QUEUE,
            )
            shape = await shape_of(client.get_workflow_handle("fair-0"))

        fair_sent = [
            (url, method, params) for url, method, params in sent if url.startswith(template.endpoint)
        ]
        assert [(url, method) for url, method, _ in fair_sent] == [
            (url, method) for url, method, _ in run_sent
        ]
        (run_message,) = [params for _, method, params in run_sent if method == "SendStreamingMessage"]
        (fair_message,) = [params for _, method, params in fair_sent if method == "SendStreamingMessage"]
        assert the_same_call(fair_message) == the_same_call(run_message)
        assert "attemptApi" in run_message["message"]["parts"][1]["data"]["ksquad.io/contract"], (
            "the comparison left out what ksquad's message carries"
        )
        assert fair_answer == "the second answer", "the fair limit's answer is its own call's, not the Run's"
        assert len(scripted.calls) == 2, "the fair limit's task reached the model once, through the agent"
        assert seen(scripted.calls[1]) == seen(run_call)
        assert shape["activities"] == 1 and shape["local_activities"] == 0
        assert shape["workflow_tasks"] == 2 and shape["actions"] == 2, shape
        ksquad = await shape_of(dev.client.get_workflow_handle(run_id))
        assert ksquad["actions"] > shape["actions"] and ksquad["history_bytes"] > shape["history_bytes"]
