"""A scripted OpenAI-compatible model server, for demos and tests (a stand-in for a paid model provider).

    ksquad-model-server --script script.yaml --port 8400

It serves `/v1/chat/completions` (streaming and not) and `/v1/models`. Each model name answers from its
own list of steps, one step per request, in order; the last step repeats. A step is one of:

    - text: "The flaky test is fixed."         # an assistant answer (streamed in chunks when asked to)
    - tool_calls: [{name: add_note, arguments: {text: "hi"}}]
    - error: 429                               # with retry_after: "120" | retry_after_ms: "1500" |
      retry_after: "120"                       #      retry_after_date_in: 120 (an HTTP-date 120 s ahead)
    - error: 401                               # or 500, or any status
    - malformed: true                          # 200 with a body that is not JSON
    - raw: "data: {...}\\n\\n"                  # 200 with exactly this body, as content_type (default
      content_type: text/event-stream          #  text/event-stream): a provider's odd or broken shapes
    - delay: 2.5                               # (with any step) wait this long first
    - hold: true                               # (with any step) wait while the server's `held` is set (a test
                                               #  holds calls in flight until it lets them all go at once)
    - expect_key: sk-new                       # (with any step) answer 401 until called with this key

Every answer reports its usage as OpenAI does (`usage` in a completion; a last chunk with `usage` when the request
asks `stream_options: {include_usage: true}`): prompt tokens are the words of the request's messages, completion
tokens the words of the answer (and its tool calls' arguments), at least one; each Call records what it reported.

Models without a script answer with DEFAULT_TEXT. `POST /_script` replaces the script (the same shape as
the file, as JSON), `GET /_calls` lists the requests received (model, credential, stream), `POST /_reset`
clears both. Nothing here is secret: credentials are recorded by a short fingerprint only.
"""

import argparse
import asyncio
import gc
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEFAULT_TEXT = "Done: the task is complete."


@dataclass
class Call:
    model: str
    credential: str  # a fingerprint of the bearer token, never the token
    stream: bool
    messages: int
    tools: list[str]
    at: float
    task: str = ""  # the first user message (the Run's task), so tests can tell whose call it was
    tool_results: list[str] = field(default_factory=list)  # what the tools the model called answered
    context: list[str] = field(
        default_factory=list
    )  # the user messages after the task (a work item's record)
    input_tokens: int = 0  # the usage this call's answer reported (none for an error)
    output_tokens: int = 0


@dataclass
class ScriptedModel:
    script: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    positions: dict[str, int] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    in_flight: int = 0
    held: bool = False  # steps with `hold` wait while this is set
    abandoned: int = 0  # requests whose client hung up while the model was still "thinking"

    def load(self, data: dict[str, Any]) -> None:
        models = data.get("models", data)
        for name, steps in models.items():
            if not isinstance(steps, list) or not all(isinstance(s, dict) for s in steps):
                raise ValueError(f"models.{name}: a list of steps is expected")
        self.script = {name: list(steps) for name, steps in models.items()}
        self.positions = {}

    def next_step(self, model: str) -> dict[str, Any]:
        steps = self.script.get(model) or self.script.get("default") or [{"text": DEFAULT_TEXT}]
        key = model if model in self.script else "default"
        position = self.positions.get(key, 0)
        self.positions[key] = position + 1
        return steps[min(position, len(steps) - 1)]


def text_of(content: Any) -> str | None:
    """A message's text: a string, or OpenAI's list of parts (`[{"type": "text", "text": ...}]`, as LiteLLM sends)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return None


def user_texts(messages: Any) -> list[str]:
    found = (
        text_of(m.get("content"))
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict) and m.get("role") == "user"
    )
    return [text[:4000] for text in found if text is not None]


def first_user_text(messages: Any) -> str:
    texts = user_texts(messages)
    return texts[0][:200] if texts else ""


def tool_results(messages: Any) -> list[str]:
    return [
        str(m.get("content"))[:500]
        for m in (messages if isinstance(messages, list) else [])
        if isinstance(m, dict) and m.get("role") == "tool"
    ]


def fingerprint(authorization: str | None) -> str:
    token = (authorization or "").removeprefix("Bearer ").strip()
    return hashlib.sha256(token.encode()).hexdigest()[:12] if token else "-"


def build_app(state: ScriptedModel) -> Starlette:
    async def completions(request: Request) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return JSONResponse(
                {"error": {"message": "request body is not JSON", "type": "invalid_request_error"}},
                status_code=400,
            )
        model = str(body.get("model", ""))
        stream = bool(body.get("stream"))
        call = Call(
            model,
            fingerprint(request.headers.get("authorization")),
            stream,
            len(body.get("messages") or []),
            [t.get("function", {}).get("name", "") for t in body.get("tools") or []],
            time.time(),
            first_user_text(body.get("messages")),
            tool_results(body.get("messages")),
            user_texts(body.get("messages"))[1:],
        )
        state.calls.append(call)
        step = state.next_step(model)
        expected = step.get("expect_key")
        if expected is not None and request.headers.get("authorization") != f"Bearer {expected}":
            state.positions[model if model in state.script else "default"] -= 1  # this step still waits
            step = {"error": 401, "message": "Incorrect API key provided"}
        state.in_flight += 1
        try:
            if step.get("delay") and await hung_up_within(request, float(step["delay"])):
                state.abandoned += 1
                return Response(status_code=499)  # nobody is listening any more
            while step.get("hold") and state.held:
                if await hung_up_within(request, 0.05):
                    state.abandoned += 1
                    return Response(status_code=499)
            usage = stream_usage = None
            if "error" not in step and not step.get("malformed") and "raw" not in step:
                usage = count_usage(body.get("messages"), step)
                call.input_tokens, call.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
                options = body.get("stream_options")
                stream_usage = usage if isinstance(options, dict) and options.get("include_usage") else None
            return answer(step, model, stream, usage, stream_usage)
        finally:
            state.in_flight -= 1

    async def models(_: Request) -> Response:
        names = sorted(n for n in state.script if n != "default")
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": n, "object": "model", "created": 0, "owned_by": "ksquad-scripted"} for n in names
                ],
            }
        )

    async def set_script(request: Request) -> Response:
        try:
            state.load(await request.json())
        except (json.JSONDecodeError, ValueError, AttributeError) as err:
            return JSONResponse({"error": str(err)}, status_code=400)
        return JSONResponse({"models": sorted(state.script)})

    async def calls(_: Request) -> Response:
        return JSONResponse([c.__dict__ for c in state.calls])

    async def reset(_: Request) -> Response:
        state.calls.clear()
        state.positions.clear()
        return JSONResponse({"ok": True})

    async def health(_: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/_script", set_script, methods=["POST"]),
            Route("/_calls", calls),
            Route("/_reset", reset, methods=["POST"]),
            Route("/healthz", health),
        ]
    )


async def hung_up_within(request: Request, seconds: float) -> bool:
    """Wait `seconds`, watching for the client to disconnect (an abandoned call)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return False


