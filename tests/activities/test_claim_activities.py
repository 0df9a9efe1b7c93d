"""The claim activities keep the store's meaning across the activity boundary; leases are kept by heartbeats."""

import asyncio
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.claims import ClaimActivities, keep_lease
from dev.devserver import DevServer
from store import Holder, Store, WorkItemHeld
from testbed.postgres import PostgresServer
from testbed.warrants import run_warrant
from tests.workflows.world import World, run_input, running_world_on, start_run
from workflows.activity_types import Activity, ClaimRequest, ClaimUpdate, RunRef
from workflows.status import Phase

RUN_A = RunRef(namespace="payments", name="run-a", uid="uid-a", triggered_by="alice@example.com")
RUN_B = RunRef(namespace="payments", name="run-b", uid="uid-b")


async def test_activities_map_store_outcomes_to_retryable_and_final_errors(store: Store) -> None:
    acts = ClaimActivities(store)
    env = ActivityEnvironment()
    claim = await env.run(
        acts.claim_work_item, ClaimRequest(warrant=run_warrant(RUN_A, "wi-1"), attempt=1, lease_seconds=60)
    )
    assert claim.fence == 1
    with pytest.raises(ApplicationError) as held:
        await env.run(
            acts.claim_work_item,
            ClaimRequest(warrant=run_warrant(RUN_B, "wi-1"), attempt=1, lease_seconds=60),
        )
    assert (held.value.type, held.value.non_retryable) == ("WorkItemHeld", False)
    assert "held by payments/run-a" in str(held.value)

    fenced = await env.run(
        acts.fence_work_item, ClaimUpdate(warrant=run_warrant(RUN_A, "wi-1"), fence=claim.fence)
    )
    with pytest.raises(ApplicationError) as stale:
        await env.run(
            acts.release_work_item, ClaimUpdate(warrant=run_warrant(RUN_A, "wi-1"), fence=claim.fence)
        )
    assert (stale.value.type, stale.value.non_retryable) == ("StaleFence", True)
    renewed = await env.run(
        acts.renew_claim,
        ClaimUpdate(warrant=run_warrant(RUN_A, "wi-1"), fence=fenced.fence, lease_seconds=600),
    )
    assert renewed.lease_expires_at is not None
    await env.run(acts.release_work_item, ClaimUpdate(warrant=run_warrant(RUN_A, "wi-1"), fence=fenced.fence))
    assert await store.holder_of("payments/wi-1") == (None, fenced.fence)


async def test_an_unreachable_database_is_a_retryable_failure_never_a_success(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/missing-dir/ksquad.db")  # the directory does not exist
    try:
        with pytest.raises(ApplicationError) as caught:
            await ActivityEnvironment().run(
                ClaimActivities(store).claim_work_item,
                ClaimRequest(warrant=run_warrant(RUN_A, "wi-1"), attempt=1, lease_seconds=60),
            )
    finally:
        await store.close()
    assert (caught.value.type, caught.value.non_retryable) == ("StoreUnavailable", False)
    assert "database unavailable" in str(caught.value)


async def test_a_ref_in_another_namespace_is_another_item_its_holder_unseen(store: Store) -> None:
    """A tenant who names another namespace's workItemRef neither waits for that item nor learns who holds it: a
    ref is unique in its namespace only."""
    acts = ClaimActivities(store)
    env = ActivityEnvironment()
    mine = await env.run(
        acts.claim_work_item, ClaimRequest(warrant=run_warrant(RUN_A, "wi-1"), attempt=1, lease_seconds=60)
    )
    other_tenant = RunRef(namespace="billing", name="run-x", uid="uid-x", triggered_by="mallory@example.com")
    theirs = await env.run(
        acts.claim_work_item,
        ClaimRequest(warrant=run_warrant(other_tenant, "wi-1"), attempt=1, lease_seconds=60),
    )
    assert (mine.fence, theirs.fence) == (1, 1), "two items, each claimed once"
    assert (await store.holder_of("payments/wi-1"))[0] == "uid-a"
    assert (await store.holder_of("billing/wi-1"))[0] == "uid-x"
    assert [h.holder_run for h in await store.claim_history("billing/wi-1")] == ["billing/run-x"]
    await env.run(
        acts.release_work_item, ClaimUpdate(warrant=run_warrant(other_tenant, "wi-1"), fence=theirs.fence)
    )
    assert (await store.holder_of("payments/wi-1"))[0] == "uid-a", "releasing theirs leaves mine held"


async def test_heartbeats_keep_the_lease_and_notice_when_it_is_lost(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path}/ksquad.db")
    holder, other = Holder("uid-a", "payments/run-a"), Holder("uid-b", "payments/run-b")
    try:
        claim = await store.claim("wi-1", holder, lease_seconds=1)
        async with keep_lease(store, "wi-1", holder, claim.fence, lease_seconds=1, every=0.2) as lease:
            await asyncio.sleep(1.5)
            with pytest.raises(WorkItemHeld):
                await store.claim("wi-1", other, 1)
            assert lease.renewals >= 3
            assert not lease.lost.is_set()
            await store.fence_bump("wi-1", holder, claim.fence)  # the workflow fences this holder off
            await asyncio.wait_for(lease.lost.wait(), 2)
        assert "no longer current" in lease.reason
    finally:
        await store.close()


async def test_with_the_database_down_the_claim_fails_retryably_and_the_run_goes_on_after(
    dev_server: DevServer, outage_postgres: PostgresServer
) -> None:
    store = await Store.open(outage_postgres.dsn)
    world = World()
    ns = f"t-{uuid.uuid4().hex[:8]}"
    try:
        async with running_world_on(dev_server.target, world, ClaimActivities(store).all()) as client:
            outage_postgres.halt()
            handle = await start_run(client, run_input("outage", namespace=ns, work_item_ref="wi-outage"))
            failure = await wait_for_failed_attempts(client, handle.id, attempts=2)
            assert "database unavailable" in failure
            assert world.last("outage").phase == Phase.CLAIMING  # type: ignore[union-attr]
            assert not world.calls_of(Activity.INVOKE_AGENT), "nothing runs without the claim"

            outage_postgres.resume()
            status = await handle.result()
        assert status.phase == Phase.SUCCEEDED
        history = await store.claim_history(f"{ns}/wi-outage")
        assert [e.action for e in history] == ["claimed", "released"]
    finally:
        await store.close()


async def wait_for_failed_attempts(client: Client, workflow_id: str, attempts: int) -> str:
    for _ in range(300):
        description = await client.get_workflow_handle(workflow_id).describe()
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name == Activity.CLAIM_WORK_ITEM and pending.attempt > attempts:
                return str(pending.last_failure.message)
        await asyncio.sleep(0.1)
    raise AssertionError(f"the claim activity did not fail {attempts} times")
