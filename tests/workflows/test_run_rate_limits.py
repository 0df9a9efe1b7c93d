"""Rate limits: fallback model, pause until Retry-After (seconds or HTTP-date), backoff, re-route, and
throttling shared per credential."""

from datetime import timedelta
from typing import Any

from temporalio.client import Client

from tests.workflows.world import World, agent, block, ok, rate_limited, run_input, start_run
from workflows.activity_types import Activity
from workflows.status import PauseReason, Phase, RunStatus


def paused_statuses(world: World, run: str) -> list[RunStatus]:
    return [s for s in world.mirrored.get(run, []) if s.phase == Phase.PAUSED]


async def test_fallback_model_switches_mid_run_without_pausing(client: Client, world: World) -> None:
    world.agents["dev-1"] = agent("dev-1", "dev-1-key", fallback=("small-model", "small-key"))
    world.scripts["r"] = [rate_limited("120"), ok()]
    status = await (await start_run(client, run_input("r"))).result()
    assert status.phase == Phase.SUCCEEDED
    first, second = world.calls_of(Activity.INVOKE_AGENT, "r")
    assert (first.detail["model"], second.detail["model"]) == ("dev-1-model", "small-model")
    assert second.detail["message_id"] == "uid-r-a1-t1", "same attempt, same sandbox, a new message"
    assert (second.at - first.at) < timedelta(seconds=5), "no pause"
    assert not paused_statuses(world, "r")
    assert status.model == "small-model"
    assert len(world.calls_of(Activity.ACQUIRE_SANDBOX, "r")) == 1


async def test_the_projects_fallback_model_follows_the_agents_own_then_the_run_pauses(
    client: Client, world: World
) -> None:
    world.agents["dev-1"] = agent(
        "dev-1",
        "dev-1-key",
        fallback=("small-model", "small-key"),
        project_fallback=("pool-model", "pool-key"),
    )
    world.scripts["r"] = [rate_limited("120"), rate_limited("120"), ok()]
    status = await (await start_run(client, run_input("r"))).result()
    assert status.phase == Phase.SUCCEEDED and status.model == "pool-model"
    calls = world.calls_of(Activity.INVOKE_AGENT, "r")
    assert [c.detail["model"] for c in calls] == ["dev-1-model", "small-model", "pool-model"]
    assert not paused_statuses(world, "r"), "each limit moved the run on, none paused it"

    # An Agent without a fallback goes to the Project's first; once that is limited too, the run pauses.
    world.agents["dev-2"] = agent("dev-2", "dev-2-key", project_fallback=("pool-model", "pool-key"))
    world.scripts["s"] = [rate_limited("120"), rate_limited("120"), ok()]
    status = await (await start_run(client, run_input("s", agents=["dev-2"]))).result()
    assert status.phase == Phase.SUCCEEDED
    calls = world.calls_of(Activity.INVOKE_AGENT, "s")
    assert [c.detail["model"] for c in calls] == ["dev-2-model", "pool-model", "pool-model"]
    assert len({s.resume_at for s in paused_statuses(world, "s")}) == 1, "paused once, on the Project's limit"


