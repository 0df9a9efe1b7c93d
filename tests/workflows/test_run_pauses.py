"""Paused runs: CredentialExpired, InputRequired and Manual pauses wait for their signal, or fail in time."""

from temporalio.client import Client

from tests.workflows.world import Outcome, World, block, ok, rate_limited, run_input, start_run
from workflows.activity_types import Activity
from workflows.status import PauseReason, Phase


async def test_credential_expired_waits_then_resumes_the_same_task_on_refresh(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [Outcome("credential_expired", message="401 from the model: key revoked"), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    paused = await world.until_phase("r", "Paused")
    assert paused.pause_reason == PauseReason.CREDENTIAL_EXPIRED
    assert "key revoked" in (paused.message or "")
    assert world.sandboxes == {"r-exec-1"}, "the sandbox and its task wait for the credential"
    await handle.signal("credential_refreshed", "ksquad-system/dev-1-key")
    status = await handle.result()
    assert status.phase == Phase.SUCCEEDED
    _first, second = world.calls_of(Activity.INVOKE_AGENT, "r")
    assert second.detail["follow_up"] == {"taskId": "task-uid-r-a1", "contextId": "uid-r-a1", "text": ""}
    assert second.detail["message_id"] == "uid-r-a1-t1"
    assert status.attempt == 1
    assert status.retries == 0


async def test_credential_expired_fails_after_paused_seconds(client: Client, world: World) -> None:
    world.scripts["r"] = [Outcome("credential_expired")]
    status = await (await start_run(client, run_input("r", timeouts={"pausedSeconds": 600}))).result()
    assert status.phase == Phase.FAILED
    assert status.reason == "CredentialExpiredTimeout"
    assert "no `credential_refreshed` signal within timeouts.pausedSeconds (600s)" in (status.message or "")
    assert not world.sandboxes


async def test_input_required_resumes_with_the_input(client: Client, world: World) -> None:
    world.scripts["r"] = [Outcome("input_required", message="Which test is flaky?"), ok()]
    handle = await start_run(client, run_input("r"))
    paused = await world.until_phase("r", "Paused")
    assert (paused.pause_reason, paused.message) == (PauseReason.INPUT_REQUIRED, "Which test is flaky?")
    await handle.signal("input", "test_payment_retry")
    assert (await handle.result()).phase == Phase.SUCCEEDED
    follow_up = world.calls_of(Activity.INVOKE_AGENT, "r")[1].detail["follow_up"]
    assert follow_up == {"taskId": "task-uid-r-a1", "contextId": "uid-r-a1", "text": "test_payment_retry"}


async def test_manual_pause_stops_the_agent_keeps_the_claim_and_resume_starts_a_new_attempt(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [block(), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    await handle.signal("pause", "maintenance")
    paused = await world.until_phase("r", "Paused")
    assert paused.pause_reason == PauseReason.MANUAL
    assert paused.message == "maintenance", "the pause's reason is shown"
    assert world.cancelled == ["task-uid-r-a1"]
    assert not world.sandboxes
    assert world.claims["wi-1"][0] == "r", "the claim is kept through the pause"
    assert world.calls_of(Activity.FENCE_WORK_ITEM, "r"), "the stopped agent's writes are fenced off"
    await handle.signal("resume")
    status = await handle.result()
    assert (status.phase, status.attempt, status.retries) == (Phase.SUCCEEDED, 2, 0)


async def test_manual_pause_ends_in_failure_after_paused_seconds(client: Client, world: World) -> None:
    world.scripts["r"] = [block()]
    handle = await start_run(client, run_input("r", timeouts={"pausedSeconds": 300}))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    await handle.signal("pause")
    await world.until_phase("r", "Paused")
    status = await handle.result()
    assert (status.phase, status.reason) == (Phase.FAILED, "ManualTimeout")


async def test_a_pause_while_rate_limited_takes_over_and_the_limit_still_holds_after_resume(
    client: Client, world: World
) -> None:
    # A pause sent to a run already paused (here by a rate limit) was dropped: the run resumed at resumeAt.
    world.scripts["r"] = [rate_limited("600"), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    limited = await world.until_phase("r", "Paused")
    assert limited.pause_reason == PauseReason.RATE_LIMITED
    await handle.signal("pause", "hold it")
    await world.until(
        "a manual pause", lambda: (s := world.last("r")) is not None and s.pause_reason == PauseReason.MANUAL
    )
    held = world.last("r")
    assert held is not None and (held.reason, held.message) == ("Manual", "hold it")
    await handle.signal("resume")
    await world.until(
        "the limit again",
        lambda: (
            (s := world.last("r")) is not None
            and s.pause_reason == PauseReason.RATE_LIMITED
            and s.revision > held.revision
        ),
    )
    again = world.last("r")
    assert again is not None and again.resume_at == limited.resume_at, "the limit is not forgotten"
    assert (await handle.result()).phase == Phase.SUCCEEDED
    _first, second = world.calls_of(Activity.INVOKE_AGENT, "r")
    assert limited.resume_at is not None and second.at >= limited.resume_at


async def test_a_pause_while_waiting_for_input_holds_the_run_and_the_task_goes_on_after_resume(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [Outcome("input_required", message="Which test is flaky?"), ok()]
    handle = await start_run(client, run_input("r"))
    await world.until_phase("r", "Paused")
    await handle.signal("pause", "not now")
    await world.until(
        "a manual pause", lambda: (s := world.last("r")) is not None and s.pause_reason == PauseReason.MANUAL
    )
    await handle.signal("input", "test_payment_retry")  # arrives while held: kept for after the resume
    await handle.signal("resume")
    status = await handle.result()
    assert (status.phase, status.attempt) == (Phase.SUCCEEDED, 1), "the same task, not a new attempt"
    follow_up = world.calls_of(Activity.INVOKE_AGENT, "r")[1].detail["follow_up"]
    assert follow_up == {"taskId": "task-uid-r-a1", "contextId": "uid-r-a1", "text": "test_payment_retry"}
    assert "Manual" in [e.reason for e in world.events["r"]]
