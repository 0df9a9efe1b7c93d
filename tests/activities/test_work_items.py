"""Work items in the store, on real PostgreSQL and SQLite: an item and its entries in order, people's writes and
agents' fenced ones, a stale holder's write refused leaving nothing, and bad writes refused naming the field."""

import asyncio

import pytest

from store import (
    Author,
    Holder,
    InvalidItemWrite,
    ItemExists,
    ItemNotFound,
    StaleFence,
    Store,
    work_item_key,
)

NS = "payments"
ALICE = Author(user="alice@example.com")
FIRST = Holder("uid-1", f"{NS}/fix-1", "alice@example.com")
SECOND = Holder("uid-2", f"{NS}/fix-2", "alice@example.com")


def agent(holder: Holder, attempt: int) -> Author:
    return Author(user=holder.triggered_by, run=holder.run, run_uid=holder.uid, attempt=attempt)


async def test_an_item_keeps_its_entries_in_order_with_who_wrote_each(store: Store) -> None:
    item = await store.create_item(
        NS, "wi-1", title="Flaky test_payment_retry", created_by="alice@example.com"
    )
    assert (item.state, item.last_seq, item.labels) == ("open", 1, ())
    claim = await store.claim(work_item_key(NS, "wi-1"), FIRST, 60)
    await store.comment(
        NS, "wi-1", "attempt 1: the retry loop races the clock", agent(FIRST, 1), FIRST, claim.fence
    )
    await store.comment(NS, "wi-1", "try freezing time", ALICE)
    await store.set_item_state(NS, "wi-1", "done", agent(FIRST, 1), FIRST, claim.fence, note="fixed")
    entries = await store.item_events(NS, "wi-1")
    assert [(e.seq, e.kind, e.body) for e in entries] == [
        (1, "created", "Flaky test_payment_retry"),
        (2, "comment", "attempt 1: the retry loop races the clock"),
        (3, "comment", "try freezing time"),
        (4, "state", "fixed"),
    ]
    assert entries[1].author == agent(FIRST, 1) and entries[1].fence == claim.fence
    assert entries[2].author == ALICE and entries[2].fence is None
    assert (await store.item(NS, "wi-1")).state == "done"
    assert [e.seq for e in await store.item_events(NS, "wi-1", after=2)] == [3, 4], "a stream resumes after"


async def test_a_holder_fenced_off_writes_nothing_to_the_item(store: Store) -> None:
    await store.create_item(NS, "wi-2", title="Slow build", created_by="alice@example.com")
    key = work_item_key(NS, "wi-2")
    first = await store.claim(key, FIRST, 60)
    await store.fence_bump(key, FIRST, first.fence)  # the workflow fenced the first attempt off
    await store.release(key, FIRST, first.fence + 1)
    second = await store.claim(key, SECOND, 60)
    before = await store.item(NS, "wi-2")
    for write in (
        store.comment(NS, "wi-2", "stale words", agent(FIRST, 1), FIRST, first.fence),
        store.set_item_state(NS, "wi-2", "done", agent(FIRST, 1), FIRST, first.fence),
        store.comment(
            NS, "wi-2", "the new holder's fence, the old holder", agent(FIRST, 1), FIRST, second.fence
        ),
    ):
        with pytest.raises(StaleFence):
            await write
    after = await store.item(NS, "wi-2")
    assert (after.state, after.last_seq) == (before.state, before.last_seq), (
        "nothing written, no number taken"
    )
    assert [e.kind for e in await store.item_events(NS, "wi-2")] == ["created"]
    await store.comment(
        NS, "wi-2", "attempt 2 read attempt 1's notes", agent(SECOND, 2), SECOND, second.fence
    )
    assert [e.seq for e in await store.item_events(NS, "wi-2")] == [1, 2]


async def test_bad_writes_are_refused_naming_the_field_and_change_nothing(store: Store) -> None:
    with pytest.raises(InvalidItemWrite) as long_title:
        await store.create_item(NS, "wi-3", title="x" * 513, created_by="alice@example.com")
    assert long_title.value.field == "title"
    with pytest.raises(InvalidItemWrite) as two_lines:
        await store.create_item(NS, "wi\n3", title="ok", created_by="alice@example.com")
    assert two_lines.value.field == "id"
    with pytest.raises(InvalidItemWrite) as slash:
        await store.create_item(NS, "org/repo#3", title="ok", created_by="alice@example.com")
    assert "letters, digits" in str(slash.value)
    with pytest.raises(InvalidItemWrite) as labels:
        await store.create_item(
            NS, "wi-3", title="ok", created_by="a", labels=tuple(f"l{i}" for i in range(33))
        )
    assert labels.value.field == "labels"
    assert await store.items(NS) == [], "no item half-made"

    await store.create_item(NS, "wi-3", title="ok", created_by="alice@example.com")
    with pytest.raises(ItemExists):
        await store.create_item(NS, "wi-3", title="again", created_by="bob@example.com")
    with pytest.raises(InvalidItemWrite) as oversized:
        await store.comment(NS, "wi-3", "x" * (64 * 1024 + 1), ALICE)
    assert oversized.value.field == "body"
    with pytest.raises(InvalidItemWrite) as unknown_state:
        await store.set_item_state(NS, "wi-3", "closed", ALICE)
    assert "open, in-progress, blocked, done" in str(unknown_state.value)
    with pytest.raises(InvalidItemWrite) as same:
        await store.set_item_state(NS, "wi-3", "open", ALICE)
    assert "wi-3 is open: it can go to blocked, done, in-progress" in str(same.value)
    await store.set_item_state(NS, "wi-3", "done", ALICE)
    with pytest.raises(InvalidItemWrite):
        await store.set_item_state(NS, "wi-3", "blocked", ALICE)  # a done item reopens first
    with pytest.raises(ItemNotFound):
        await store.comment(NS, "wi-none", "hello", ALICE)
    item = await store.item(NS, "wi-3")
    assert (item.state, item.last_seq) == ("done", 2)


async def test_an_id_is_unique_in_its_namespace_only(store: Store) -> None:
    await store.create_item(NS, "wi-4", title="ours", created_by="alice@example.com")
    await store.create_item("billing", "wi-4", title="theirs", created_by="mallory@example.com")
    await store.comment("billing", "wi-4", "only on theirs", Author(user="mallory@example.com"))
    assert [e.kind for e in await store.item_events(NS, "wi-4")] == ["created"]
    assert [(i.namespace, i.title) for i in await store.items(NS)] == [(NS, "ours")]


async def test_concurrent_writers_take_turns_and_numbers_stay_dense(store: Store) -> None:
    await store.create_item(NS, "wi-5", title="busy", created_by="alice@example.com")
    await asyncio.gather(*(store.comment(NS, "wi-5", f"note {i}", ALICE) for i in range(20)))
    entries = await store.item_events(NS, "wi-5")
    assert [e.seq for e in entries] == list(range(1, 22))
    assert sorted(e.body for e in entries[1:]) == sorted(f"note {i}" for i in range(20))


async def test_items_list_by_state_a_page_at_a_time(store: Store) -> None:
    for i in range(5):
        await store.create_item(NS, f"wi-{i}", title=f"item {i}", created_by="alice@example.com")
    await store.set_item_state(NS, "wi-3", "blocked", ALICE)
    assert [i.item_id for i in await store.items(NS, limit=2)] == ["wi-0", "wi-1"]
    assert [i.item_id for i in await store.items(NS, after="wi-1", limit=2)] == ["wi-2", "wi-3"]
    assert [i.item_id for i in await store.items(NS, state="blocked")] == ["wi-3"]
