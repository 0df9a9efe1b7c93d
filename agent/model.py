"""Calling the model: an OpenAI-compatible endpoint's chat completions, streamed, over one connection pool.

The wire format is read here rather than through the `openai` client: that client imports 520 modules (a third of
the agent's), paid by every cold sandbox before its first call (over a second of CPU natively, several under
gVisor's ptrace platform). tests/agent/test_scripted_model.py holds the scripted model to the real client.

Retrying is the orchestrator's job (it knows about other runs on the same credential), so a 429 surfaces at
once as RateLimited with the raw Retry-After headers, a 401 as Unauthorized, anything else malformed as
ModelFailed with a reason.
"""

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx2

import tracing
from agent.contract import Model
from agent.credentials import CredentialError, CredentialMissing, Credentials
from agent.spans import model_answered, model_span

REQUEST_TIMEOUT = 300.0
DEFAULT_BASE_URL = (
    "https://api.openai.com/v1"  # as the openai client's, when neither the Run nor the agent names one
)


class ModelError(Exception):
    pass


class RateLimited(ModelError):
    def __init__(
        self,
        model: str,
        retry_after: str | None,
        retry_after_ms: str | None,
        date: str | None,
        resets: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{model}: rate limited (Retry-After {retry_after or retry_after_ms or 'absent'})")
        self.model = model
        self.retry_after = retry_after
        self.retry_after_ms = retry_after_ms
        self.date = date
        self.resets = resets or {}  # the provider's own reset headers, raw: the orchestrator parses them


def reset_headers(headers: Any) -> dict[str, str]:
    """OpenAI's x-ratelimit-reset-requests/-tokens ("6m0s", "12ms") and Anthropic's
    anthropic-ratelimit-*-reset (RFC 3339 times): when the limit ends, when there is no Retry-After."""
    return {
        name.lower(): value
        for name, value in headers.items()
        if name.lower().startswith("x-ratelimit-reset-")
        or (name.lower().startswith("anthropic-ratelimit-") and name.lower().endswith("-reset"))
    }


class Unauthorized(ModelError):
    pass


class ModelFailed(ModelError):
    pass


class CredentialRefused(ModelError):
    """The agent will not send the credential where the contract says (agent.credentials says why)."""


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    """What one call cost, as the endpoint reported it (OpenAI's `usage`)."""

    input_tokens: int
    output_tokens: int


@dataclass
class Turn:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage | None = None  # None: the endpoint reported none
    finish_reason: str | None = None  # why the model stopped ("stop", "tool_calls", "length"), as it said

    def assistant_message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


_http: tuple[asyncio.AbstractEventLoop, httpx2.AsyncClient] | None = None


def shared_http() -> httpx2.AsyncClient:
    """One connection pool for every model call of this process (of its event loop): a client per call paid a
    new TCP connection and a new TLS context each time, a third of a long-lived agent's CPU per short task."""
    global _http
    loop = asyncio.get_running_loop()
    if _http is None or _http[0] is not loop or _http[1].is_closed:
        _http = (loop, httpx2.AsyncClient(timeout=REQUEST_TIMEOUT, follow_redirects=False))
    return _http[1]


class Malformed(ValueError):
    """The endpoint answered 2xx with something that is not a chat completion."""


async def complete(
    model: Model,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    credentials: Credentials | None = None,
) -> Turn:
    """One model turn, streamed; returns the text and the tool calls the model asked for. The key is read afresh
    for every call (a rotated Secret reaches a running agent), and only for a host its owner allows."""
    base_url = model.url or os.environ.get("OPENAI_BASE_URL")
    try:
        key = (credentials or Credentials()).for_url(model.credential, base_url)
    except CredentialMissing as err:
        raise Unauthorized(str(err)) from None
    except CredentialError as err:
        raise CredentialRefused(str(err)) from None
    body: dict[str, Any] = {
        "model": model.name,
        "messages": messages,
        "stream": True,
        "stream_options": {"include_usage": True},  # a last chunk with the call's usage
    }
    if tools:
        body["tools"] = tools
    url = (base_url or DEFAULT_BASE_URL).rstrip("/") + "/chat/completions"
    with model_span(model, url, messages) as span:
        turn = await _call(model, base_url, url, body, key)
        model_answered(span, turn.assistant_message(), turn.finish_reason, turn.usage)
        return turn


async def _call(model: Model, base_url: str | None, url: str, body: dict[str, Any], key: str | None) -> Turn:
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    tracing.inject(headers)  # a provider that traces joins the attempt's trace
    request = shared_http().build_request("POST", url, json=body, headers=headers)
    try:
        response = await shared_http().send(request, stream=True)
        try:
            if response.status_code >= 300:
                await response.aread()
                raise status_error(model.name, response)
            turn = await read_turn(response)
        finally:
            await response.aclose()
    except httpx2.TransportError as err:
        raise ModelFailed(f"{model.name}: cannot reach {base_url or DEFAULT_BASE_URL}: {err!r}") from None
    except Malformed as err:
        raise ModelFailed(f"{model.name}: malformed response: {err}") from None
    if not turn.text.strip() and not turn.tool_calls:
        # A stream of empty deltas is not an answer: never take silence for one.
        raise ModelFailed(f"{model.name}: malformed response: no content and no tool calls")
    return turn


def status_error(model: str, response: httpx2.Response) -> ModelError:
    """A non-2xx answer as the agent's outcome: 429 and 401 with what the orchestrator needs, the rest failed."""
    if response.status_code == 429:
        headers = response.headers
        return RateLimited(
            model,
            headers.get("retry-after"),
            headers.get("retry-after-ms"),
            headers.get("date"),
            reset_headers(headers),
        )
    explanation = error_message(response)
    if response.status_code == 401:
        return Unauthorized(f"{model}: {explanation}")
    return ModelFailed(f"{model}: HTTP {response.status_code}: {explanation}")


def error_message(response: httpx2.Response) -> str:
    """The provider's own words ({"error": {"message": ...}} in OpenAI's shape), else the body's start."""
    try:
        error = response.json().get("error")
        message = error.get("message") if isinstance(error, dict) else error
        if isinstance(message, str) and message:
            return message
    except (ValueError, AttributeError):
        pass
    return response.text[:300] or response.reason_phrase


async def read_turn(response: httpx2.Response) -> Turn:
    """The streamed chunks (server-sent events, `data: {...}` up to `data: [DONE]`) into one turn. An endpoint
    that ignores `stream` and answers one JSON completion is read as that."""
    turn = Turn()
    calls: dict[int, ToolCall] = {}
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        completion = parse_json(await response.aread())
        choice = first_choice(completion)
        add_delta(turn, calls, field_of(choice, "message", dict))
        turn.finish_reason = finish_reason_of(choice) or turn.finish_reason
        turn.usage = usage_of(completion)
    else:
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # comments, event names, ids and the blank lines between events
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = parse_json(data.encode())
            if "error" in chunk:
                raise Malformed(f"error in stream: {chunk['error']}")
            turn.usage = usage_of(chunk) or turn.usage
            for choice in field_of(chunk, "choices", list):
                if not isinstance(choice, dict):
                    raise Malformed(f"choice is not an object: {choice!r}")
                add_delta(turn, calls, field_of(choice, "delta", dict))
                turn.finish_reason = finish_reason_of(choice) or turn.finish_reason
    turn.tool_calls = [calls[i] for i in sorted(calls)]
    return turn


def finish_reason_of(choice: dict[str, Any]) -> str | None:
    reason = choice.get("finish_reason")
    return reason[:64] if isinstance(reason, str) and reason else None


def usage_of(body: dict[str, Any]) -> Usage | None:
    """A completion's or a chunk's `usage`; None when it has none or not in OpenAI's shape (usage is an account
    of the answer, never a reason to refuse it)."""
    usage = body.get("usage")
    if not isinstance(usage, dict):
        return None
    tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 40 for t in tokens):
        return None
    return Usage(int(tokens[0] or 0), int(tokens[1] or 0))


