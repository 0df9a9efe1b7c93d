"""Cancellation from every phase, by Temporal's cancel and by the `cancel` signal: teardown runs, nothing leaks."""

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from tests.workflows.world import Outcome, World, block, failed, hang, ok, rate_limited, run_input, start_run
from workflows.activity_types import Activity
from workflows.contract import ConcurrencyScope
from workflows.entity_types import GateState, ThrottleNotice, gate_workflow_id
from workflows.run import RunWorkflow
from workflows.signals import RunSignal
from workflows.status import Phase, RunStatus

SCOPE = ConcurrencyScope(key="team/ksquad-system/payments-squad", limit=1)
Setup = Callable[[Client, World], Awaitable[WorkflowHandle[RunWorkflow, RunStatus]]]


async def pending(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.missing["r"] = ["Agent ksquad-system/dev-1"]
    handle = await start_run(client, run_input("r"))
    await world.until("r to wait for references", lambda: "waiting for" in str(world.last("r")))
    return handle


async def queued(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.scopes["holder"] = world.scopes["r"] = [SCOPE]
    world.scripts["holder"] = [block()]
    await start_run(client, run_input("holder"))
    await world.wait_entered(Activity.INVOKE_AGENT, "holder")
    handle = await start_run(client, run_input("r"))
    await world.until_phase("r", "Queued")
    return handle


async def claiming(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.blocked_claims.add("r")
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    await world.wait_entered(Activity.CLAIM_WORK_ITEM, "r")
    return handle


async def running(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.scripts["r"] = [hang()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    return handle


async def rate_limited_pause(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.scripts["r"] = [rate_limited("3000"), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    await world.until_phase("r", "Paused")
    return handle


async def input_pause(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.scripts["r"] = [Outcome("input_required", message="which one?"), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    await world.until_phase("r", "Paused")
    return handle


async def manual_pause(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.scripts["r"] = [hang(), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    await handle.signal("pause")
    await world.until_phase("r", "Paused")
    return handle


async def retry_backoff(client: Client, world: World) -> WorkflowHandle[RunWorkflow, RunStatus]:
    world.scripts["r"] = [failed(), ok()]
    handle = await start_run(
        client,
        run_input("r", work_item_ref="wi-1", retryPolicy={"backoffSeconds": 600, "maxBackoffSeconds": 600}),
    )
    await world.until(
        "r to back off", lambda: (s := world.last("r")) is not None and s.reason == "RetryBackoff"
    )
    return handle


# What a Run holds in each phase (its work item's claim, its sandbox) when it is cancelled: the teardown checks
# below run for what it held, so a setup that lost either would skip them without saying so.
HOLDS: dict[str, tuple[bool, bool]] = {
    "Pending": (False, False),
    "Queued": (False, False),
    "Claiming": (False, False),  # the item is another Run's
    "Running": (True, True),
    "Paused(RateLimited)": (True, False),  # the item kept, the sandbox given back while the limit lasts
    "Paused(InputRequired)": (True, True),  # the agent waits in its sandbox for the answer
    "Paused(Manual)": (True, False),
    "Pending(RetryBackoff)": (False, False),  # fenced and released before the backoff
}

PHASES: dict[str, Setup] = {
    "Pending": pending,
    "Queued": queued,
    "Claiming": claiming,
    "Running": running,
    "Paused(RateLimited)": rate_limited_pause,
    "Paused(InputRequired)": input_pause,
    "Paused(Manual)": manual_pause,
    "Pending(RetryBackoff)": retry_backoff,
}


@pytest.mark.parametrize("how", ["temporal-cancel", "cancel-signal"])
@pytest.mark.parametrize("phase", list(PHASES))
async def test_cancel_from_every_phase_tears_down_and_leaks_nothing(
    client: Client, world: World, phase: str, how: str
) -> None:
    handle = await PHASES[phase](client, world)
    before = world.last("r")
    had_sandbox = bool(world.sandboxes - {"holder-exec-1"})
    had_claim = "wi-1" in world.claims
    assert (had_claim, had_sandbox) == HOLDS[phase], "what the Run holds in this phase"

    if how == "temporal-cancel":
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        assert isinstance(failure.value.cause, CancelledError)
        events = [e async for e in handle.fetch_history_events()]
        assert events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED
    else:
        await handle.signal("cancel", "no longer needed")
        status = await handle.result()
        assert status.phase == Phase.CANCELLED
        assert status.message == "no longer needed"

    final = await world.until_phase("r", "Cancelled")
    assert Phase.CANCELLING in [e.phase for e in world.events["r"]], f"cancelled from {before}"
    assert not (world.sandboxes - {"holder-exec-1"}), "no sandbox left behind"
    assert "wi-1" not in world.claims, "the claim is released"
    if had_sandbox:
        assert world.calls_of(Activity.RELEASE_SANDBOX, "r")[-1].detail["confirm"] is True
    if had_claim:
        order = world.order("r")
        assert order.index("fence_work_item", order.index("claim_work_item")) < order.index(
            "release_work_item"
        )
    if phase == "Running":
        assert world.cancelled == ["task-uid-r-a1"], "the agent's task was cancelled"
    if phase == "Queued":
        gate = await client.get_workflow_handle(gate_workflow_id(SCOPE.key)).query(
            "state_query", result_type=GateState
        )
        assert "ksquad-system/r" not in gate.holders + gate.waiting
        world.release("holder")
    assert final.phase == Phase.CANCELLED


async def test_a_temporal_cancel_while_another_runs_limit_stops_the_attempt_is_not_lost(
    client: Client, world: World
) -> None:
    # Another run's 429 on this run's credential stops its attempt; Temporal's cancel arrives while the agent's
    # task is still being stopped. It was swallowed with the task's own cancellation: the run retried instead.
    handle = await running(client, world)
    until = datetime.now(UTC) + timedelta(hours=1)
    notice = ThrottleNotice(key="ksquad-system/dev-1-key", until=until, strikes=1)
    await handle.signal(RunSignal.CREDENTIAL_THROTTLED, notice)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    final = await world.until_phase("r", "Cancelled")
    assert final.attempt == 1, "no new attempt after the cancel"
    assert "wi-1" not in world.claims and not world.sandboxes, "torn down"


async def test_a_temporal_cancel_while_a_manual_pause_renews_its_claim_cancels_the_run(
    client: Client, world: World
) -> None:
    # Paused(Manual) shows while the pause still renews the claim's lease. Temporal's cancel arriving then used to
    # cancel the renewal with it: the run ended Failed ("Activity cancelled") and its workflow Completed; and when
    # the renewal answered while the cancel's workflow task was in flight, the test server refused that task's
    # cancel of an activity already done (ACTIVITY_UNKNOWN) and the run hung. The renewal ends, then the cancel.
    world.slow_renewals["r"] = 1.0
    handle = await manual_pause(client, world)
    await world.wait_entered(Activity.RENEW_CLAIM, "r")
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await handle.result()
    assert isinstance(failure.value.cause, CancelledError)
    events = [e async for e in handle.fetch_history_events()]
    assert events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED
    renewal = next(
        e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == Activity.RENEW_CLAIM
    )
    assert renewal not in [
        e.activity_task_cancel_requested_event_attributes.scheduled_event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    ], "the renewal is not cancelled with the run"
    final = await world.until_phase("r", "Cancelled")
    assert final.reason == "Cancelled"
    order = world.order("r")
    renewed = order.index("renew_claim")
    assert renewed < order.index("fence_work_item", renewed) < order.index("release_work_item")
    assert "wi-1" not in world.claims and not world.sandboxes, "torn down"
