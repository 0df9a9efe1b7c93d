"""Tracing's switches, ids and what it hands on, without a collector (tests/crd_bridge/test_traces.py and
tests/chart/test_traces.py read real traces back from Jaeger)."""

import subprocess
import sys

import pytest

import tracing
from activities.sandboxes import LocalSandboxes, SandboxSettings
from api.console.app import trace_page_template
from testbed.agents import ModelEndpoint, contract

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
