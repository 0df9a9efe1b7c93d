"""What the worker copes with when an agent deviates from A2A 1.0, and how it names what it cannot cope with.

- A timestamp without a time zone (`"timestamp": "2026-12-06T04:19:02.226730"`: FastA2A 2.1.1 writes
  `datetime.now().isoformat()`), which A2A 1.0's protobuf JSON refuses: read as UTC. The agent's answers are
  rewritten as they arrive, a line at a time (each server-sent event is a line), before a2a-sdk parses them.
- Anything else a2a-sdk cannot parse as A2A 1.0 reaches the Run as "the agent's answer is not A2A 1.0: <the
  field and why>", not as the SDK's generic "This operation is not supported".
"""

import logging
import re
from collections.abc import AsyncIterator

import httpx
from google.protobuf.json_format import ParseError

log = logging.getLogger(__name__)
NAIVE_TIMESTAMP = re.compile(rb'("timestamp"\s*:\s*")(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?)(")')
_warned: set[str] = set()


def with_zones(line: bytes, agent: str) -> bytes:
    """`line` with each zone-less A2A timestamp read as UTC."""
    fixed, count = NAIVE_TIMESTAMP.subn(rb"\1\2Z\3", line)
    if count and agent not in _warned:
        _warned.add(agent)
        log.warning("the agent at %s sends timestamps without a time zone (not A2A 1.0): read as UTC", agent)
    return fixed


class _ZonedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, agent: str) -> None:
        self.inner = inner
        self.agent = agent

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        async for chunk in self.inner:
            pending += chunk
            complete, newline, pending = pending.rpartition(b"\n")
            if newline:
                yield with_zones(complete + newline, self.agent)
        if pending:
            yield with_zones(pending, self.agent)

    async def aclose(self) -> None:
        await self.inner.aclose()


class A2ACompatTransport(httpx.AsyncBaseTransport):
    """The worker's HTTP transport to agents: their answers with zone-less timestamps read as UTC."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None) -> None:
        self.inner = inner or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _ZonedStream(
            response.stream, f"{request.url.scheme}://{request.url.netloc.decode()}"
        )
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def not_a2a(err: BaseException) -> str | None:
    """What a2a-sdk could not parse as A2A 1.0 in the agent's answer (the protobuf parser's words: the field and
    why), when that is what `err` came from; else None."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ParseError):
            return str(cause)
        cause = cause.__cause__ or cause.__context__
    return None
