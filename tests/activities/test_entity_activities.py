"""The entity activities on a real Temporal (the session's dev server) and a real store (PostgreSQL and SQLite).

A run that subscribes to a credential must learn of a 429 another run reported a moment before. The credential's
throttle workflow learns of it only with its next workflow task, which under a burst of new runs comes seconds
late (bench.paused once saw 175 of 1,000 runs call a limited provider in that window). Here no worker polls the
throttle's task queue at all, which is that lag at its worst: the limit must reach the subscriber through the
store, which the reporting run writes before it signals."""

import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client
from temporalio.testing import ActivityEnvironment

from activities.entities import EntityActivities
from dev.devserver import DevServer
from store import Store
from workflows.activity_types import EntitySignal
from workflows.entity_types import CredentialLimit, CredentialSubscription, credential_workflow_id


def message(key: str, signal: str, arg: CredentialLimit | CredentialSubscription) -> EntitySignal:
    return EntitySignal(
        workflow="CredentialThrottle",
        workflow_id=credential_workflow_id(key),
        signal=signal,
        arg=arg.model_dump(mode="json"),
    )


async def test_a_subscriber_learns_of_a_limit_its_throttle_has_not_processed_yet(
    dev_server: DevServer, store_url: str
) -> None:
    client = await Client.connect(dev_server.target)
    store = await Store.open(store_url)
    queue = f"no-worker-{uuid.uuid4().hex[:8]}"  # the throttle workflow never runs a task
    key = f"payments/key-{uuid.uuid4().hex[:8]}"
    env = ActivityEnvironment()
    with_store, memo_only = EntityActivities(client, queue, store), EntityActivities(client, queue)
    try:
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
        await env.run(
            with_store.signal_with_start, message(key, "limited", CredentialLimit(run_id="a", until=until))
        )

        # What the throttle's memo says: nothing yet, so a subscriber reading it would call the provider.
        assert (
            await env.run(
                memo_only.signal_with_start, message(key, "subscribe", CredentialSubscription(run_id="b"))
            )
            is None
        )
        notice = await env.run(
            with_store.signal_with_start, message(key, "subscribe", CredentialSubscription(run_id="c"))
        )
        assert notice is not None and (notice.key, notice.until, notice.strikes) == (key, until, 1)

        # A later, shorter limit does not shorten it; each limit is a strike. A success during the limit keeps them.
        shorter = CredentialLimit(run_id="d", until=until - timedelta(minutes=5))
        await env.run(with_store.signal_with_start, message(key, "limited", shorter))
        await env.run(
            with_store.signal_with_start, message(key, "cleared", CredentialSubscription(run_id="d"))
        )
        assert await store.credential_limit(key) == (until, 2)

        # The throttle got every message, in order, for when it runs.
        handle = client.get_workflow_handle(credential_workflow_id(key))
        signals = [
            e.workflow_execution_signaled_event_attributes.signal_name
            async for e in handle.fetch_history_events()
            if e.HasField("workflow_execution_signaled_event_attributes")
        ]
        assert signals == ["limited", "subscribe", "subscribe", "limited", "cleared"]
        await handle.terminate("test over")
    finally:
        await store.close()


async def test_strikes_start_over_after_a_success_once_the_limit_has_passed(store_url: str) -> None:
    store = await Store.open(store_url)
    try:
        key = "payments/key"
        await store.record_credential_limit(key, datetime.now(UTC) - timedelta(seconds=1))
        await store.record_credential_limit(key, datetime.now(UTC) - timedelta(seconds=2))
        assert (await store.credential_limit(key) or (None, 0))[1] == 2
        await store.clear_credential_strikes(key)
        assert (await store.credential_limit(key) or (None, -1))[1] == 0
        assert await store.credential_limit("payments/never-limited") is None
        longest = f"{'n' * 63}/{'s' * 253}"  # the longest namespace and Secret name Kubernetes allows
        await store.record_credential_limit(longest, datetime.now(UTC))
        assert await store.credential_limit(longest) is not None
    finally:
        await store.close()
