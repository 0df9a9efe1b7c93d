"""OpenTelemetry traces of every ksquad process, off until an OTLP endpoint is configured.

Switched on by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`),
with `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*` as the SDK reads them;
`OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep it off. ksquad exports OTLP over HTTP (protobuf):
a collector's port 4318. Without an endpoint nothing is imported beyond the API and every span is a no-op.

One trace per Run attempt. The Run's first trace starts where the bridge (or the embedded stack) starts its
workflow, under a trace id derived from the Run's uid: the bridge's reconcile, Temporal's spans of the workflow
and its activities (temporalio's TracingInterceptor, context in the workflow's and activities' headers), the
attempt's agent call (`invoke_agent`), the agent over A2A (W3C `traceparent` in the HTTP headers, which A2A does
not define yet), its model and tool calls and its calls of ksquad-api. A retry's attempt starts a trace of its own,
again derived from the uid and the attempt number, linked to the span of the workflow that called it and to the
attempt before; so the trace of any attempt is found from the Run alone (`trace_id`), as the console links it.

The person who started the Run, the agent and the credential (by its Secret's name, never its value) are
attributes of the Run's spans; prompt and answer text is recorded only when `KSQUAD_TRACE_CONTENT=true`.
Model and tool spans follow the GenAI semantic conventions of SCHEMA_URL (at Development status in their own
repository: the names may change, and the version they follow is pinned here).
"""

import atexit
import contextlib
import contextvars
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags

log = logging.getLogger(__name__)

SCHEMA_URL = (
    "https://opentelemetry.io/schemas/1.44.0"  # the semantic conventions' version ksquad's spans follow
)
CONTENT_ENV = "KSQUAD_TRACE_CONTENT"  # "true": prompts, answers, tool arguments and results in spans
TRACE_URL_ENV = "KSQUAD_TRACE_URL"  # a trace UI's page of one trace, "{trace_id}" in it (the console's links)

# What a local sandbox's agent inherits to export its spans: where to and how. Never the exporter's headers (a
# collector's credential, readable by the sandbox's code) nor the service name (the agent's is ksquad-agent).
EXPORT_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_TRACES_EXPORTER",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_SDK_DISABLED",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_INSTRUMENTATION_A2A_SDK_ENABLED",
    CONTENT_ENV,
)

_enabled = False
_pinned_trace: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "ksquad_pinned_trace", default=None
)
_pinned_span: contextvars.ContextVar[int | None] = contextvars.ContextVar("ksquad_pinned_span", default=None)


class TracingMisconfigured(ValueError):
    """Tracing was asked for in a way this process cannot export."""


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (an OTLP endpoint, and nothing that turns them off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _check_exporter(env: Mapping[str, str]) -> None:
    exporter = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter != "otlp":
        raise TracingMisconfigured(f"OTEL_TRACES_EXPORTER={exporter}: ksquad exports traces with otlp only")
    for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = env.get(name, "").strip()
        if protocol and protocol != "http/protobuf":
            raise TracingMisconfigured(
                f"{name}={protocol}: ksquad exports OTLP over HTTP only; set it to http/protobuf and the endpoint "
                "to the collector's HTTP port (4318)"
            )
        if protocol:
            break


def configure(service: str, env: Mapping[str, str] = os.environ) -> bool:
    """Install the SDK's tracer provider for this process when the environment asks for traces (`service`: its
    service.name unless OTEL_SERVICE_NAME says otherwise). True when tracing is on. Raises TracingMisconfigured
    for an exporter or protocol ksquad does not ship, naming the variable."""
    global _enabled
    if _enabled:
        return True
    if not wanted(env):
        return False
    _check_exporter(env)
    # Imported only here: a sandbox without tracing pays for none of it before its first model call.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class PinnableIds(RandomIdGenerator):
        """Random ids, except where a Run's trace or an attempt's span is derived (`_started`)."""

        def generate_trace_id(self) -> int:
            pinned = _pinned_trace.get()
            return pinned if pinned is not None else super().generate_trace_id()

        def generate_span_id(self) -> int:
            pinned = _pinned_span.get()
            return pinned if pinned is not None else super().generate_span_id()

    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes), id_generator=PinnableIds())
    exporter = OTLPSpanExporter()
    content = env.get(CONTENT_ENV, "").strip().lower() == "true"
    provider.add_span_processor(BatchSpanProcessor(exporter if content else _without_messages(exporter)))
    trace.set_tracer_provider(provider)
    atexit.register(provider.shutdown)  # what is still batched goes out when the process ends
    _enabled = True
    log.info(
        "tracing on: OTLP to %s",
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env["OTEL_EXPORTER_OTLP_ENDPOINT"],
    )
    return True


