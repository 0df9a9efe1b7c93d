"""A run's events as server-sent events: its phase changes and its agent's progress, from the store's log, in
order and numbered (the event id is the log's sequence number), so a client that reconnects with
`Last-Event-ID` gets exactly what it has not seen. The stream ends (`event: end`) when the run has finished
and every event was sent, or when the Run is gone.

Every stream of a process waits on one `Feed` of its store: one query a tick for all of them (a stream reads the
store itself only to catch up), so what a thousand open streams cost the store is what one costs."""

import asyncio
import itertools
import json
import weakref
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from api.budgets import Budget, Limits
from store import Event, ItemEvent, Store

# A console's tabs and a few CLIs a person; past a bound, 429 (each stream holds a connection and a store poller).
STREAM_LIMITS = Limits(per_person=32, per_namespace=256, total=1024)
POLL_SECONDS = 0.2
KEEPALIVE_SECONDS = 15.0
RUN_CHECK_SECONDS = (
    5.0  # a stream looks this often whether its Run still exists and its reader may still read it
)
TERMINAL_PHASES = frozenset({"Succeeded", "Failed", "Cancelled"})

# What ends a stream, given the phase of the last phase event sent (None before one): None while the run goes
# on, else the `end` event's data ({"phase": ...} or {"reason": ...}).
Ending = Callable[[str | None], Awaitable[dict[str, Any] | None]]


@dataclass(frozen=True)
class RunLook:
    """What a look at a stream's Run found: its uid (None: it is gone) and phase."""

    uid: str | None
    phase: str
    forbidden: bool = False  # the reader may no longer read it (their rights or their token went)


def run_ending(uid: str, look: Callable[[], Awaitable[RunLook | None]]) -> Ending:
    """The end of Run `uid`'s stream: once its last phase was sent (the bridge logs it just after the status);
    or the Run gone (another uid, or none); or terminal for a while with no such entry (a bridge without a
    store). `look` reads the Run, at most every RUN_CHECK_SECONDS; None when it could not (looked again later)."""
    last_look, terminal_since = 0.0, 0.0

    async def ended(last_phase: str | None) -> dict[str, Any] | None:
        nonlocal last_look, terminal_since
        if last_phase in TERMINAL_PHASES:
            return {"phase": last_phase}
        now = asyncio.get_running_loop().time()
        if now - last_look < RUN_CHECK_SECONDS:
            return None
        last_look = now
        seen = await look()
        if seen is None:
            return None
        if seen.forbidden:
            return {"reason": "forbidden"}
        if seen.uid != uid:
            return {"reason": "deleted"}
        if seen.phase in TERMINAL_PHASES:
            terminal_since = terminal_since or now
            if now - terminal_since >= RUN_CHECK_SECONDS:
                return {"phase": seen.phase}
        return None

    return ended


def sse(event_id: int | None, event: str, data: Any) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def event_data(event: Event) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind,
        "message": event.message,
        "data": event.data,
        "attempt": event.attempt,
        "at": event.at.isoformat(),
    }


MAX_CURSOR = (
    2**63 - 1
)  # the store's event numbers are 64-bit: a larger one would fail in the query, mid-stream


def parse_cursor(value: str | None) -> int:
    """`Last-Event-ID` (or ?after=): an event number; ValueError naming it otherwise."""
    try:
        after = int(value or "0")
    except ValueError:
        raise ValueError(f"Last-Event-ID must be an event number (got {value!r})") from None
    if not 0 <= after <= MAX_CURSOR:
        raise ValueError(f"Last-Event-ID must be an event number from 0 to {MAX_CURSOR} (got {after})")
    return after


T = TypeVar("T", Event, ItemEvent)
PAGE = 500  # a stream catching up reads this many at a time itself; once it has, it waits on the feed
WAIT_SECONDS = 1.0  # a stream waiting on the feed gets [] this often: to look whether it ends, or keep alive