async def test_retry_after_seconds_pauses_until_resume_at_with_no_calls_meanwhile(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [rate_limited("120"), ok()]
    handle = await start_run(client, run_input("r", work_item_ref="wi-1"))
    status = await handle.result()
    assert status.phase == Phase.SUCCEEDED
    first, second = world.calls_of(Activity.INVOKE_AGENT, "r")
    (paused,) = {s.resume_at: s for s in paused_statuses(world, "r")}.values()
    assert paused.pause_reason == PauseReason.RATE_LIMITED
    assert paused.resume_at is not None
    limited_at = (paused.resume_at - first.at).total_seconds()
    assert 120 <= limited_at < 122, f"resumeAt = 429 time + 120 s, got +{limited_at}"
    assert second.at >= paused.resume_at, "no agent call during the pause"
    assert (second.at - paused.resume_at) < timedelta(seconds=5), "resumed at resumeAt"
    meanwhile = [
        c.activity for c in world.calls if c.run == "r" and not c.local and first.at < c.at < paused.resume_at
    ]
    assert meanwhile == ["release_sandbox", "renew_claim"], (
        "only the pause's own setup: the sandbox goes, the claim stays"
    )
    renew = world.calls_of(Activity.RENEW_CLAIM, "r")
    assert renew, "the claim is held through the pause"
    assert renew[0].detail["lease"] >= 120
    assert [c.detail["sandbox"] for c in world.calls_of(Activity.ACQUIRE_SANDBOX, "r")] == [
        "r-exec-1",
        "r-exec-2",
    ]


async def test_retry_after_http_date_pauses_for_the_same_span(client: Client, world: World) -> None:
    world.scripts["r"] = [rate_limited(retry_after_date=90), ok()]
    status = await (await start_run(client, run_input("r"))).result()
    assert status.phase == Phase.SUCCEEDED
    first, second = world.calls_of(Activity.INVOKE_AGENT, "r")
    (paused,) = {s.resume_at: s for s in paused_statuses(world, "r")}.values()
    assert paused.resume_at is not None
    assert 90 <= (paused.resume_at - first.at).total_seconds() < 92
    assert second.at >= paused.resume_at


async def test_without_retry_after_the_pause_is_jittered_backoff_within_bounds(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [rate_limited(), rate_limited(), ok()]
    status = await (await start_run(client, run_input("r"))).result()
    assert status.phase == Phase.SUCCEEDED
    calls = world.calls_of(Activity.INVOKE_AGENT, "r")
    pauses = sorted({s.resume_at for s in paused_statuses(world, "r") if s.resume_at})
    assert len(pauses) == 2
    first = (pauses[0] - calls[0].at).total_seconds()
    second = (pauses[1] - calls[1].at).total_seconds()
    assert 5 <= first <= 11, f"strike 1: d = 10 s, equal jitter in [5, 10], got {first}"
    assert 10 <= second <= 21, f"strike 2: d = 20 s, equal jitter in [10, 20], got {second}"


async def test_repeated_limits_reroute_to_the_next_eligible_agent(client: Client, world: World) -> None:
    world.agents["dev-2"] = agent("dev-2", "dev-2-key")
    world.scripts["r"] = [rate_limited("10"), rate_limited("10"), rate_limited("10"), ok()]
    status = await (
        await start_run(client, run_input("r", agents=["dev-1", "dev-2"], work_item_ref="wi-3"))
    ).result()
    assert status.phase == Phase.SUCCEEDED
    assert [c.detail["agent"] for c in world.calls_of(Activity.INVOKE_AGENT, "r")] == ["dev-1"] * 3 + [
        "dev-2"
    ]
    assert status.agent == "dev-2"
    rerouted = [e for e in world.events["r"] if e.reason == "Rerouted"]
    assert rerouted
    assert "re-routed to dev-2 after 3 limits in a row" in (rerouted[0].message or "")
    order = world.order("r")
    third = [i for i, a in enumerate(order) if a == "invoke_agent"][2]
    assert order[third + 1 : third + 4] == ["fence_work_item", "release_sandbox", "release_work_item"], (
        "re-routing releases the fenced claim before re-dispatching"
    )


async def test_a_very_long_retry_after_is_capped_and_rerouted(client: Client, world: World) -> None:
    world.agents["dev-2"] = agent("dev-2", "dev-2-key")
    world.scripts["r"] = [rate_limited(str(3 * 86400)), ok()]
    status = await (await start_run(client, run_input("r", agents=["dev-1", "dev-2"]))).result()
    assert status.phase == Phase.SUCCEEDED
    assert [c.detail["agent"] for c in world.calls_of(Activity.INVOKE_AGENT, "r")] == ["dev-1", "dev-2"]
    assert not paused_statuses(world, "r")


async def test_a_rerouted_run_leaves_its_limit_on_the_credential_for_the_next_run(
    client: Client, world: World
) -> None:
    # A re-route used to tell the credential's throttle that the limit ended at once: the next run on it called
    # the provider that had said "3 days", got its own 429, and only then paused.
    world.agents["dev-2"] = agent("dev-2", "dev-2-key")
    world.scripts["r"] = [rate_limited(str(3 * 86400)), ok()]
    world.scripts["next"] = [ok()]
    rerouted = await start_run(client, run_input("r", agents=["dev-1", "dev-2"]))
    # Real time from here (the test server skips time only while a result is awaited): the limit is not over.
    await world.until("r to re-route", lambda: any(e.reason == "Rerouted" for e in world.events.get("r", [])))
    limited_at = world.calls_of(Activity.INVOKE_AGENT, "r")[0].at
    handle = await start_run(client, run_input("next", agents=["dev-1"]))
    paused = await world.until_phase("next", "Paused")
    assert paused.resume_at is not None
    assert 3600 <= (paused.resume_at - limited_at).total_seconds() < 3602, "the capped limit, not now"
    assert not world.calls_of(Activity.INVOKE_AGENT, "next"), "no call to a provider that said 3 days"
    assert (await rerouted.result()).phase == Phase.SUCCEEDED
    await handle.cancel()


async def test_a_very_long_retry_after_with_nowhere_to_go_pauses_for_the_cap(
    client: Client, world: World
) -> None:
    world.scripts["r"] = [rate_limited(str(3 * 86400)), ok()]
    handle = await start_run(client, run_input("r"))
    paused = await world.until_phase("r", "Paused")
    first = world.calls_of(Activity.INVOKE_AGENT, "r")[0]
    assert paused.resume_at is not None
    assert 3600 <= (paused.resume_at - first.at).total_seconds() < 3602
    assert (await handle.result()).phase == Phase.SUCCEEDED


async def test_a_credential_that_always_says_429_ends_the_run_after_rate_limited_seconds(
    client: Client, world: World
) -> None:
    # Each pause is capped at an hour; without a bound over all of them, a run stayed alive forever.
    world.scripts["r"] = [rate_limited("3600")] * 10 + [ok()]
    status = await (await start_run(client, run_input("r", timeouts={"rateLimitedSeconds": 7200}))).result()
    assert (status.phase, status.reason) == (Phase.FAILED, "RateLimitedTimeout")
    assert "timeouts.rateLimitedSeconds (7200s)" in (status.message or "")
    calls = world.calls_of(Activity.INVOKE_AGENT, "r")
    assert len(calls) == 3, "a call, an hour's pause, a call, the last hour, a call: nothing left to wait"
    ended = world.last("r")
    assert ended is not None and ended.last_transition_time is not None
    assert 7200 <= (ended.last_transition_time - calls[0].at).total_seconds() < 7300


async def test_runs_sharing_a_credential_pause_together_others_keep_running(
    client: Client, world: World
) -> None:
    world.agents["dev-b"] = agent("dev-b", "shared-key")
    world.agents["dev-a"] = agent("dev-a", "shared-key")
    world.agents["dev-c"] = agent("dev-c", "other-key")
    world.scripts["b"] = [block(), ok()]
    world.scripts["c"] = [block()]
    world.scripts["a"] = [rate_limited("120"), ok()]
    b = await start_run(client, run_input("b", agents=["dev-b"]))
    c = await start_run(client, run_input("c", agents=["dev-c"]))
    await world.wait_entered(Activity.INVOKE_AGENT, "b")
    await world.wait_entered(Activity.INVOKE_AGENT, "c")
    a = await start_run(client, run_input("a", agents=["dev-a"]))

    paused_a = await world.until_phase("a", "Paused")
    paused_b = await world.until_phase("b", "Paused")
    assert paused_b.pause_reason == PauseReason.RATE_LIMITED
    assert paused_a.resume_at is not None and paused_b.resume_at is not None
    assert timedelta(0) <= paused_b.resume_at - paused_a.resume_at <= timedelta(seconds=0.1), (
        "one 429 pauses every run on the credential until its resumeAt (b's place in the ramp: at most 0.1 s on)"
    )
    assert "shared-key" in (paused_b.message or "")
    assert world.cancelled == ["task-uid-b-a1"], "b's in-flight call was stopped, c's was not"
    assert world.last("c").phase == Phase.RUNNING  # type: ignore[union-attr]

    world.release("c")  # c finishes while a and b are still paused
    assert (await c.result()).phase == Phase.SUCCEEDED
    assert world.last("a").phase == Phase.PAUSED  # type: ignore[union-attr]
    assert world.last("b").phase == Phase.PAUSED  # type: ignore[union-attr]

    assert (await a.result()).phase == Phase.SUCCEEDED
    assert (await b.result()).phase == Phase.SUCCEEDED
    resume_at = paused_a.resume_at
    assert resume_at is not None
    for run in ("a", "b"):
        calls = world.calls_of(Activity.INVOKE_AGENT, run)
        assert len(calls) == 2
        assert calls[1].at >= resume_at, f"{run} made no call before resumeAt"


async def test_a_run_starting_while_its_credential_is_limited_pauses_before_its_first_call(
    client: Client, world: World
) -> None:
    world.agents["dev-a"] = agent("dev-a", "shared-key")
    world.agents["dev-late"] = agent("dev-late", "shared-key")
    world.scripts["a"] = [rate_limited("600"), ok()]
    world.scripts["late"] = [ok()]
    a = await start_run(client, run_input("a", agents=["dev-a"]))
    paused_a = await world.until_phase("a", "Paused")

    late = await start_run(client, run_input("late", agents=["dev-late"]))
    paused_late = await world.until_phase("late", "Paused")
    assert paused_late.pause_reason == PauseReason.RATE_LIMITED
    assert paused_late.resume_at is not None and paused_a.resume_at is not None
    assert timedelta(0) <= paused_late.resume_at - paused_a.resume_at <= timedelta(seconds=0.1), (
        "it learns the limit when it subscribes"
    )
    assert paused_late.attempt == 0, "paused before its first attempt"
    assert not world.calls_of(Activity.INVOKE_AGENT, "late"), "no call while the credential is limited"
    assert not world.calls_of(Activity.ACQUIRE_SANDBOX, "late"), "and no sandbox"

    assert (await late.result()).phase == Phase.SUCCEEDED
    assert (await a.result()).phase == Phase.SUCCEEDED
    assert paused_a.resume_at is not None
    assert world.calls_of(Activity.INVOKE_AGENT, "late")[0].at >= paused_a.resume_at


async def test_runs_paused_by_one_limit_resume_one_by_one_at_the_endpoints_rate(
    client: Client, world: World
) -> None:
    """No stampede at resumeAt: each paused run takes its own place after the limit, resumePerSecond apart
    (here 0.5/s: 2 s); a run arriving during the limit queues behind them."""
    waiting = ["w1", "w2", "w3"]
    for run in ["limited", *waiting, "late"]:
        world.agents[f"dev-{run}"] = agent(f"dev-{run}", "ramp-key")
        world.agents[f"dev-{run}"].model.resume_per_second = 0.5
    handles = {}
    for run in waiting:
        world.scripts[run] = [block(), ok()]
        handles[run] = await start_run(client, run_input(run, agents=[f"dev-{run}"]))
        await world.wait_entered(Activity.INVOKE_AGENT, run)
    world.scripts["limited"] = [rate_limited("60"), ok()]
    handles["limited"] = await start_run(client, run_input("limited", agents=["dev-limited"]))
    until = (await world.until_phase("limited", "Paused")).resume_at
    assert until is not None

    def placed(runs: list[str]) -> bool:
        """Each run shows its own place (first Paused until the limit, then at its place)."""
        places = [
            s.resume_at if (s := world.last(r)) is not None and s.phase == Phase.PAUSED else None
            for r in runs
        ]
        return (
            sum(len(ramp) for ramp in world.resume_places.values()) >= len(runs)
            and None not in places
            and len(set(places)) == len(runs)
        )

    first = ["limited", *waiting]
    await world.until("the first four to take their places", lambda: placed(first), 20)
    places: dict[str, Any] = {r: world.last(r).resume_at for r in first}  # type: ignore[union-attr]
    assert sorted(places.values()) == [until + timedelta(seconds=2 * i) for i in range(4)], "2 s apart"

    world.scripts["late"] = [ok()]
    handles["late"] = await start_run(client, run_input("late", agents=["dev-late"]))
    await world.until("late to take its place", lambda: placed([*first, "late"]), 20)
    late = world.last("late")
    assert late is not None and late.resume_at == until + timedelta(seconds=8), "behind the others"
    assert late.attempt == 0, "it paused before its first call"
    places["late"] = late.resume_at

    for run, handle in handles.items():
        assert (await handle.result()).phase == Phase.SUCCEEDED, run
    for run, place in places.items():
        assert place is not None
        assert world.calls_of(Activity.INVOKE_AGENT, run)[-1].at >= place, f"{run} called before its place"
    assert len(world.calls_of(Activity.INVOKE_AGENT, "late")) == 1, (
        "late made only the one call, after its place"
    )