# What an exception event holds that may be text a model or an agent wrote (a question, a failure's reason).
EXCEPTION_TEXT = ("exception.message", "exception.stacktrace")


def _without_messages(exporter: Any) -> Any:
    """`exporter`, sending each span without its exceptions' messages: a span's status keeps the error's type
    (Temporal's interceptor writes `Type: message`), an exception event its type alone. An agent's failure or
    question is the message of the activity's error, and it is an answer's text, recorded only with content."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.trace.status import Status

    def scrubbed(span: ReadableSpan) -> ReadableSpan:
        status = span.status
        if status.description:
            status = Status(status.status_code, status.description.split(":", 1)[0])
        events = [
            Event(e.name, {k: v for k, v in e.attributes.items() if k not in EXCEPTION_TEXT}, e.timestamp)
            if e.name == "exception" and e.attributes
            else e
            for e in span.events
        ]
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes=span.attributes,
            events=events,
            links=span.links,
            kind=span.kind,
            status=status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    class WithoutMessages(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return exporter.export([scrubbed(s) for s in spans])  # type: ignore[no-any-return]

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return exporter.force_flush(timeout_millis)  # type: ignore[no-any-return]

    return WithoutMessages()


def configure_or_exit(service: str) -> bool:
    """`configure` for a program's start: a misconfiguration ends it with the message that names the variable."""
    try:
        return configure(service)
    except TracingMisconfigured as err:
        raise SystemExit(f"tracing: {err}") from None


def flush(timeout_seconds: float = 5.0) -> None:
    """Export what is batched now (blocking): before a process ends by a signal, where no atexit handler runs."""
    if _enabled:
        provider = trace.get_tracer_provider()
        force_flush = getattr(provider, "force_flush", None)
        if force_flush is not None:
            force_flush(int(timeout_seconds * 1000))


def annotate(attributes: Mapping[str, Any]) -> None:
    """More attributes on the current span (an activity's, made by Temporal's interceptor)."""
    if _enabled:
        trace.get_current_span().set_attributes(attributes)


def enabled() -> bool:
    return _enabled


def record_content() -> bool:
    """Whether prompts, answers and tool arguments may go into spans (off unless KSQUAD_TRACE_CONTENT=true)."""
    return os.environ.get(CONTENT_ENV, "").strip().lower() == "true"


def tracer() -> trace.Tracer:
    return trace.get_tracer("ksquad", schema_url=SCHEMA_URL)


# --- a Run's traces ---------------------------------------------------------------------------------------------


def _derived(kind: str, uid: str, attempt: int, size: int) -> int:
    digest = hashlib.sha256(f"ksquad {kind}\x00{uid}\x00{attempt}".encode()).digest()
    return int.from_bytes(digest[:size], "big") or 1  # all zeros is no valid id


def trace_id(uid: str, attempt: int = 1) -> int:
    """The trace of a Run's attempt: its first attempt's is the Run's own (where its workflow starts)."""
    return _derived("trace", uid, attempt, 16)


def attempt_span_id(uid: str, attempt: int) -> int:
    """The span of an attempt's first agent call: the next attempt's trace links to it."""
    return _derived("attempt", uid, attempt, 8)


def trace_url(template: str, uid: str, attempt: int = 1) -> str:
    return template.replace("{trace_id}", f"{trace_id(uid, attempt):032x}")


def run_attributes(
    namespace: str,
    name: str,
    uid: str,
    triggered_by: str | None = None,
    attempt: int | None = None,
    agent: str | None = None,
    credential: str | None = None,
) -> dict[str, Any]:
    """The Run's identity on a span: who started it, which agent, which credential (its Secret's name)."""
    attributes: dict[str, Any] = {
        "ksquad.run.namespace": namespace,
        "ksquad.run.name": name,
        "ksquad.run.uid": uid,
    }
    if triggered_by:
        attributes["ksquad.run.triggered_by"] = triggered_by
        attributes["enduser.id"] = triggered_by
    if attempt is not None:
        attributes["ksquad.run.attempt"] = attempt
    if agent:
        attributes["gen_ai.agent.name"] = agent
    if credential:
        attributes["ksquad.credential.name"] = credential
    return attributes


@contextlib.contextmanager
def _started(
    name: str,
    parent: otel_context.Context | None,
    *,
    pin_trace: int | None = None,
    pin_span: int | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    links: list[Link] | None = None,
) -> Iterator[Span]:
    trace_token, span_token = _pinned_trace.set(pin_trace), _pinned_span.set(pin_span)
    try:
        span = tracer().start_span(name, parent, kind=kind, attributes=attributes, links=links)
    finally:
        _pinned_trace.reset(trace_token)
        _pinned_span.reset(span_token)
    with trace.use_span(span, end_on_exit=True):
        yield span


