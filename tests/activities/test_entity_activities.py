"""The entity activities on a real Temporal (the session's dev server) and a real store (PostgreSQL and SQLite).

A run that subscribes to a credential must learn of a 429 another run reported a moment before. The credential's
throttle workflow learns of it only with its next workflow task, which under a burst of new runs comes seconds
late (bench.paused once saw 175 of 1,000 runs call a limited provider in that window). Here no worker polls the
entities' task queue at all, which is that lag at its worst: the limit must reach the subscriber through the
store, which the reporting run writes before it signals.

With a store a run subscribes with a row, not a signal to the throttle, and the credential's announcer tells
the rows of a limit (`announce_credential_limit`): every subscriber but the runs that reported it, page by page,
forgetting the runs that are gone."""

import asyncio
import secrets
import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.testing import ActivityEnvironment

from activities.entities import EntityActivities
from dev.devserver import DevServer
from store import Store
from temporal_client.connection import with_signing
from temporal_client.proofs import Signing
from temporal_client.seal import Sealer
from testbed.warrants import plain_warrant
from worker.registry import build_worker
from workflows.activity_types import EntitySignal
from workflows.entities import CredentialAnnouncerWorkflow
from workflows.entity_types import (
    CREDENTIAL_THROTTLED,
    AnnouncerState,
    CredentialLimit,
    CredentialSubscription,
    LimitAnnouncement,
    ThrottleNotice,
    credential_announcer_id,
    credential_workflow_id,
)
from workflows.inbox import Sender


def message(key: str, signal: str, arg: CredentialLimit | CredentialSubscription) -> EntitySignal:
    return EntitySignal(
        warrant=plain_warrant(),
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

        # The throttle got every limit and success, and the subscription made without a store; the subscription
        # made with one is a row, and the announcer heard of both limits.
        throttle = client.get_workflow_handle(credential_workflow_id(key))
        assert await signal_names(throttle) == ["limited", "subscribe", "limited", "cleared"]
        assert await store.credential_subscribers(key) == ["c"]
        announcer = client.get_workflow_handle(credential_announcer_id(key))
        assert await signal_names(announcer) == ["limited", "limited"]

        # Unsubscribing: the store's row goes and the throttle hears nothing; a run the store does not know
        # subscribed to the throttle (before its worker had a store), so the throttle is told.
        for run_id in ("c", "b"):
            await env.run(
                with_store.signal_with_start,
                message(key, "unsubscribe", CredentialSubscription(run_id=run_id)),
            )
        assert await store.credential_subscribers(key) == []
        assert (await signal_names(throttle))[-1:] == ["unsubscribe"]
        assert len(await signal_names(throttle)) == 5
        for handle in (throttle, announcer):
            await handle.terminate("test over")
    finally:
        await store.close()


async def signal_names(handle: WorkflowHandle[object, object]) -> list[str]:
    return [
        e.workflow_execution_signaled_event_attributes.signal_name
        async for e in handle.fetch_history_events()
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]


async def test_an_announcement_tells_every_subscriber_but_the_reporters_and_forgets_the_gone(
    dev_server: DevServer, store_url: str
) -> None:
    client = await Client.connect(dev_server.target)
    store = await Store.open(store_url)
    queue = f"no-worker-{uuid.uuid4().hex[:8]}"  # the subscribers never run: their signals stay in history
    key = f"payments/key-{uuid.uuid4().hex[:8]}"
    env = ActivityEnvironment()
    activities = EntityActivities(client, queue, store, subscribers_page=3)  # 8 subscribers: three pages
    runs: dict[str, WorkflowHandle[object, object]] = {}
    gone = ""
    try:
        for i in range(8):
            workflow_id = f"run/{key}/{i}"
            runs[workflow_id] = await client.start_workflow(
                "RunWorkflow", AnnouncerState(key=key), id=workflow_id, task_queue=queue
            )
            assert (
                await env.run(
                    activities.signal_with_start,
                    message(key, "subscribe", CredentialSubscription(run_id=workflow_id)),
                )
                is None
            ), "not limited yet"
        ids = sorted(runs)
        reporter, earlier_reporter, gone = ids[0], ids[1], ids[2]
        await runs[gone].terminate("closed without unsubscribing")
        until = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=10)
        for at in (until - timedelta(minutes=1), until):  # the earlier reporter's limit, then the reporter's
            await store.record_credential_limit(key, at)

        announcement = LimitAnnouncement(
            key=key,
            reporters=[
                CredentialLimit(run_id=reporter, until=until),
                CredentialLimit(run_id=earlier_reporter, until=until - timedelta(minutes=1)),
            ],
        )
        assert await env.run(activities.announce_credential_limit, announcement) == 8

        for workflow_id, handle in runs.items():
            told = [
                e.workflow_execution_signaled_event_attributes
                async for e in handle.fetch_history_events()
                if e.HasField("workflow_execution_signaled_event_attributes")
            ]
            if workflow_id in (reporter, gone):
                assert told == [], f"{workflow_id} knew of the limit already or is gone"
                continue
            assert [t.signal_name for t in told] == [CREDENTIAL_THROTTLED], workflow_id
            (notice,) = await client.data_converter.decode(told[0].input.payloads, [ThrottleNotice])
            # The store's limit, the latest: the earlier reporter hears of the later one.
            assert notice == ThrottleNotice(key=key, until=until, strikes=2), workflow_id
        assert gone not in await store.credential_subscribers(key), "a closed run's row is forgotten"
        assert len(await store.credential_subscribers(key)) == 7

        # A limit that is over by the time it is announced stops no one.
        await store.clear_credential_strikes(key)
        past = f"payments/over-{uuid.uuid4().hex[:8]}"
        await store.record_credential_limit(past, datetime.now(UTC) - timedelta(seconds=1))
        await store.subscribe_to_credential(past, ids[3])
        assert await env.run(activities.announce_credential_limit, LimitAnnouncement(key=past)) == 0
    finally:
        for workflow_id, handle in runs.items():
            if workflow_id != gone:
                await handle.terminate("test over")
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


