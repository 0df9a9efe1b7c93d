"""The feed every event stream of a process waits on (api.streams.Feed), on real PostgreSQL and SQLite: one store
query a tick however many streams wait, each stream handed exactly its own new entries in order; the batched
reads behind it respect each key's cursor and the limit."""

import asyncio

import pytest

from api.streams import Feed, feeds_of
from store import Author, Event, Store, StoreError, work_item_key

STREAMS = (
    250  # more keys than one query names (store.events.read_after_cursors): the parts are read in one tick
)


async def test_one_query_a_tick_serves_every_stream_each_its_own_entries(store: Store) -> None:
    fetched: list[int] = []

    async def fetch(cursors: dict[str, int]) -> list[tuple[str, Event]]:
        fetched.append(len(cursors))
        return await store.events_of_runs(cursors)

    feed: Feed[Event] = Feed(fetch, interval=0.05)
    uids = [f"uid-{i:03d}" for i in range(STREAMS)]
    for uid in uids:
        await store.append_notice(uid, f"ns/{uid}", "status", "before the stream")

    async def follow(uid: str) -> list[str]:
        got: list[Event] = []
        while len(got) < 2:
            got += await feed.next(uid, got[-1].seq if got else 1)
        return [f"{e.seq}:{e.message}" for e in got]

    loop = asyncio.get_running_loop()
    started = loop.time()
    following = [asyncio.create_task(follow(uid)) for uid in uids]
    await asyncio.sleep(0.2)
    for n in (1, 2):
        for uid in uids:
            await store.append_notice(uid, f"ns/{uid}", "status", f"{uid} #{n}")
    results = await asyncio.wait_for(asyncio.gather(*following), 60)
    elapsed = loop.time() - started
    assert results == [[f"2:{uid} #1", f"3:{uid} #2"] for uid in uids]
    assert len(fetched) <= elapsed / 0.05 + 2, (
        f"{len(fetched)} queries in {elapsed:.1f} s for {STREAMS} streams"
    )
    assert max(fetched) == STREAMS, "one tick reads for every stream waiting"


async def test_a_stream_with_nothing_new_is_answered_empty_within_its_wait(store: Store) -> None:
    feed = feeds_of(store)[0]
    assert feed is feeds_of(store)[0], "one feed a store"
    assert await asyncio.wait_for(feed.next("uid-quiet", 0, within=0.3), 60) == [], "answered, not held"


async def test_a_store_error_reaches_every_stream_waiting_on_the_tick() -> None:
    async def failing(cursors: dict[str, int]) -> list[tuple[str, Event]]:
        raise StoreError("the store does not answer")

    feed: Feed[Event] = Feed(failing, interval=0.01)
    waits = [feed.next(f"uid-{i}", 0) for i in range(3)]
    answers = await asyncio.gather(*waits, return_exceptions=True)
    assert [type(a) for a in answers] == [StoreError] * 3


async def test_batched_reads_keep_each_keys_cursor_and_order_by_key_then_seq(store: Store) -> None:
    for uid in ("b", "a", "c"):
        for n in range(1, 4):
            await store.append_notice(uid, f"ns/{uid}", "status", f"{uid}{n}")
    found = await store.events_of_runs({"a": 1, "b": 0, "c": 3, "missing": 0})
    assert [(k, e.message) for k, e in found] == [
        ("a", "a2"),
        ("a", "a3"),
        ("b", "b1"),
        ("b", "b2"),
        ("b", "b3"),
    ]
    limited = await store.events_of_runs({"a": 0, "b": 0}, limit=4)
    assert [e.message for _, e in limited] == ["a1", "a2", "a3", "b1"]

    for item in ("ITEM-1", "ITEM-2"):
        await store.create_item("team", item, title=item, created_by="alice")
        await store.comment("team", item, f"on {item}", Author(user="bob"))
    one, two = work_item_key("team", "ITEM-1"), work_item_key("team", "ITEM-2")
    entries = await store.entries_of_items({one: 1, two: 0})
    assert [(k, e.kind) for k, e in entries] == [(one, "comment"), (two, "created"), (two, "comment")]


@pytest.mark.parametrize("keys", [1, 101, 450])
async def test_batched_reads_name_any_number_of_keys(store: Store, keys: int) -> None:
    uids = [f"k{i:04d}" for i in range(keys)]
    await store.append_notice(uids[-1], "ns/last", "status", "the last one")
    found = await store.events_of_runs(dict.fromkeys(uids, 0))
    assert [(k, e.message) for k, e in found] == [(uids[-1], "the last one")]
