"""The reference agent's model client (agent.model) against the scripted model over HTTP: the shapes a provider
may answer in, each read or refused with a reason (never taken for an answer), and the agent image's imports."""

import json
import socket
import subprocess
import sys
from typing import Any

import pytest

from agent.contract import Model
from agent.model import ModelFailed, Usage, complete
from testbed.agents import ModelEndpoint

MESSAGES = [{"role": "user", "content": "fix it"}]


def events(*chunks: dict[str, Any], done: bool = True) -> str:
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    return body + ("data: [DONE]\n\n" if done else "")


def delta(**fields: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": fields, "finish_reason": None}]}


async def test_streamed_text_and_tool_calls_in_pieces_make_one_turn(model: ModelEndpoint) -> None:
    model.script(
        "m",
        {
            "raw": ": a comment line, then an event name\nevent: message\n\n"
            + events(
                delta(role="assistant", content="Looking"),
                delta(content=" now."),
                delta(tool_calls=[{"index": 1, "id": "c2", "function": {"name": "b", "arguments": ""}}]),
                delta(tool_calls=[{"index": 0, "id": "c1", "function": {"name": "a", "arguments": '{"x"'}}]),
                delta(tool_calls=[{"index": 0, "function": {"arguments": ": 1}"}}]),
                {"choices": []},  # a usage-only chunk
            )
        },
    )
    turn = await complete(Model(name="m", url=model.url), MESSAGES, [])
    assert turn.text == "Looking now."
    assert [(c.id, c.name, c.arguments) for c in turn.tool_calls] == [
        ("c1", "a", '{"x": 1}'),
        ("c2", "b", ""),
    ]
    assert model.state.calls[0].stream, "the client asks for a stream"


async def test_an_endpoint_that_ignores_stream_is_read_as_one_completion(model: ModelEndpoint) -> None:
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "whole answer"}}]}
    model.script("m", {"raw": json.dumps(completion), "content_type": "application/json"})
    turn = await complete(Model(name="m", url=model.url), MESSAGES, [])
    assert (turn.text, turn.tool_calls) == ("whole answer", [])


async def test_the_usage_the_endpoint_reports_is_read_streamed_or_whole_and_a_garbled_one_ignored(
    model: ModelEndpoint,
) -> None:
    model.script("m", {"text": "three words here"})
    streamed = await complete(Model(name="m", url=model.url), MESSAGES, [])
    served = model.state.calls[-1]
    assert streamed.usage == Usage(served.input_tokens, served.output_tokens) == Usage(2, 3), (
        "asked for with stream_options.include_usage, read from the last chunk"
    )
    whole = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
    }
    model.script("m", {"raw": json.dumps(whole), "content_type": "application/json"})
    assert (await complete(Model(name="m", url=model.url), MESSAGES, [])).usage == Usage(7, 1)
    for garbled in ({"prompt_tokens": "7", "completion_tokens": 1}, {"prompt_tokens": -1}, "lots", None):
        body = {**whole, "usage": garbled}
        model.script("m", {"raw": json.dumps(body), "content_type": "application/json"})
        turn = await complete(Model(name="m", url=model.url), MESSAGES, [])
        assert (turn.text, turn.usage) == ("x", None), garbled


@pytest.mark.parametrize(
    ("step", "words"),
    [
        ({"raw": events({"error": {"message": "overloaded"}})}, "error in stream: {'message': 'overloaded'}"),
        ({"raw": events({"choices": "none"})}, "'choices' is not a list"),
        ({"raw": events({"choices": [{"index": 0}]})}, "'delta' is not a dict"),
        ({"raw": events(delta(content=7))}, "content is not a string: 7"),
        ({"raw": events(delta(tool_calls=[{"index": "0"}]))}, "tool call index is not an integer"),
        ({"raw": "data: {cut off\n\n"}, "not JSON"),
        ({"raw": events(delta(content=""), done=False)}, "no content and no tool calls"),
        ({"raw": "<html>502</html>", "content_type": "text/html"}, "not JSON"),
        ({"raw": json.dumps({"choices": []}), "content_type": "application/json"}, "no choices"),
        ({"error": 503, "message": "try later"}, "HTTP 503: try later"),
    ],
)
async def test_what_is_not_a_completion_fails_with_the_reason(
    model: ModelEndpoint, step: dict[str, Any], words: str
) -> None:
    model.script("m", step)
    with pytest.raises(ModelFailed) as caught:
        await complete(Model(name="m", url=model.url), MESSAGES, [])
    assert str(caught.value).startswith("m: ") and words in str(caught.value), caught.value


async def test_an_endpoint_nobody_listens_on_fails_naming_it() -> None:
    # A port bound and never listened on: refused, and no other process can take it meanwhile (a free port once
    # was, by a server of the tests beside this one, which answered 404).
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}/v1"
        with pytest.raises(ModelFailed) as caught:
            await complete(Model(name="m", url=url), MESSAGES, [])
    assert f"cannot reach {url}" in str(caught.value)


def test_the_agent_starts_without_the_openai_client_or_mcp() -> None:
    """A cold sandbox pays for every module the agent imports before it answers: the MCP client is imported only
    for a run with tools, and the OpenAI client not at all."""
    code = (
        "import sys, agent.server; print(sorted({m.split('.')[0] for m in sys.modules} & {'openai', 'mcp'}))"
    )
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert imported.stdout.strip() == "[]", imported