async def test_the_announcer_tells_subscribers_of_each_limit_and_renews_itself_carrying_the_rest(
    dev_server: DevServer, sqlite_url: str
) -> None:
    """The announcer workflow on a real worker with a store: limits reported in a row are announced, the
    subscribers hear of them, and past `signals_per_run` it continues as new without losing a report."""
    client = await Client.connect(dev_server.target)
    store = await Store.open(sqlite_url)
    queue = f"announcer-{uuid.uuid4().hex[:8]}"
    key = f"payments/key-{uuid.uuid4().hex[:8]}"
    subscribers = [f"run/{key}/{i}" for i in range(3)]
    handles = [
        await client.start_workflow("RunWorkflow", AnnouncerState(key=key), id=w, task_queue=f"{queue}-runs")
        for w in subscribers
    ]
    for workflow_id in subscribers:
        await store.subscribe_to_credential(key, workflow_id)
    announcer = client.get_workflow_handle(credential_announcer_id(key))
    try:
        sealer = Sealer(secrets.token_bytes(32))  # the worker's and the bridge's key: the messages are proven
        worker = build_worker(
            client, queue, workflows=[CredentialAnnouncerWorkflow], store=store, sealer=sealer
        )
        reporter = with_signing(
            client, sealer, Signing(Sender.WORKER, "run/reporter")
        )  # as its signal_with_start
        async with worker:
            first = None
            for minutes in (10, 20, 30):  # three limits, each later: each is announced (or coalesced)
                until = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=minutes)
                await store.record_credential_limit(key, until)
                started = await reporter.start_workflow(
                    "CredentialAnnouncer",
                    AnnouncerState(key=key, signals_per_run=2),
                    id=credential_announcer_id(key),
                    task_queue=queue,
                    start_signal="limited",
                    start_signal_args=[CredentialLimit(run_id="run/reporter", until=until)],
                )
                first = first or started.result_run_id

            async def last_notice(handle: WorkflowHandle[object, object]) -> ThrottleNotice | None:
                told = [
                    e.workflow_execution_signaled_event_attributes
                    async for e in handle.fetch_history_events()
                    if e.HasField("workflow_execution_signaled_event_attributes")
                ]
                if not told:
                    return None
                (signed,) = await client.data_converter.decode(told[-1].input.payloads, [dict])
                assert signed["ksquadProof"]["by"] == "worker", (
                    "the announcer's notice carries the worker's proof"
                )
                return ThrottleNotice.model_validate(signed["body"])

            # The subscribers hear of the limit from the announcement's activity, and the announcer continues as
            # new in its next workflow task, after it: wait for both.
            for _ in range(600):
                notices = [await last_notice(h) for h in handles]
                renewed = (await announcer.describe()).run_id != first
                if renewed and all(n is not None and n.until == until for n in notices):
                    break
                await asyncio.sleep(0.05)
            assert all(n is not None and n.until == until and n.strikes == 3 for n in notices), notices
            assert renewed, "past 2 signals it continued as new"
            failed = [
                e
                async for e in announcer.fetch_history_events()
                if e.HasField("workflow_task_failed_event_attributes")
            ]
            assert not failed
    finally:
        for handle in [*handles, announcer]:
            await handle.terminate("test over")
        await store.close()