class Feed(Generic[T]):
    """New entries (run events, item entries) for every stream of a process waiting on them, read from the store
    in one query a tick (`fetch`: each key's entries after its cursor) and handed to each stream that waits for
    its key. The tick runs while a stream waits and stops when none does."""

    def __init__(
        self,
        fetch: Callable[[dict[str, int]], Awaitable[list[tuple[str, T]]]],
        interval: float = POLL_SECONDS,
    ) -> None:
        self._fetch: Callable[[dict[str, int]], Awaitable[list[tuple[str, T]]]] = fetch
        self.interval = interval
        self._waiting: dict[int, tuple[str, int, asyncio.Future[list[T]], float]] = {}
        self._numbers = itertools.count()
        self._ticking: asyncio.Task[None] | None = None

    async def next(self, key: str, after: int, within: float = WAIT_SECONDS) -> list[T]:
        """`key`'s entries after `after` that the next ticks find, in order; [] when `within` seconds pass with
        none. A store error is raised to every stream waiting on that tick."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[list[T]] = loop.create_future()
        number = next(self._numbers)
        self._waiting[number] = (key, after, waiter, loop.time() + within)
        if self._ticking is None or self._ticking.done() or self._ticking.get_loop() is not loop:
            self._ticking = asyncio.create_task(self._tick())
        try:
            return await waiter
        finally:
            del self._waiting[number]

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            await asyncio.sleep(self.interval)
            waiting = [w for w in self._waiting.values() if not w[2].done()]
            cursors: dict[str, int] = {}
            for key, after, _, _ in waiting:
                cursors[key] = min(after, cursors.get(key, after))
            if not cursors:
                continue
            try:
                found = await self._fetch(cursors)
            except Exception as err:  # the store's: each stream fails as its own query would have
                for _, _, waiter, _ in waiting:
                    if not waiter.done():
                        waiter.set_exception(err)
                continue
            by_key: dict[str, list[T]] = defaultdict(list)
            for key, entry in found:
                by_key[key].append(entry)
            now = loop.time()
            for key, after, waiter, deadline in waiting:
                new = [e for e in by_key.get(key, ()) if e.seq > after]
                if (new or now >= deadline) and not waiter.done():
                    waiter.set_result(new)


_FEEDS: "weakref.WeakKeyDictionary[Store, tuple[Feed[Event], Feed[ItemEvent]]]" = weakref.WeakKeyDictionary()


def feeds_of(store: Store) -> tuple[Feed[Event], Feed[ItemEvent]]:
    """The store's feeds of run events and of item entries, one each in this process."""
    feeds = _FEEDS.get(store)
    if feeds is None:
        feeds = _FEEDS[store] = (Feed(store.events_of_runs), Feed(store.entries_of_items))
    return feeds


async def catching_up(
    key: str,
    after: int,
    read: Callable[[int], Awaitable[list[T]]],
    feed: Feed[T],
    disconnected: Callable[[], Awaitable[bool]],
) -> AsyncIterator[list[T]]:
    """`key`'s entries after `after`, as they come, a list at a time ([] now and then while none does): read
    from the store (`read(after)`) a page at a time until caught up, then from the feed. Ends when the client
    has gone."""
    caught_up = False
    while not await disconnected():
        if caught_up:
            found = await feed.next(key, after)
        else:
            found = await read(after)
            caught_up = len(found) < PAGE
        if found:
            after = found[-1].seq
        yield found


async def stream_events(
    store: Store, uid: str, after: int, disconnected: Callable[[], Awaitable[bool]], ended: Ending
) -> AsyncIterator[bytes]:
    """The run's events after `after`, then new ones as they come, then `end` (see the module)."""
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    phase: str | None = None
    feed = feeds_of(store)[0]

    async def read(after: int) -> list[Event]:
        return await store.events(uid, after, limit=PAGE)

    async for events in catching_up(uid, after, read, feed, disconnected):
        for event in events:
            after = event.seq
            last_sent = loop.time()
            if event.kind == "phase" and isinstance(event.data, dict):
                phase = event.data.get("phase")
            yield sse(event.seq, event.kind, event_data(event))
        end = await ended(phase)
        # A Run gone or no longer the reader's ends the stream now; a finished one once its last event is sent.
        if end is not None and ("reason" in end or not await store.events(uid, after, limit=1)):
            yield sse(None, "end", end)
            return
        if loop.time() - last_sent > KEEPALIVE_SECONDS:
            last_sent = loop.time()
            yield b": keep-alive\n\n"


class HeldStream:
    """An open stream's slot in the streams budget (api.budgets), taken when the stream is let open and given back
    once: when it ends, or when its response is dropped before it started (a client gone at once)."""

    def __init__(self, budget: Budget, person: str, namespace: str) -> None:
        budget.take(person, namespace)  # OverBudget: refused, nothing held
        self.budget, self.person, self.namespace = budget, person, namespace
        self._held = True

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self.budget.give_back(self.person, self.namespace)

    def __del__(self) -> None:
        self.give_back()

    async def counted(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self.give_back()


def stream_budget(limits: Limits | None = None) -> Budget:
    """The event streams people hold (runs' and items', the API's and the console's): each holds a connection
    and a store poller."""
    return Budget("streams", "event streams", limits or STREAM_LIMITS)
