"""What the worker copes with when an agent deviates from A2A 1.0, and how it names what it cannot cope with.

- A timestamp without a time zone (`"timestamp": "2026-12-06T04:19:02.226730"`: FastA2A 2.1.1 writes
  `datetime.now().isoformat()`), which A2A 1.0's protobuf JSON refuses: read as UTC. The agent's answers are
  rewritten as they arrive, a line at a time (each server-sent event is a line), before a2a-sdk parses them.
- A line longer than MAX_ANSWER_LINE (a server-sent event, or a whole JSON body): the answer is read no further
  and the Run fails with that reason (AnswerTooLarge). Held whole, a line without end would grow the worker
  until it died for every tenant; and each chunk is looked at once, so a long line costs time in its length.
- Anything else a2a-sdk cannot parse as A2A 1.0 reaches the Run as "the agent's answer is not A2A 1.0: <the
  field and why>", not as the SDK's generic "This operation is not supported".
"""

import logging
import re
from collections.abc import AsyncIterator
from typing import TypeVar

import httpx
from google.protobuf.json_format import ParseError

log = logging.getLogger(__name__)
E = TypeVar("E", bound=BaseException)
# One line of an agent's answer, in bytes: what the worker holds of one answer at most. An artifact is at most
# 1 MiB (activities.agents.recording.MAX_ARTIFACT_BYTES); a final message of 10 MB is still read (and cut to
# the status's bounds), a line without end is not.
MAX_ANSWER_LINE = 32 << 20
NAIVE_TIMESTAMP = re.compile(rb'("timestamp"\s*:\s*")(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?)(")')
_warned: set[str] = set()


def with_zones(line: bytes, agent: str) -> bytes:
    """`line` with each zone-less A2A timestamp read as UTC."""
    fixed, count = NAIVE_TIMESTAMP.subn(rb"\1\2Z\3", line)
    if count and agent not in _warned:
        _warned.add(agent)
        log.warning("the agent at %s sends timestamps without a time zone (not A2A 1.0): read as UTC", agent)
    return fixed


class AnswerTooLarge(Exception):
    """A line of an agent's answer longer than MAX_ANSWER_LINE."""

    def __init__(self, agent: str) -> None:
        super().__init__(
            f"the agent's answer has a line (an event, or a whole JSON body) longer than "
            f"{MAX_ANSWER_LINE >> 20} MiB: not read further"
        )
        self.agent = agent


class _ZonedStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, agent: str) -> None:
        self.inner = inner
        self.agent = agent

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held: list[bytes] = []  # the line begun and not yet ended
        size = 0
        async for chunk in self.inner:
            end = chunk.rfind(b"\n")
            first_end = chunk.find(b"\n") if end >= 0 else len(chunk)
            if size + first_end > MAX_ANSWER_LINE:
                raise AnswerTooLarge(self.agent)
            if end < 0:
                held.append(chunk)
                size += len(chunk)
                continue
            yield with_zones(b"".join([*held, chunk[: end + 1]]), self.agent)
            rest = chunk[end + 1 :]
            held, size = [rest], len(rest)
        if size:
            yield with_zones(b"".join(held), self.agent)

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


def found_in(err: BaseException, kind: type[E]) -> E | None:
    """The first exception of `kind` among `err` and its causes (a2a-sdk and httpx wrap what they catch)."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, kind):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def not_a2a(err: BaseException) -> str | None:
    """What a2a-sdk could not parse as A2A 1.0 in the agent's answer (the protobuf parser's words: the field and
    why), when that is what `err` came from; else None."""
    parse = found_in(err, ParseError)
    return None if parse is None else str(parse)
