"""One trace per Run attempt, read back from Jaeger (testbed/jaeger.py): ksquad as the chart deploys it (the bridge
and the worker as their own processes on the real control plane, Temporal's dev server), the reference agent as an
A2A endpoint of its own, the scripted model and a real MCP server over HTTP, every process exporting OTLP as the
chart's `tracing` values make it. The Run's first attempt calls the tool and then finds the model failing; its retry
answers. The test reads both traces and asserts the span tree, the attributes, the link between the attempts, and
that none of the Run's text (the task, the tool's arguments, the answer) is in any span."""

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tracing
from testbed.agents import AgentFactory, ModelEndpoint, ToolServer
from testbed.jaeger import Jaeger, lineage, only, running_jaeger, service, tags, wait_trace
from tests.crd_bridge.conftest import RUN_API, StackFactory
from tests.crd_bridge.test_bridge_resilience import remote_agent

TASK_CANARY = "canary-task-5d1e0c"
TOOL_CANARY = "canary-tool-argument-91b2"
ANSWER_CANARY = "canary-answer-44af7e"


@pytest.fixture
async def jaeger(tmp_path: Path) -> AsyncIterator[Jaeger]:
    async with running_jaeger(tmp_path / "jaeger") as running:
        yield running


async def test_a_retried_run_is_one_trace_per_attempt_from_the_bridge_to_the_model_and_the_tool(
    start_stack: StackFactory,
    model: ModelEndpoint,
    tool_server: ToolServer,
    start_agent: AgentFactory,
    jaeger: Jaeger,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in jaeger.otel_env().items():
        monkeypatch.setenv(name, value)  # the bridge, the worker and the agent inherit them
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    model.script(
        "dev-model",
        {"tool_calls": [{"name": "notes", "arguments": {"text": TOOL_CANARY}}]},
        {"error": 500},  # attempt 1 fails after its tool call
        {"text": f"Done. {ANSWER_CANARY}"},
    )
    stack = await start_stack()
    await remote_agent(
        stack,
        model,
        start_agent,
        {"tools": ["notes"], "allowedTools": ["notes"]},
    )
    stack.apply(
        {
            "apiVersion": RUN_API,
            "kind": "MCPServer",
            "metadata": {"name": "tools"},
            "spec": {"url": tool_server.url},
        },
        {
            "apiVersion": RUN_API,
            "kind": "Tool",
            "metadata": {"name": "notes"},
            "spec": {"mcpServerRef": "tools", "toolName": "add_note"},
        },
        {
            "apiVersion": RUN_API,
            "kind": "Run",
            "metadata": {"name": "traced"},
            "spec": {
                "agents": ["remote"],
                "inputs": {"task": f"Fix the flaky test. {TASK_CANARY}"},
                "retryPolicy": {"backoffSeconds": 1, "maxBackoffSeconds": 1},
            },
        },
    )
    run = await stack.wait_phase("traced", {"Succeeded", "Failed"}, within=120)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert run["status"]["attempt"] == 2, run["status"]
    assert [c["text"] for c in tool_server.calls] == [TOOL_CANARY]
    uid = run["metadata"]["uid"]
    triggered_by = run["metadata"]["annotations"]["ksquad.io/triggered-by"]

    first_id, retry_id = f"{tracing.trace_id(uid, 1):032x}", f"{tracing.trace_id(uid, 2):032x}"
    retry = await wait_trace(jaeger, retry_id, "chat dev-model", "invoke_agent remote")
    first = await wait_trace(
        jaeger,
        first_id,
        "execute_tool notes",
        "invoke_agent remote",
        "RunWorkflow:RunWorkflow",
        "reconcile Run: start",
    )

    # The first attempt: one tree from the bridge's reconcile to the model and the tool.
    tool = only(first, "execute_tool notes")
    path = lineage(first, tool)
    expected = [
        "ksquad-agent: execute_tool notes",
        "ksquad-agent: task remote",
        "ksquad-agent: POST /",
        "ksquad-worker: invoke_agent remote",
        "ksquad-worker: RunActivity:invoke_agent",
        "ksquad-worker: StartActivity:invoke_agent",
        "ksquad-bridge: StartWorkflow:RunWorkflow",
        "ksquad-bridge: start Run workflow",
        "ksquad-bridge: reconcile Run: start",
    ]
    assert path == expected, path
    chat = [s for s in first["spans"] if s["operationName"] == "chat dev-model"]
    assert len(chat) == 2, "attempt 1 asked the model twice: the tool call, then the failure"
    assert all(lineage(first, s)[1:] == expected[1:] for s in chat)
    workflow_spans = {s["operationName"] for s in first["spans"] if service(first, s) == "ksquad-worker"}
    assert "RunWorkflow:RunWorkflow" in workflow_spans, workflow_spans

    # Who, which agent, which credential: on the Run's spans; the model's figures on its call.
    call = tags(only(first, "invoke_agent remote"))
    assert call["ksquad.run.namespace"] == stack.namespace
    assert call["ksquad.run.name"] == "traced"
    assert call["ksquad.run.uid"] == uid
    assert call["ksquad.run.triggered_by"] == triggered_by
    assert call["ksquad.run.attempt"] == 1
    assert call["gen_ai.agent.name"] == "remote"
    assert call["ksquad.credential.name"] == "model-key"
    assert tags(only(first, "reconcile Run: start"))["ksquad.run.triggered_by"] == triggered_by
    asked = next(tags(s) for s in chat if "error.type" not in tags(s))
    assert asked["gen_ai.operation.name"] == "chat"
    assert asked["gen_ai.request.model"] == "dev-model"
    assert asked["gen_ai.usage.input_tokens"] > 0 and asked["gen_ai.usage.output_tokens"] > 0
    assert asked["gen_ai.response.finish_reasons"] in (["tool_calls"], '["tool_calls"]'), asked
    failed = [tags(s) for s in chat if tags(s).get("error.type")]
    assert [f["error.type"] for f in failed] == ["ModelFailed"], [tags(s) for s in chat]
    assert tags(tool)["gen_ai.tool.name"] == "notes"
    assert any(f"-{first_id}-" in header for header in tool_server.traceparents), (
        "the MCP server's requests carried the attempt's trace context"
    )

    # The retry: a trace of its own, rooted at its agent call, linked to the workflow and to attempt 1.
    root = [s for s in retry["spans"] if not any(r["refType"] == "CHILD_OF" for r in s.get("references", []))]
    assert [s["operationName"] for s in root] == ["invoke_agent remote"], [s["operationName"] for s in root]
    assert tags(root[0])["ksquad.run.attempt"] == 2
    links = {(r["traceID"], r["spanID"]) for r in root[0]["references"] if r["refType"] == "FOLLOWS_FROM"}
    attempt_1 = only(first, "invoke_agent remote")["spanID"]
    assert attempt_1 == f"{tracing.attempt_span_id(uid, 1):016x}"
    attempt_1_caller = next(r["spanID"] for r in only(first, "invoke_agent remote")["references"])
    callers = {s["spanID"] for s in first["spans"] if s["operationName"] == "RunActivity:invoke_agent"}
    assert len(callers) == 2 and attempt_1_caller in callers, "each attempt's activity is in the Run's trace"
    (attempt_2_caller,) = callers - {attempt_1_caller}
    assert links == {(first_id, attempt_1), (first_id, attempt_2_caller)}, root[0]["references"]
    answered = only(retry, "chat dev-model")
    assert lineage(retry, answered) == [
        "ksquad-agent: chat dev-model",
        "ksquad-agent: task remote",
        "ksquad-agent: POST /",
        "ksquad-worker: invoke_agent remote",
    ]

    # No text of the Run in any span, tag, log or process of either trace.
    everything = repr(first) + repr(retry)
    for canary in (TASK_CANARY, TOOL_CANARY, ANSWER_CANARY):
        assert canary not in everything, f"{canary} is in a span"
