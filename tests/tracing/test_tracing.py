"""Tracing's switches, ids and what it hands on, without a collector (tests/crd_bridge/test_traces.py and
tests/chart/test_traces.py read real traces back from Jaeger)."""

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

import tracing
from activities.sandboxes import LocalSandboxes, SandboxSettings
from api.console.routes.run import trace_page_template
from testbed.agents import ModelEndpoint, contract
from testbed.asgi import serving

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}


def test_tracing_is_off_until_an_endpoint_is_set_and_stays_off_when_told() -> None:
    assert not tracing.wanted({})
    assert tracing.wanted(ENDPOINT)
    assert tracing.wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing.wanted({**ENDPOINT, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.wanted({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"})


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        (
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: ksquad exports OTLP over HTTP only",
        ),
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json"),
        (
            "OTEL_TRACES_EXPORTER",
            "zipkin",
            "OTEL_TRACES_EXPORTER=zipkin: ksquad exports traces with otlp only",
        ),
    ],
)
def test_a_program_asked_to_export_what_it_cannot_stops_and_names_the_variable(
    variable: str, value: str, says: str
) -> None:
    env = {**ENDPOINT, variable: value, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "worker.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert f"tracing: {says}" in done.stderr, done.stderr[-2000:]


def test_each_attempt_has_a_trace_of_its_own_found_from_the_run_alone() -> None:
    ids = {tracing.trace_id(uid, attempt) for uid in ("uid-a", "uid-b") for attempt in (1, 2, 3)}
    assert len(ids) == 6 and all(0 < i < 1 << 128 for i in ids)
    assert tracing.trace_id("uid-a") == tracing.trace_id("uid-a", 1), "the Run's trace is its first attempt's"
    assert tracing.attempt_span_id("uid-a", 1) != tracing.attempt_span_id("uid-a", 2)
    url = tracing.trace_url("https://jaeger.example/trace/{trace_id}", "uid-a", 2)
    assert url == f"https://jaeger.example/trace/{tracing.trace_id('uid-a', 2):032x}"


def test_the_run_attributes_name_the_credential_never_its_value() -> None:
    attributes = tracing.run_attributes("payments", "fix", "u1", "alice", 2, "dev-1", "model-key")
    assert attributes == {
        "ksquad.run.namespace": "payments",
        "ksquad.run.name": "fix",
        "ksquad.run.uid": "u1",
        "ksquad.run.triggered_by": "alice",
        "enduser.id": "alice",
        "ksquad.run.attempt": 2,
        "gen_ai.agent.name": "dev-1",
        "ksquad.credential.name": "model-key",
    }


@pytest.mark.parametrize(
    "template",
    ["javascript:alert(1)//{trace_id}", "https://jaeger.example/search", "//jaeger.example/trace/{trace_id}"],
)
def test_the_console_links_traces_only_to_an_http_page_naming_the_trace(
    template: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(tracing.TRACE_URL_ENV, template)
    assert trace_page_template() is None
    monkeypatch.setenv(tracing.TRACE_URL_ENV, "https://jaeger.example/trace/{trace_id}")
    assert trace_page_template() == "https://jaeger.example/trace/{trace_id}"


def test_a_local_sandbox_gets_where_to_send_its_spans_but_never_the_exporters_headers(
    model: ModelEndpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer collector-secret")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "ksquad-worker")
    monkeypatch.setenv(tracing.CONTENT_ENV, "true")
    env = LocalSandboxes(SandboxSettings(backend="local")).environment(contract(model))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert env[tracing.CONTENT_ENV] == "true"
    assert "OTEL_EXPORTER_OTLP_HEADERS" not in env
    assert "collector-secret" not in repr(env)
    assert "OTEL_SERVICE_NAME" not in env, "the agent names itself ksquad-agent"


# A model call's span as the reference agent makes it, exported by the real OTLP exporter of a process of its own.
MODEL_CALL = """
import tracing
from agent.contract import Model
from agent.model import Turn, Usage
from agent.spans import model_answered, model_span

tracing.configure_or_exit("ksquad-agent")
model = Model(name="dev-model", url="http://model.example/v1")
with model_span(model, "http://model.example/v1/chat/completions", [{"role": "user", "content": "PROMPT-CANARY"}]) as s:
    turn = Turn(text="ANSWER-CANARY", usage=Usage(12, 3), finish_reason="stop")
    model_answered(s, turn.assistant_message(), turn.finish_reason, turn.usage)
tracing.flush()
"""


async def exported_model_span(record_content: bool) -> dict[str, object]:
    """The attributes of the one span the script above exports, as a collector receives them."""
    (span,) = await exported_spans(MODEL_CALL, record_content)
    assert span.name == "chat dev-model"
    return {a.key: MessageToDict(a.value) for a in span.attributes}


async def exported_spans(script: str, record_content: bool) -> list[Span]:
    """The spans `script` exports through tracing's exporter in a process of its own, as a collector gets them."""
    received: list[bytes] = []

    async def collector(scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        received.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serving(collector, lifespan="off") as url:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": url,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
        env[tracing.CONTENT_ENV] = "true" if record_content else "false"
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", script, env=env)
        assert await asyncio.wait_for(process.wait(), 60) == 0
    request = ExportTraceServiceRequest.FromString(b"".join(received))
    return [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]


async def test_a_model_calls_span_carries_its_figures_and_its_text_only_when_the_operator_says() -> None:
    plain = await exported_model_span(record_content=False)
    assert plain["gen_ai.request.model"] == {"stringValue": "dev-model"}
    assert plain["gen_ai.usage.input_tokens"] == {"intValue": "12"}
    assert plain["gen_ai.usage.output_tokens"] == {"intValue": "3"}
    assert "CANARY" not in repr(plain)
    recorded = await exported_model_span(record_content=True)
    assert "PROMPT-CANARY" in repr(recorded["gen_ai.input.messages"])
    assert "ANSWER-CANARY" in repr(recorded["gen_ai.output.messages"])


# An activity that failed with an agent's words, as Temporal's tracing interceptor records it: the span's status
# `Type: message`, and an exception event with the message and the stack trace.
FAILED_ACTIVITY = """
import tracing
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from temporalio.exceptions import ApplicationError

tracing.configure_or_exit("ksquad-worker")
tracer = trace.get_tracer("temporalio")
try:
    raise ApplicationError("the agent asks: QUESTION-CANARY?", type="InputRequired")
except ApplicationError as err:
    with tracer.start_as_current_span("RunActivity:invoke_agent", record_exception=False) as span:
        span.set_status(Status(StatusCode.ERROR, f"{type(err).__name__}: {err}"))
        span.record_exception(err)
tracing.flush()
"""


async def test_an_exceptions_message_leaves_in_no_span_unless_the_operator_records_content() -> None:
    (span,) = await exported_spans(FAILED_ACTIVITY, record_content=False)
    assert span.status.message == "ApplicationError", "the error's type stays"
    (event,) = span.events
    assert event.name == "exception"
    kept = {a.key: MessageToDict(a.value) for a in event.attributes}
    assert kept["exception.type"]["stringValue"].endswith("ApplicationError"), kept
    assert set(kept) <= {"exception.type", "exception.escaped"}, kept
    assert "CANARY" not in repr(span)
    (recorded,) = await exported_spans(FAILED_ACTIVITY, record_content=True)
    assert "QUESTION-CANARY" in recorded.status.message
    assert "QUESTION-CANARY" in repr(recorded.events)