def span(
    name: str, kind: SpanKind = SpanKind.INTERNAL, attributes: Mapping[str, Any] | None = None
) -> contextlib.AbstractContextManager[Span]:
    """A child of the current span. An exception ends it in error with its type (`error.type`), never its message
    (which may quote a prompt or a provider's answer)."""
    return _child(name, kind, attributes)


@contextlib.contextmanager
def _child(name: str, kind: SpanKind, attributes: Mapping[str, Any] | None) -> Iterator[Span]:
    with tracer().start_as_current_span(
        name, kind=kind, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as current:
        try:
            yield current
        except BaseException as err:
            if _enabled:
                current.set_attribute("error.type", type(err).__name__)
                current.set_status(trace.StatusCode.ERROR, type(err).__name__)
            raise


@contextlib.contextmanager
def run_span(name: str, uid: str, attributes: Mapping[str, Any] | None = None) -> Iterator[Span]:
    """A span of the Run's own trace: inside one of it, a child; else a root under the Run's trace id."""
    if not _enabled:
        yield trace.INVALID_SPAN
        return
    current = trace.get_current_span().get_span_context()
    if current.is_valid and current.trace_id == trace_id(uid):
        with _started(name, None, attributes=attributes) as span:
            yield span
        return
    with _started(name, otel_context.Context(), pin_trace=trace_id(uid), attributes=attributes) as span:
        yield span


def _remote(trace: int, span: int) -> SpanContext:
    return SpanContext(trace, span, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


@contextlib.contextmanager
def attempt_span(
    name: str, uid: str, attempt: int, first_call: bool, attributes: Mapping[str, Any] | None = None
) -> Iterator[Span]:
    """The span of an agent call of a Run's attempt (a CLIENT span: the agent's own spans go under it).

    The attempt's first call: in the first attempt, a child of the caller's span (the workflow's activity, in the
    Run's trace); in a retry's, the root of the attempt's own trace, linked to the caller and to the attempt before.
    Later calls of the attempt (a fallback model, an answer to a question, an activity retried) are children of
    its first, linked to their caller."""
    if not _enabled:
        yield trace.INVALID_SPAN
        return
    caller = trace.get_current_span().get_span_context()
    links = [Link(caller)] if caller.is_valid else []
    if not first_call:
        parent = trace.set_span_in_context(
            NonRecordingSpan(_remote(trace_id(uid, attempt), attempt_span_id(uid, attempt)))
        )
        with _started(name, parent, kind=SpanKind.CLIENT, attributes=attributes, links=links) as span:
            yield span
        return
    if attempt == 1 and caller.is_valid:
        with _started(
            name, None, pin_span=attempt_span_id(uid, 1), kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            yield span
        return
    if attempt > 1:
        links.append(
            Link(
                _remote(trace_id(uid, attempt - 1), attempt_span_id(uid, attempt - 1)),
                {"ksquad.link": "previous attempt"},
            )
        )
    with _started(
        name,
        otel_context.Context(),
        pin_trace=trace_id(uid, attempt),
        pin_span=attempt_span_id(uid, attempt),
        kind=SpanKind.CLIENT,
        attributes=attributes,
        links=links,
    ) as span:
        yield span


# --- context across processes -------------------------------------------------------------------------------------


def inject(headers: MutableMapping[str, str]) -> None:
    """The current span's W3C `traceparent` (and `tracestate`) into outgoing HTTP headers."""
    if _enabled:
        propagate.inject(headers)


async def inject_into_request(request: Any) -> None:
    """An httpx request hook: every request of the client carries the current trace context."""
    if _enabled:
        propagate.inject(request.headers)


Message = MutableMapping[str, Any]
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class TracedHttp:
    """ASGI middleware: a SERVER span for each HTTP request, in the trace its `traceparent` names. The span is named
    by the method and the matched route's template (never a path with names in it), and carries the status code;
    no query string, header or body is recorded."""

    def __init__(self, app: "Asgi") -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _enabled:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        method = scope.get("method", "GET")
        # No path: it names Runs and namespaces (the span's name and http.route are the route's template).
        attributes = {"http.request.method": method}
        with _started(
            method, propagate.extract(headers), kind=SpanKind.SERVER, attributes=attributes
        ) as span:

            async def send_status(message: Message) -> None:
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                    span.set_attribute("http.response.status_code", status)
                    if status >= 500:
                        span.set_status(trace.StatusCode.ERROR)
                await send(message)

            try:
                await self.app(scope, receive, send_status)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
