"""The reference agent's spans (tracing): its task, each model call and each tool call, as the GenAI semantic
conventions of tracing.SCHEMA_URL name them. Prompts, answers, tool arguments and results go in only when
tracing.record_content() (the chart value tracing.recordContent); token counts, models, finish reasons and tool
names always."""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.trace import Span, SpanKind

import tracing
from agent.contract import Contract, Model


@contextmanager
def task_span(contract: Contract, task_id: str) -> Iterator[Span]:
    run = contract.run
    credential = contract.model.credential
    attributes = {
        **tracing.run_attributes(
            run.namespace,
            run.name,
            run.uid,
            attempt=run.attempt,
            agent=contract.agent.name,
            credential=credential.secret_name if credential else None,
        ),
        "gen_ai.conversation.id": f"{run.uid}-a{run.attempt}",
        "a2a.task.id": task_id,
    }
    with tracing.span(f"task {contract.agent.name}", SpanKind.INTERNAL, attributes) as span:
        yield span


@contextmanager
def model_span(model: Model, base_url: str, messages: list[dict[str, Any]]) -> Iterator[Span]:
    where = urlsplit(base_url)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",  # the wire protocol: OpenAI's chat completions, whoever serves it
        "gen_ai.request.model": model.name,
        "server.address": where.hostname or "",
    }
    if where.port:
        attributes["server.port"] = where.port
    if model.credential is not None:
        attributes["ksquad.credential.name"] = model.credential.secret_name
    if tracing.record_content():
        attributes["gen_ai.input.messages"] = json.dumps(messages)
    with tracing.span(f"chat {model.name}", SpanKind.CLIENT, attributes) as span:
        yield span


def model_answered(span: Span, answer: dict[str, Any], finish_reason: str | None, usage: Any) -> None:
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    if finish_reason:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
    if tracing.record_content():
        span.set_attribute("gen_ai.output.messages", json.dumps([answer]))


@contextmanager
def tool_span(name: str, call_id: str, arguments: str) -> Iterator[Span]:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.type": "extension",  # an MCP server's tool (or ksquad's own), run by the agent
    }
    if tracing.record_content():
        attributes["gen_ai.tool.call.arguments"] = arguments
    with tracing.span(f"execute_tool {name}", SpanKind.INTERNAL, attributes) as span:
        yield span


def tool_answered(span: Span, text: str, is_error: bool) -> None:
    if is_error:
        span.set_attribute("error.type", "tool_error")
    if tracing.record_content():
        span.set_attribute("gen_ai.tool.call.result", text)
