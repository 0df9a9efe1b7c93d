"""The entity workflows stay under the server's per-execution signal limit (found by bench.paused: a throttle
that 10,000 runs subscribed to refused the 10,001st signal): after `signals_per_run` signals they continue as
new, carrying their whole state.

Runs message the entities through the worker's signal_with_start activity, which signs each message as the worker
on behalf of its run (temporal_client.proofs): the tests send theirs so, with `as_run`."""

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from temporal_client.proofs import Signing, signing_as
from tests.workflows.world import World
from workflows.activity_types import WORKER_TASK_QUEUE
from workflows.entity_types import (
    THROTTLED_UNTIL_MEMO,
    CredentialLimit,
    CredentialState,
    CredentialSubscription,
    GateState,
    SlotRequest,
)
from workflows.inbox import Sender


def as_run(run_id: str) -> contextlib.AbstractContextManager[None]:
    """Signals sent in this context go as the worker's activity for the run `run_id` sends them."""
    return signing_as(Signing(Sender.WORKER, run_id))


async def send(
    client: Client, run_id: str, workflow: str, workflow_id: str, state: object, signal: str, arg: object
) -> WorkflowHandle[object, object]:
    """What the signal_with_start activity does for the run `run_id`: signal-with-start the entity, as the run's
    worker."""
    with as_run(run_id):
        return await client.start_workflow(
            workflow,
            state,
            id=workflow_id,
            task_queue=WORKER_TASK_QUEUE,
            start_signal=signal,
            start_signal_args=[arg],
        )


async def continued_as_new(handle: WorkflowHandle[object, object], first: str | None) -> bool:
    """The entity moves to a new run shortly after its budget is spent (when its loop next wakes)."""
    for _ in range(100):
        if (await handle.describe()).run_id != first:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_credential_throttle_continues_as_new_before_the_signal_limit_and_keeps_its_subscribers(
    client: Client, world: World
) -> None:
    workflow_id = f"credential/ns/{uuid.uuid4().hex[:8]}"
    first = None
    for i in range(12):
        state = CredentialState(key=workflow_id.split("/", 1)[1], signals_per_run=5)
        subscription = CredentialSubscription(run_id=f"ns/run-{i}")
        handle = await send(
            client, f"ns/run-{i}", "CredentialThrottle", workflow_id, state, "subscribe", subscription
        )
        first = first or handle.result_run_id
    handle = client.get_workflow_handle(workflow_id)
    try:
        assert await continued_as_new(handle, first), "it continued as new"
        state = await handle.query("state_query", result_type=CredentialState)
        assert state.subscribers == [f"ns/run-{i}" for i in range(12)]
    finally:  # its subscribers name no workflow: nothing would ever end it on the shared test server
        await handle.terminate("test over")


async def test_a_gate_continues_as_new_before_the_signal_limit_and_keeps_holders_and_queue(
    client: Client, world: World
) -> None:
    workflow_id = f"gate/team/ns/{uuid.uuid4().hex[:8]}"
    first = None
    for i in range(12):
        state = GateState(scope=workflow_id.split("/", 1)[1], signals_per_run=5)
        request = SlotRequest(run_id=f"ns/run-{i}", limit=3)
        handle = await send(client, f"ns/run-{i}", "ConcurrencyGate", workflow_id, state, "acquire", request)
        first = first or handle.result_run_id
    handle = client.get_workflow_handle(workflow_id)
    try:
        assert await continued_as_new(handle, first), "it continued as new"
        state = await handle.query("state_query", result_type=GateState)
        # These run ids name no workflow, so the gate finds each grantee gone and passes its slot on: what must
        # hold across the continue-as-new is the limit and the order.
        assert len(state.holders) <= 3
        everyone = [f"ns/run-{i}" for i in range(12)]
        assert state.holders + state.waiting == sorted(state.holders + state.waiting, key=everyone.index)
    finally:
        await handle.terminate("test over")


async def test_a_limit_with_thousands_of_subscribers_is_told_in_batches_under_the_servers_limit(
    client: Client, world: World
) -> None:
    """The server refuses more than 2,000 signals in flight from one workflow: a throttle with 2,100 subscribers
    when a limit comes sends its notices in batches (these subscribers are gone, so each notice comes back
    undeliverable and the subscriber is dropped: all 2,100 answered)."""
    workflow_id = f"credential/ns/{uuid.uuid4().hex[:8]}"
    subscribers = [f"ns/gone-{i}" for i in range(2100)]
    key = workflow_id.split("/", 1)[1]
    handle = client.get_workflow_handle(workflow_id)

    async def subscribe(run_id: str) -> None:
        state = CredentialState(key=key, signals_per_run=5000)
        subscription = CredentialSubscription(run_id=run_id)
        await send(client, run_id, "CredentialThrottle", workflow_id, state, "subscribe", subscription)

    # The first alone: signal-with-starts racing to create one workflow can be answered "already started" by the
    # server (the worker's activity retries it; this test sends them bare), so the throttle exists before the rest.
    await subscribe(subscribers[0])
    for start in range(1, len(subscribers), 100):
        await asyncio.gather(*(subscribe(r) for r in subscribers[start : start + 100]))
    with as_run("ns/reporter"):
        limit = CredentialLimit(run_id="ns/reporter", until=datetime.now(UTC) + timedelta(hours=1))
        await handle.signal("limited", limit)
    try:
        deadline = time.monotonic() + 120
        state = CredentialState(key="", subscribers=subscribers)
        while state.subscribers and time.monotonic() < deadline:
            try:
                state = await handle.query(
                    "state_query", result_type=CredentialState, rpc_timeout=timedelta(seconds=10)
                )
            except RPCError as err:  # a query waits for the task sending a batch; a busy CI machine is slow
                if err.status != RPCStatusCode.DEADLINE_EXCEEDED and "Timeout expired" not in err.message:
                    raise
            await asyncio.sleep(0.1)
        assert state.subscribers == [], f"{len(state.subscribers)} subscribers never told"
        failed = [
            e
            async for e in handle.fetch_history_events()
            if e.HasField("workflow_task_failed_event_attributes")
        ]
        assert not failed, failed[0].workflow_task_failed_event_attributes.failure.message
    finally:
        await handle.terminate("test over")


async def test_a_limit_survives_the_throttles_continue_as_new_in_its_memo(
    client: Client, world: World
) -> None:
    """Found by bench.paused: after the throttle renewed itself its memo was empty, so runs subscribing later
    did not learn of the limit before their first call."""
    workflow_id = f"credential/ns/{uuid.uuid4().hex[:8]}"
    until = datetime.now(UTC) + timedelta(hours=1)
    state = CredentialState(key=workflow_id.split("/", 1)[1], signals_per_run=3)
    limit = CredentialLimit(run_id="ns/reporter", until=until)
    handle = await send(client, "ns/reporter", "CredentialThrottle", workflow_id, state, "limited", limit)
    first = handle.result_run_id
    try:
        for i in range(4):  # they know the limit already: nothing to send them, only signals to count
            with as_run(f"ns/r-{i}"):
                subscription = CredentialSubscription(run_id=f"ns/r-{i}", known_until=until)
                await handle.signal("subscribe", subscription)
        assert await continued_as_new(client.get_workflow_handle(workflow_id), first)
        memo = await (await client.get_workflow_handle(workflow_id).describe()).memo()
        assert datetime.fromisoformat(memo[THROTTLED_UNTIL_MEMO]) == until
    finally:
        await client.get_workflow_handle(workflow_id).terminate("test over")