def words(content: Any) -> int:
    text = text_of(content)
    return len(text.split()) if text else 0


def count_usage(messages: Any, step: dict[str, Any]) -> dict[str, int]:
    """The tokens of a call, as this server counts them: words in, words out (at least one)."""
    prompt = (
        sum(words(m.get("content")) for m in messages if isinstance(m, dict))
        if isinstance(messages, list)
        else 0
    )
    out = words(step.get("text")) + sum(
        words(json.dumps(c.get("arguments", {}))) for c in step.get("tool_calls", [])
    )
    completion = max(1, out)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def answer(
    step: dict[str, Any],
    model: str,
    stream: bool,
    usage: dict[str, int] | None = None,
    stream_usage: dict[str, int] | None = None,
) -> Response:
    if "error" in step:
        status = int(step["error"])
        headers = {"date": format_datetime(datetime.now(UTC), usegmt=True)}
        if "retry_after" in step:
            headers["retry-after"] = str(step["retry_after"])
        if "retry_after_ms" in step:
            headers["retry-after-ms"] = str(step["retry_after_ms"])
        for header, value in (step.get("headers") or {}).items():  # x-ratelimit-reset-requests: "6m0s", ...
            headers[header] = str(value)
        if "retry_after_date_in" in step:
            when = datetime.now(UTC) + timedelta(seconds=float(step["retry_after_date_in"]))
            headers["retry-after"] = format_datetime(when, usegmt=True)
        kind = {429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(status, "server_error")
        explanation = step.get("message") or {
            429: "Rate limit reached",
            401: "Incorrect API key provided",
        }.get(status, "The server had an error")
        return JSONResponse(
            {"error": {"message": explanation, "type": kind, "code": kind}},
            status_code=status,
            headers=headers,
        )
    if step.get("malformed"):
        return Response("{this is not json", media_type="application/json")
    if "raw" in step:
        return Response(str(step["raw"]), media_type=step.get("content_type", "text/event-stream"))
    completion_id = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    tool_calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:10]}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))},
        }
        for c in step.get("tool_calls", [])
    ]
    text = step.get("text", "" if tool_calls else DEFAULT_TEXT)
    if stream:
        return StreamingResponse(
            stream_chunks(completion_id, model, text, tool_calls, stream_usage),
            media_type="text/event-stream",
        )
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return JSONResponse(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}
            ],
            "usage": usage,
        }
    )


async def stream_chunks(
    completion_id: str,
    model: str,
    text: str,
    tool_calls: list[dict[str, Any]],
    usage: dict[str, int] | None = None,
) -> AsyncIterator[str]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        return (
            "data: "
            + json.dumps(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )
            + "\n\n"
        )

    yield chunk({"role": "assistant", "content": ""})
    words = text.split(" ") if text else []
    for i, word in enumerate(words):
        yield chunk({"content": word + (" " if i < len(words) - 1 else "")})
        await asyncio.sleep(0)
    for index, call in enumerate(tool_calls):
        yield chunk(
            {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""},
                    }
                ]
            }
        )
        yield chunk(
            {"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]}
        )
    yield chunk({}, "tool_calls" if tool_calls else "stop")
    if usage is not None:  # OpenAI's last chunk when asked: no choices, the usage
        last = {"id": completion_id, "object": "chat.completion.chunk", "created": 0, "model": model}
        yield "data: " + json.dumps({**last, "choices": [], "usage": usage}) + "\n\n"
    yield "data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="ksquad-model-server", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--script", type=Path, help="YAML or JSON: {models: {name: [steps]}}")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8400)
    args = parser.parse_args(argv)
    # What the imports built lives as long as the process: no garbage collection walks it again, nor does the
    # interpreter's exit (the worker's imports and exit: about a fifth less CPU).
    gc.freeze()
    state = ScriptedModel()
    if args.script:
        state.load(yaml.safe_load(args.script.read_text()) or {})
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
