"""Calling the model: an OpenAI-compatible endpoint through the `openai` client, with its own retries off.

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
import openai

from agent.contract import Model
from agent.credentials import CredentialError, CredentialMissing, Credentials

REQUEST_TIMEOUT = 300.0


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


@dataclass
class Turn:
    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

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
        _http = (loop, openai.DefaultAsyncHttpx2Client(timeout=REQUEST_TIMEOUT))
    return _http[1]


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
    client = openai.AsyncOpenAI(  # cheap with a given http_client
        base_url=base_url,
        api_key=key,
        max_retries=0,
        timeout=REQUEST_TIMEOUT,
        _strict_response_validation=True,
        http_client=shared_http(),
    )
    try:
        kwargs: dict[str, Any] = {"model": model.name, "messages": messages, "stream": True}
        if tools:
            kwargs["tools"] = tools
        turn = Turn()
        calls: dict[int, ToolCall] = {}
        async with await client.chat.completions.create(**kwargs) as stream:
            async for chunk in stream:
                for choice in chunk.choices:
                    delta = choice.delta
                    turn.text += delta.content or ""
                    for d in delta.tool_calls or []:
                        call = calls.setdefault(d.index, ToolCall("", "", ""))
                        if d.id:
                            call.id = d.id
                        if d.function and d.function.name:
                            call.name = d.function.name
                        if d.function and d.function.arguments:
                            call.arguments += d.function.arguments
        turn.tool_calls = [calls[i] for i in sorted(calls)]
        if not turn.text.strip() and not turn.tool_calls:
            # A body the SSE parser could not read ends the stream quietly: never take silence for an answer.
            raise ModelFailed(f"{model.name}: malformed response: no content and no tool calls")
        return turn
    except openai.RateLimitError as err:
        headers = err.response.headers
        raise RateLimited(
            model.name,
            headers.get("retry-after"),
            headers.get("retry-after-ms"),
            headers.get("date"),
            reset_headers(headers),
        ) from None
    except openai.AuthenticationError as err:
        raise Unauthorized(f"{model.name}: {err.message}") from None
    except openai.APIStatusError as err:
        raise ModelFailed(f"{model.name}: HTTP {err.status_code}: {err.message}") from None
    except openai.APIConnectionError as err:
        raise ModelFailed(f"{model.name}: cannot reach {model.url or 'the model endpoint'}: {err}") from None
    except (openai.APIError, json.JSONDecodeError, ValueError) as err:
        raise ModelFailed(f"{model.name}: malformed response: {err}") from None
