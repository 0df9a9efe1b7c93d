"""RunWorkflow's lifecycle on the time-skipping test server: success, retries, failures, timeouts, references."""

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from tests.workflows.world import World, block, failed, hang, ok, run_input, start_run
from workflows.activity_types import Activity
from workflows.status import ConditionType, Phase


async def test_happy_path_claims_runs_publishes_and_releases(client: Client, world: World) -> None:
    world.scripts["fix-flaky-tests"] = [ok(summary="stabilized")]
    handle = await start_run(client, run_input("fix-flaky-tests", work_item_ref="wi-8123"))
    status = await handle.result()
    assert status.phase == Phase.SUCCEEDED
    assert status.outputs == {"summary": "stabilized"}
    assert status.attempt == 1
    assert status.retries == 0
    assert status.triggered_by == "alice@example.com"
    assert world.order("fix-flaky-tests") == [
        "resolve_references",
        "claim_work_item",
        "acquire_sandbox",
        "invoke_agent",
        "publish_outputs",
        "release_sandbox",
        "release_work_item",
        "record_run_ending",  # on the item, as the orchestrator: every ending, once
    ]
    assert world.calls_of(Activity.RECORD_RUN_ENDING)[0].detail == {
        "phase": "Succeeded",
        "reason": "Succeeded",
    }
    assert not world.claims
    assert not world.sandboxes
    (call,) = world.calls_of(Activity.INVOKE_AGENT)
    assert call.detail["message_id"] == "uid-fix-flaky-tests-a1"
    mirrored = world.mirrored["fix-flaky-tests"]
    assert mirrored[-1].phase == Phase.SUCCEEDED
    assert [s.revision for s in mirrored] == sorted({s.revision for s in mirrored}), "revisions only go up"
    assert mirrored[-1].revision == status.revision
    events = world.events["fix-flaky-tests"]
    assert [e.revision for e in events] == list(range(1, status.revision + 1)), (
        "no change is lost to coalescing"
    )
    assert [e.phase for e in events][-3:] == [Phase.CLAIMING, Phase.RUNNING, Phase.SUCCEEDED]


async def test_agent_failure_retries_after_backoff_then_succeeds(client: Client, world: World) -> None:
    world.scripts["r"] = [failed("tests still flaky"), ok()]
    status = await (await start_run(client, run_input("r", work_item_ref="wi-1"))).result()
    assert (status.phase, status.attempt, status.retries) == (Phase.SUCCEEDED, 2, 1)
    invokes = world.calls_of(Activity.INVOKE_AGENT, "r")
    assert [c.detail["message_id"] for c in invokes] == ["uid-r-a1", "uid-r-a2"]
    failure, retry_claim = invokes[0], world.calls_of(Activity.CLAIM_WORK_ITEM, "r")[1]
    backoff = (retry_claim.at - failure.at).total_seconds()
    assert 5.0 <= backoff <= 11.0, f"first retry waits d/2..d of d=10s (plus activity time), waited {backoff}"
    backoff_status = next(s for s in world.mirrored["r"] if s.reason == "RetryBackoff")
    assert backoff_status.phase == Phase.PENDING
    assert "tests still flaky" in (backoff_status.message or "")
    assert backoff_status.resume_at is not None


async def test_the_retry_backoff_is_spread_at_random_over_half_to_all_of_its_delay(
    client: Client, world: World
) -> None:
    """Equal jitter is random per Run (the workflow's seeded random, so a replay repeats it): the first retries of
    many Runs that failed at once spread over [d/2, d] instead of all waiting the same (a thundering herd), and
    cover it: its lower and upper quarters both get some, and no two wait the same."""
    runs = [f"j{i}" for i in range(40)]
    for name in runs:
        world.scripts[name] = [failed("once"), ok()]
    handles = [await start_run(client, run_input(name)) for name in runs]
    delays = []
    for handle in handles:
        assert (await handle.result()).phase == Phase.SUCCEEDED
        timers = [
            e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
            async for e in handle.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
            and e.user_metadata.summary.data.decode().strip('"') == "backoff before retry 1"
        ]
        assert len(timers) == 1, timers
        delays.append(timers[0])
    d = 10.0  # the default backoffSeconds: the first retry's d
    spread = [(delay - d / 2) / (d / 2) for delay in delays]  # where in [d/2, d] each fell, 0..1
    assert all(0.0 <= x <= 1.0 for x in spread), delays
    assert len(set(delays)) == len(delays), f"two Runs waited the same: {sorted(delays)}"
    assert sum(x < 0.25 for x in spread) >= 2 and sum(x > 0.75 for x in spread) >= 2, sorted(spread)
    assert 0.3 < sum(spread) / len(spread) < 0.7, f"mean {sum(spread) / len(spread):.2f}: not uniform"


