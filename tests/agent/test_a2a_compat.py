"""The worker's reading of agents that deviate from A2A 1.0 (activities/agents/a2a_compat.py): a zone-less
timestamp is read as UTC wherever the stream splits it, a zoned one is left alone, a line is read up to its bound
and no further, and a2a-sdk's parse failure is named by its field. (An agent sending a line without end behind
a Run: tests/faults/test_bad_agents.py.)"""

from collections.abc import AsyncIterator

import httpx
import pytest
from google.protobuf.json_format import ParseError

from activities.agents.a2a_compat import MAX_ANSWER_LINE, A2ACompatTransport, AnswerTooLarge, not_a2a


async def test_zone_less_timestamps_are_read_as_utc_however_the_stream_is_cut() -> None:
    events = (
        b'data: {"status": {"state": "TASK_STATE_WORKING", "timestamp": "2026-12-06T04:19:02.226730"}}\n\n'
        b'data: {"status": {"timestamp": "2026-12-06T04:19:03+00:00"}, "text": "\\"timestamp\\": kept"}\n\n'
    )

    def answer(request: httpx.Request) -> httpx.Response:
        cuts = [events[i : i + 7] for i in range(0, len(events), 7)]  # a cut inside every field
        return httpx.Response(200, stream=_Chunks(cuts))

    transport = A2ACompatTransport(httpx.MockTransport(answer))
    async with httpx.AsyncClient(transport=transport) as http:
        body = (await http.get("http://agent.test/")).content
    assert b'"timestamp": "2026-12-06T04:19:02.226730Z"' in body
    assert b'"timestamp": "2026-12-06T04:19:03+00:00"' in body, "a zoned one is left as it is"
    assert body.count(b"\n") == events.count(b"\n")


async def test_a_line_past_its_bound_is_read_no_further_and_lines_within_it_are_read_whole() -> None:
    piece = 1 << 16
    sent = 0

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            nonlocal sent
            yield b'data: {"text": "'
            while True:
                sent += piece
                yield b"x" * piece

    endless = A2ACompatTransport(httpx.MockTransport(lambda _: httpx.Response(200, stream=Endless())))
    async with httpx.AsyncClient(transport=endless) as http:
        with pytest.raises(AnswerTooLarge, match="longer than 32 MiB"):
            await http.get("http://agent.test/")
    assert MAX_ANSWER_LINE - piece <= sent <= MAX_ANSWER_LINE + piece, sent

    # Lines each within the bound, together far past it (a long stream of events), are all read.
    line = b"data: " + b"y" * (MAX_ANSWER_LINE // 4) + b"\n"
    many = [line] * 8
    cuts = [chunk[i : i + piece] for chunk in many for i in range(0, len(chunk), piece)]
    within = A2ACompatTransport(httpx.MockTransport(lambda _: httpx.Response(200, stream=_Chunks(cuts))))
    async with httpx.AsyncClient(transport=within) as http:
        body = (await http.get("http://agent.test/")).content
    assert body == b"".join(many)


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


def test_a_parse_failure_inside_the_sdks_error_is_named() -> None:
    parse = ParseError("Failed to parse state field: unknown enum at StreamResponse.task.status.state")
    sdk = RuntimeError("This operation is not supported")
    sdk.__cause__ = parse
    assert not_a2a(sdk) == "Failed to parse state field: unknown enum at StreamResponse.task.status.state"
    assert not_a2a(RuntimeError("no cause")) is None
