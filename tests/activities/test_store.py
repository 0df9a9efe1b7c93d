"""The coordination store on real PostgreSQL and SQLite: one holder, fences, leases, migrations, and the places
in the ramp after a rate limit."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from temporalio.testing import ActivityEnvironment

from activities.entities import ResumePlaces
from store import Holder, PhaseRecord, StaleFence, Store, WorkItemHeld, migrations, sync_url, work_item_key
from store.schema import metadata
from tests.activities.conftest import Clock
from workflows.entity_types import ResumePlaceRequest

A = Holder("uid-a", "payments/run-a", "alice@example.com")
B = Holder("uid-b", "payments/run-b", "bob@example.com")


async def test_fifty_concurrent_claimers_get_exactly_one_holder(store: Store) -> None:
    holders = [Holder(f"uid-{i}", f"payments/run-{i}") for i in range(50)]
    results = await asyncio.gather(*(store.claim("wi-hot", h, 60) for h in holders), return_exceptions=True)
    winners = [h for h, r in zip(holders, results, strict=True) if not isinstance(r, BaseException)]
    losers = [r for r in results if isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, WorkItemHeld) for r in losers), losers[:3]
    assert await store.holder_of("wi-hot") == (winners[0].uid, 1)
    assert [e.action for e in await store.claim_history("wi-hot")] == ["claimed"]


async def test_claiming_again_as_the_holder_bumps_the_fence(store: Store) -> None:
    first = await store.claim("wi-1", A, 60)
    again = await store.claim("wi-1", A, 60)
    assert (first.fence, again.fence) == (1, 2)
    with pytest.raises(StaleFence):
        await store.append_event(A, first.fence, 1, "progress", work_item_ref="wi-1")


async def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced_off(
    store: Store, clock: Clock
) -> None:
    old = await store.claim("wi-1", A, 30)
    with pytest.raises(WorkItemHeld, match="held by payments/run-a"):
        await store.claim("wi-1", B, 30)
    clock.advance(31)
    new = await store.claim("wi-1", B, 30)
    assert new.took_over_from == "uid-a"
    assert new.fence > old.fence
    for stale_write in (
        store.append_event(A, old.fence, 1, "progress", "late", work_item_ref="wi-1"),
        store.put_artifact(A, old.fence, "late.txt", content=b"x", work_item_ref="wi-1"),
        store.renew("wi-1", A, old.fence, 30),
        store.fence_bump("wi-1", A, old.fence),
        store.release("wi-1", A, old.fence),
    ):
        with pytest.raises(StaleFence):
            await stale_write
    assert await store.holder_of("wi-1") == ("uid-b", new.fence)
    history = await store.claim_history("wi-1")
    assert [(e.action, e.holder_uid) for e in history] == [("claimed", "uid-a"), ("took-over", "uid-b")]
    assert history[1].previous_holder_uid == "uid-a"


async def test_renewal_keeps_the_claim_past_its_first_lease(store: Store, clock: Clock) -> None:
    claim = await store.claim("wi-1", A, 30)
    clock.advance(20)
    await store.renew("wi-1", A, claim.fence, 30)
    clock.advance(20)
    with pytest.raises(WorkItemHeld):
        await store.claim("wi-1", B, 30)


async def test_after_fence_bump_every_write_of_the_previous_fence_is_refused(store: Store) -> None:
    claim = await store.claim("wi-1", A, 60)
    await store.append_event(A, claim.fence, 1, "progress", "before", work_item_ref="wi-1")
    fence = await store.fence_bump("wi-1", A, claim.fence)
    assert fence == claim.fence + 1
    with pytest.raises(StaleFence):
        await store.append_event(A, claim.fence, 1, "progress", "after", work_item_ref="wi-1")
    with pytest.raises(StaleFence):
        await store.put_artifact(A, claim.fence, "after.txt", content=b"x", work_item_ref="wi-1")
    await store.append_event(A, fence, 1, "progress", "with the new fence", work_item_ref="wi-1")
    assert [e.message for e in await store.events("uid-a")] == ["before", "with the new fence"]


async def test_a_write_in_flight_finishes_before_the_fence_bump_returns(store: Store) -> None:
    claim = await store.claim("wi-1", A, 60)
    async with store.transaction() as tx:
        await store.append_event(A, claim.fence, 1, "progress", "in flight", work_item_ref="wi-1", conn=tx)
        bump = asyncio.ensure_future(store.fence_bump("wi-1", A, claim.fence))
        await asyncio.sleep(0.5)
        assert not bump.done(), "the bump waits for the write in flight"
    new_fence = await bump
    assert [e.message for e in await store.events("uid-a")] == ["in flight"]
    with pytest.raises(StaleFence):
        await store.append_event(A, claim.fence, 1, "progress", "too late", work_item_ref="wi-1")
    assert new_fence == claim.fence + 1


async def test_a_write_that_starts_during_a_fence_bump_is_refused(store: Store) -> None:
    claim = await store.claim("wi-1", A, 60)
    async with store.transaction() as tx:
        await store.fence_bump("wi-1", A, claim.fence, conn=tx)
        write = asyncio.ensure_future(
            store.append_event(A, claim.fence, 1, "progress", "racing", work_item_ref="wi-1")
        )
        await asyncio.sleep(0.5)
        assert not write.done(), "the write waits for the bump"
    with pytest.raises(StaleFence):
        await write
    assert await store.events("uid-a") == []


async def test_a_release_by_a_stale_holder_is_refused(store: Store, clock: Clock) -> None:
    old = await store.claim("wi-1", A, 10)
    clock.advance(11)
    new = await store.claim("wi-1", B, 10)
    with pytest.raises(StaleFence):
        await store.release("wi-1", A, old.fence)
    assert await store.holder_of("wi-1") == ("uid-b", new.fence)
    fenced = await store.fence_bump("wi-1", B, new.fence)
    with pytest.raises(StaleFence):
        await store.release("wi-1", B, new.fence)
    await store.release("wi-1", B, fenced)
    assert await store.holder_of("wi-1") == (None, fenced)
    free = await store.claim("wi-1", A, 10)
    assert free.took_over_from is None


async def test_runs_without_a_work_item_fence_their_writes_by_attempt(store: Store) -> None:
    await store.begin_attempt(A, 1)
    await store.append_event(A, 1, 1, "progress", "attempt 1")
    await store.begin_attempt(A, 2)
    with pytest.raises(StaleFence, match="attempt fence of payments/run-a"):
        await store.append_event(A, 1, 1, "progress", "attempt 1, late")
    await store.begin_attempt(A, 1)  # an old attempt cannot win the fence back
    with pytest.raises(StaleFence):
        await store.put_artifact(A, 1, "old.txt", content=b"x")
    await store.put_artifact(A, 2, "report.md", content=b"# done", media_type="text/markdown")
    assert [e.message for e in await store.events("uid-a")] == ["attempt 1"]


async def test_events_are_ordered_per_run_and_read_with_a_cursor(store: Store) -> None:
    claim = await store.claim("wi-1", A, 60)
    await store.begin_attempt(B, 1)
    for i in range(5):
        await store.append_event(A, claim.fence, 1, "progress", f"a{i}", {"step": i}, work_item_ref="wi-1")
        await store.append_event(B, 1, 1, "progress", f"b{i}")
    events = await store.events("uid-a")
    assert [e.seq for e in events] == [1, 2, 3, 4, 5]
    assert [e.data for e in events] == [{"step": i} for i in range(5)]
    assert [e.message for e in await store.events("uid-a", after=3)] == ["a3", "a4"]
    assert all(e.triggered_by == "alice@example.com" for e in events), "the triggering user is on every event"
    assert [e.message for e in await store.events("uid-b", after=4)] == ["b4"]


async def test_concurrent_appends_of_one_run_get_distinct_sequence_numbers(store: Store) -> None:
    await store.begin_attempt(A, 1)
    seqs = await asyncio.gather(*(store.append_event(A, 1, 1, "progress", str(i)) for i in range(20)))
    assert sorted(seqs) == list(range(1, 21))


async def test_the_triggering_user_is_recorded_with_the_claim(store: Store) -> None:
    await store.claim("wi-1", A, 60)
    (entry,) = await store.claim_history("wi-1")
    assert entry.triggered_by == "alice@example.com"


async def test_migrations_run_from_empty_are_idempotent_and_match_the_schema(store_url: str) -> None:
    store = Store(store_url)
    try:
        await store.migrate()
        await store.migrate()  # again: nothing to do, nothing breaks
    finally:
        await store.close()
    engine = sa.create_engine(sync_url(store_url))
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), metadata)
            version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
    finally:
        engine.dispose()
    assert diff == [], "the migrations create exactly the schema the code uses"
    assert version == "0011"


async def test_claims_and_what_was_written_under_them_move_to_namespaced_keys(store_url: str) -> None:
    """Migration 0006: a bare workItemRef could be one claim for two namespaces. Each row takes the namespace of
    the run that wrote it; a released claim, of its last holder."""
    engine = sa.create_engine(sync_url(store_url))
    try:
        with engine.begin() as conn:
            migrations.upgrade(conn, "0005")
        old = Store(store_url)  # at 0005: not migrated further
        try:
            await old.claim("shared", A, 60)  # held by payments/run-a
            await old.claim("done", Holder("uid-c", "billing/run-c"), 60)
            await old.release("done", Holder("uid-c", "billing/run-c"), 1)
            await old.append_event(A, 1, 1, "progress", work_item_ref="shared")
            await old.put_artifact(A, 1, "answer", content=b"x", work_item_ref="shared")
        finally:
            await old.close()
        with engine.begin() as conn:
            migrations.upgrade(conn)
            keys = {
                table: sorted(r[0] for r in conn.execute(sa.text(f"SELECT work_item_ref FROM {table}")))
                for table in ("claims", "claim_history", "run_events", "artifacts")
            }
    finally:
        engine.dispose()
    assert keys == {
        "claims": ["billing/done", "payments/shared"],
        "claim_history": ["billing/done", "billing/done", "payments/shared"],
        "run_events": ["payments/shared"],
        "artifacts": ["payments/shared"],
    }
    migrated = Store(store_url)
    try:
        longest = work_item_key("payments", "r" * 1024)  # the longest ref a Run may name, in a namespace
        assert (await migrated.claim(longest, A, 60)).fence == 1
    finally:
        await migrated.close()


async def test_a_later_attempts_artifact_replaces_the_earlier_one(store: Store) -> None:
    await store.begin_attempt(A, 1)
    first = await store.put_artifact(A, 1, "answer", content=b"attempt 1", media_type="text/plain")
    await store.begin_attempt(A, 2)
    second = await store.put_artifact(A, 2, "answer", content=b"attempt two", media_type="text/plain")
    assert first == second, "one artifact per name and run: the newest attempt's"
    with pytest.raises(StaleFence):
        await store.put_artifact(A, 1, "answer", content=b"late attempt 1")


async def test_places_in_the_resume_ramp_are_unique_and_in_order_for_concurrent_takers(store: Store) -> None:
    until = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    places = ResumePlaces(store)
    env = ActivityEnvironment()
    request = ResumePlaceRequest(key="ns/model-key", until=until, resume_per_second=4)
    taken = await asyncio.gather(*(env.run(places.reserve_resume_place, request) for _ in range(40)))
    assert sorted(taken) == [until + timedelta(seconds=i / 4) for i in range(40)], "40 places, 0.25 s apart"
    other = await env.run(
        places.reserve_resume_place, request.model_copy(update={"until": until + timedelta(hours=1)})
    )
    assert other == until + timedelta(hours=1), "a new limit starts its own ramp"


def phase(revision: int) -> PhaseRecord:
    return PhaseRecord(revision=revision, message=f"r{revision}", data={"revision": revision}, attempt=1)


async def test_phase_events_are_logged_once_per_revision_beside_the_agents_progress(store: Store) -> None:
    claim = await store.claim("wi-1", A, 60)
    assert await store.append_phase_events(A.uid, A.run, [phase(1), phase(2)]) == 2
    await store.append_event(A, claim.fence, 1, "progress", "working", work_item_ref="wi-1")
    # A snapshot sent again (a retried or coalesced status) carries revisions logged already.
    assert await store.append_phase_events(A.uid, A.run, [phase(2), phase(3)]) == 1
    # Two bridge replicas sending the same snapshot at once: each revision still once.
    both = await asyncio.gather(
        *(store.append_phase_events(A.uid, A.run, [phase(4), phase(5)]) for _ in range(2))
    )
    assert sorted(both) == [0, 2]
    events = await store.events(A.uid)
    assert [(e.seq, e.kind, e.message) for e in events] == [
        (1, "phase", "r1"),
        (2, "phase", "r2"),
        (3, "progress", "working"),
        (4, "phase", "r3"),
        (5, "phase", "r4"),
        (6, "phase", "r5"),
    ]