async def test_max_retries_exhausted_fails_the_run_after_two_retries_by_default(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [failed("boom 1"), failed("boom 2"), failed("boom 3"), ok()]
    status = await (await start_run(client, run_input("r"))).result()
    assert status.phase == Phase.FAILED
    assert status.reason == "AgentFailed"
    assert "boom 3" in (status.message or "")
    assert "after 2 retries" in (status.message or "")
    assert len(world.calls_of(Activity.INVOKE_AGENT, "r")) == 3
    assert not world.sandboxes
    # As a Job: Failed=True, never Complete (`kubectl wait --for=condition=Complete` succeeded on a failure).
    assert status.condition(ConditionType.COMPLETE) is None
    failed_condition = status.condition(ConditionType.FAILED)
    assert failed_condition is not None
    assert (failed_condition.status, failed_condition.reason) == ("True", "AgentFailed")


async def test_zero_retries_fails_at_the_first_failure(client: Client, world: World) -> None:
    world.scripts["r"] = [failed("no"), ok()]
    status = await (await start_run(client, run_input("r", retryPolicy={"maxRetries": 0}))).result()
    assert (status.phase, status.attempt) == (Phase.FAILED, 1)


async def test_sandbox_death_fences_before_releasing_then_retries(client: Client, world: World) -> None:
    world.scripts["r"] = [failed("connection refused", kind="lost"), ok()]
    status = await (await start_run(client, run_input("r", work_item_ref="wi-9"))).result()
    assert status.phase == Phase.SUCCEEDED
    order = world.order("r")
    first_invoke = order.index("invoke_agent")
    teardown = order[first_invoke + 1 : first_invoke + 4]
    assert teardown == ["fence_work_item", "release_sandbox", "release_work_item"], order
    (fence,) = world.calls_of(Activity.FENCE_WORK_ITEM, "r")
    first_claim, retry_claim = world.calls_of(Activity.CLAIM_WORK_ITEM, "r")
    assert first_claim.detail["fence"] < fence.detail["fence"] < retry_claim.detail["fence"]
    release = world.calls_of(Activity.RELEASE_SANDBOX, "r")[0]
    assert release.detail["confirm"] is True, "a dead holder's sandbox is confirmed gone before the retry"
    second_invoke = world.calls_of(Activity.INVOKE_AGENT, "r")[1]
    assert second_invoke.detail["fence"] == retry_claim.detail["fence"]


async def test_sandbox_that_cannot_start_is_a_failed_attempt(client: Client, world: World) -> None:
    world.sandbox_fails["r"] = 1
    status = await (await start_run(client, run_input("r"))).result()
    assert (status.phase, status.attempt, status.retries) == (Phase.SUCCEEDED, 2, 1)
    backoff = next(s for s in world.mirrored["r"] if s.reason == "RetryBackoff")
    assert "ImagePullBackOff" in (backoff.message or "")


async def test_a_sandbox_not_ready_within_claim_seconds_fails_the_attempt_saying_what_its_pod_waits_for(
    client: Client, world: World
) -> None:
    world.unschedulable.add("r")
    status = await (
        await start_run(client, run_input("r", timeouts={"claimSeconds": 3}, retryPolicy={"maxRetries": 0}))
    ).result()
    assert (status.phase, status.reason) == (Phase.FAILED, "ClaimTimeout"), status
    assert status.message == (
        "no sandbox within timeouts.claimSeconds (3s): pod r-exec-1-x cannot be scheduled: 0/1 nodes are available"
        " (after 0 retries)"
    )
    assert not world.calls_of(Activity.INVOKE_AGENT)


async def test_claim_timeout_fails_the_run_naming_the_holder(client: Client, world: World) -> None:
    world.claims["wi-held"] = ("someone-else", 7)
    world.fences["wi-held"] = 7
    status = await (
        await start_run(client, run_input("r", work_item_ref="wi-held", timeouts={"claimSeconds": 30}))
    ).result()
    assert status.phase == Phase.FAILED
    assert status.reason == "ClaimTimeout"
    assert "within timeouts.claimSeconds (30s)" in (status.message or "")
    assert world.claims["wi-held"] == ("someone-else", 7), "the other holder keeps its claim"
    assert not world.calls_of(Activity.INVOKE_AGENT)


async def test_run_timeout_stops_a_hung_agent_and_retries_then_fails(client: Client, world: World) -> None:
    world.scripts["r"] = [hang(), hang()]
    handle = await start_run(
        client, run_input("r", timeouts={"runSeconds": 2}, retryPolicy={"maxRetries": 1, "backoffSeconds": 1})
    )
    status = await handle.result()
    assert status.phase == Phase.FAILED
    assert status.reason == "RunTimeout"
    assert "timeouts.runSeconds (2s)" in (status.message or "")
    cancel_requests = [
        e
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
    ]
    assert len(cancel_requests) == 2, "each hung invocation was cancelled"
    assert len(world.calls_of(Activity.RELEASE_SANDBOX, "r")) == 2
    assert not world.sandboxes


async def test_missing_references_are_named_waited_for_and_picked_up(client: Client, world: World) -> None:
    world.missing["r"] = ["Agent ksquad-system/dev-1", "ModelEndpoint ksquad-system/gpt"]
    handle = await start_run(client, run_input("r"))
    await world.until("the missing objects to be named", lambda: "ModelEndpoint" in str(world.last("r")))
    pending = world.last("r")
    assert pending is not None
    assert pending.phase == Phase.PENDING
    condition = pending.condition(ConditionType.REFERENCES_RESOLVED)
    assert condition is not None
    assert condition.status == "False"
    assert "Agent ksquad-system/dev-1" in condition.message
    assert "ModelEndpoint ksquad-system/gpt" in condition.message
    del world.missing["r"]  # the objects are created
    await handle.signal("references_updated")
    status = await handle.result()
    assert status.phase == Phase.SUCCEEDED
    resolved = status.condition(ConditionType.REFERENCES_RESOLVED)
    assert resolved is not None
    assert resolved.status == "True"


async def test_waiting_for_the_same_missing_objects_says_so_once(client: Client, world: World) -> None:
    # Each look again moved the run to Pending (ReferencesMissing) anew: five identical Events in 20 s.
    world.missing["r"] = ["Agent ksquad-system/dev-1"]
    handle = await start_run(client, run_input("r"))
    await world.until(
        "four looks", lambda: len(world.calls_of(Activity.RESOLVE_REFERENCES, "r")) >= 4, within=30
    )
    missing = [e for e in world.events.get("r", []) if e.reason == "ReferencesMissing"]
    assert len(missing) == 1, [e.message for e in missing]
    world.missing["r"] = ["Agent ksquad-system/dev-1", "Skill ksquad-system/pytest"]  # another wait: said
    await world.until("the new wait", lambda: "Skill" in str(world.events.get("r", [])), within=30)
    del world.missing["r"]
    await handle.signal("references_updated")
    assert (await handle.result()).phase == Phase.SUCCEEDED


async def test_references_still_missing_after_claim_seconds_fail_the_run(
    client: Client, world: World
) -> None:
    world.missing["r"] = ["Agent ksquad-system/ghost"]
    status = await (await start_run(client, run_input("r", timeouts={"claimSeconds": 45}))).result()
    assert (status.phase, status.reason) == (Phase.FAILED, "ReferencesNotFound")
    assert status.message == "Agent ksquad-system/ghost not found within timeouts.claimSeconds (45s)"
    assert len(world.calls_of(Activity.RESOLVE_REFERENCES, "r")) >= 3, "it kept looking meanwhile"


async def test_invalid_references_fail_at_once(client: Client, world: World) -> None:
    world.invalid["r"] = "Agent dev-1 uses tool shell, which is not in its allowedTools"
    status = await (await start_run(client, run_input("r"))).result()
    assert (status.phase, status.reason) == (Phase.FAILED, "InvalidReferences")
    assert "allowedTools" in (status.message or "")
    assert len(world.calls_of(Activity.RESOLVE_REFERENCES, "r")) == 1


async def test_state_query_shows_the_running_phase(client: Client, world: World) -> None:
    world.scripts["r"] = [block()]
    handle = await start_run(client, run_input("r"))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    state = await handle.query("state")
    assert state["phase"] == "Running"
    assert state["agent"] == "dev-1"
    assert state["sandbox"] == {"name": "r-exec-1", "kind": "cold"}
    world.release("r")
    assert (await handle.result()).phase == Phase.SUCCEEDED


async def test_an_activity_that_fails_for_good_fails_the_run_with_the_reason_on_its_status(
    client: Client, world: World
) -> None:
    world.broken["r"] = "exceeded workflow execution limit for signal events"
    world.scripts["r"] = [ok()]
    status = await (await start_run(client, run_input("r"))).result()
    assert status.phase == Phase.FAILED
    assert status.reason == "InternalError"
    assert "exceeded workflow execution limit for signal events" in (status.message or "")
    last = world.last("r")
    assert last is not None and last.phase == Phase.FAILED, "the Run shows it, not its last phase before"


async def test_a_status_write_that_hangs_does_not_hold_the_next_status_back(
    client: Client, world: World
) -> None:
    # One mirror_status hung until its 30 s start-to-close timeout while the run went on to Succeeded: the
    # Run's status stood still that long. The latest status must get through within seconds.
    world.stalled_mirrors["r"] = 1
    await start_run(client, run_input("r"))
    await world.until_phase("r", "Succeeded", within=12)  # real time: the server skips none of it
    assert world.stalled_mirrors["r"] == 0, "one status write hung"