def add_delta(turn: Turn, calls: dict[int, ToolCall], delta: dict[str, Any]) -> None:
    """One delta (or a whole message) into the turn: its text, and its tool calls' pieces by index."""
    content = delta.get("content")
    if content is not None and not isinstance(content, str):
        raise Malformed(f"content is not a string: {content!r}")
    turn.text += content or ""
    for position, piece in enumerate(delta.get("tool_calls") or []):
        if not isinstance(piece, dict):
            raise Malformed(f"tool call is not an object: {piece!r}")
        index = piece.get("index", position)
        if not isinstance(index, int):
            raise Malformed(f"tool call index is not an integer: {index!r}")
        call = calls.setdefault(index, ToolCall("", "", ""))
        function = piece.get("function") or {}
        if not isinstance(function, dict):
            raise Malformed(f"tool call function is not an object: {function!r}")
        for value in (piece.get("id"), function.get("name"), function.get("arguments")):
            if value is not None and not isinstance(value, str):
                raise Malformed(f"tool call field is not a string: {value!r}")
        call.id = piece.get("id") or call.id
        call.name = function.get("name") or call.name
        call.arguments += function.get("arguments") or ""


def parse_json(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as err:
        raise Malformed(f"not JSON ({err}): {data[:200]!r}") from None
    if not isinstance(value, dict):
        raise Malformed(f"not a JSON object: {data[:200]!r}")
    return value


def first_choice(completion: dict[str, Any]) -> dict[str, Any]:
    choices = field_of(completion, "choices", list)
    if not choices or not isinstance(choices[0], dict):
        raise Malformed(f"no choices: {completion!r:.200}")
    return choices[0]


def field_of(value: dict[str, Any], name: str, kind: type) -> Any:
    found = value.get(name)
    if not isinstance(found, kind):
        raise Malformed(f"{name!r} is not a {kind.__name__}: {value!r:.200}")
    return found
