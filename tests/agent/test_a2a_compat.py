"""The worker's reading of agents that deviate from A2A 1.0 (activities/agents/a2a_compat.py): a zone-less
timestamp is read as UTC wherever the stream splits it, a zoned one is left alone, and a2a-sdk's parse failure is
named by its field."""

from collections.abc import AsyncIterator

import httpx
from google.protobuf.json_format import ParseError

from activities.agents.a2a_compat import A2ACompatTransport, not_a2a


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
