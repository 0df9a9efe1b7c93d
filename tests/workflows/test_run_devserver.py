"""RunWorkflow on Temporal's dev server, operated with the real temporal CLI: cancel, signal, list, query;
and continue-as-new when the server suggests it."""

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from dev.binaries import find_binary
from dev.devserver import DevServer
from tests.workflows.world import World, hang, ok, rate_limited, run_input, running_world_on, start_run
from workflows.activity_types import Activity
from workflows.status import Phase


async def temporal(server: DevServer, *args: str) -> subprocess.CompletedProcess[str]:
    """The temporal CLI, in a thread: the workers in this process must go on answering meanwhile."""
    done = await asyncio.to_thread(
        subprocess.run,
        [str(find_binary("temporal")), *args, "--address", server.target, "--namespace", "default"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"temporal {' '.join(args)}: {done.stderr}"
    return done


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
async def dev_client(dev_server: DevServer, world: World) -> AsyncIterator[Client]:
    async with running_world_on(dev_server.target, world) as client:
        yield client


@pytest.fixture
def ns() -> str:
    """A namespace of the test's own: run ids and credential keys never collide on the shared server."""
    return f"t-{uuid.uuid4().hex[:8]}"


async def test_temporal_workflow_cancel_cancels_a_running_run(
    dev_server: DevServer, dev_client: Client, world: World, ns: str
) -> None:
    world.scripts["cli-cancel"] = [hang()]
    handle = await start_run(dev_client, run_input("cli-cancel", namespace=ns, work_item_ref="wi-cli"))
    await world.wait_entered(Activity.INVOKE_AGENT, "cli-cancel")
    await temporal(dev_server, "workflow", "cancel", "-w", f"{ns}/cli-cancel")
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert world.last("cli-cancel").phase == Phase.CANCELLED  # type: ignore[union-attr]
    description = await handle.describe()
    assert description.status == WorkflowExecutionStatus.CANCELED
    assert description.search_attributes["KsquadPhase"] == ["Cancelled"]
    assert world.cancelled == ["task-uid-cli-cancel-a1"]
    assert not world.sandboxes
    assert not world.claims


async def test_temporal_workflow_signal_cancel_cancels_a_running_run(
    dev_server: DevServer, dev_client: Client, world: World, ns: str
) -> None:
    world.scripts["cli-signal"] = [hang()]
    handle = await start_run(dev_client, run_input("cli-signal", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "cli-signal")
    await temporal(dev_server, "workflow", "signal", "--name", "cancel", "-w", f"{ns}/cli-signal")
    status = await handle.result()
    assert status.phase == Phase.CANCELLED
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED


async def test_pause_then_resume_before_it_takes_effect_changes_nothing(
    dev_client: Client, world: World, ns: str
) -> None:
    # On the dev server, not the time-skipping one: the pause can reach the workflow while the (instant)
    # reference resolution completes. The workflow then asks to cancel an activity whose completion the server
    # holds back until the workflow task ends. Temporal's server accepts that; the time-skipping test server
    # refuses the task (ACTIVITY_UNKNOWN) and never hands it out again, so the run hung there (sdk-java#3088).
    world.missing["r"] = ["Agent ksquad-system/dev-1"]
    handle = await start_run(dev_client, run_input("r", namespace=ns))
    await world.wait_entered(Activity.RESOLVE_REFERENCES, "r")
    await handle.signal("pause")
    await handle.signal("resume")
    del world.missing["r"]
    await handle.signal("references_updated")
    status = await handle.result()
    assert (status.phase, status.attempt, status.retries) == (Phase.SUCCEEDED, 1, 0)


async def test_temporal_workflow_list_finds_a_paused_run_and_query_shows_its_state(
    dev_server: DevServer, dev_client: Client, world: World, ns: str
) -> None:
    world.scripts["cli-paused"] = [rate_limited("3600"), ok()]
    handle = await start_run(dev_client, run_input("cli-paused", namespace=ns))
    paused = await world.until_phase("cli-paused", "Paused")
    query = f"KsquadPhase='Paused' AND KsquadNamespace='{ns}'"
    listed: list[dict[str, object]] = []
    for _ in range(100):  # visibility is eventually consistent
        found = await temporal(dev_server, "workflow", "list", "-q", query, "-o", "json")
        listed = json.loads(found.stdout or "[]")
        if listed:
            break
        await asyncio.sleep(0.1)
    assert [w["execution"]["workflowId"] for w in listed] == [f"{ns}/cli-paused"]  # type: ignore[index]

    state = await temporal(
        dev_server, "workflow", "query", "--type", "state", "-w", f"{ns}/cli-paused", "-o", "json"
    )
    result = json.loads(state.stdout)["queryResult"][0]
    assert result["phase"] == "Paused"
    assert result["pauseReason"] == "RateLimited"
    assert result["resumeAt"] is not None
    description = await handle.describe()
    assert description.search_attributes["KsquadResumeAt"] == [paused.resume_at]
    assert description.search_attributes["KsquadAttempt"] == [1]
    assert description.search_attributes["KsquadTriggeredBy"] == ["alice@example.com"]
    await handle.signal("cancel")
    assert (await handle.result()).phase == Phase.CANCELLED


async def test_a_long_run_continues_as_new_when_suggested_and_keeps_its_state(
    world: World, tmp_path: object
) -> None:
    # A server that suggests continue-as-new after 60 events: a run with several rate-limit pauses crosses it.
    server = DevServer(
        ui=False, extra_args=["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=60"]
    )
    async with server, running_world_on(server.target, world) as client:
        world.scripts["long"] = [rate_limited("1"), rate_limited("1"), rate_limited("1"), ok()]
        handle = await start_run(client, run_input("long", work_item_ref="wi-long"))
        status = await handle.result(follow_runs=True)
        assert status.phase == Phase.SUCCEEDED
        assert status.attempt == 4, "attempts carried over"
        assert status.work_item is not None
        runs = [h async for h in client.list_workflows(f"WorkflowId = '{handle.id}'")]
        assert len(runs) >= 2, "the run continued as new at least once"
        assert [e.revision for e in world.events["long"]] == list(range(1, status.revision + 1))


async def test_the_sandbox_and_agent_activities_carry_the_runs_namespace_as_their_fairness_key(
    dev_client: Client, world: World, ns: str
) -> None:
    # On a server with matching.enableFairness the task queue dispatches round these keys: one namespace's backlog
    # of sandboxes and agent calls does not hold back another's.
    handle = await start_run(dev_client, run_input("fair-key", namespace=ns))
    assert (await handle.result()).phase == Phase.SUCCEEDED
    keys = {
        e.activity_task_scheduled_event_attributes.activity_type.name: (
            e.activity_task_scheduled_event_attributes.priority.fairness_key
        )
        async for e in handle.fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert keys[Activity.ACQUIRE_SANDBOX.value] == ns and keys[Activity.INVOKE_AGENT.value] == ns, keys


async def test_a_run_continued_as_new_during_a_limit_resumes_in_one_attempt(world: World) -> None:
    # A run continues as new between attempts, its carried status still saying Running. Subscribing again, it
    # learns the limit it is already waiting out: that must not count as stopping an attempt in flight. It did:
    # the next attempt ended at once (fenced, claim kept) and another began (seen as attempt 5 of 4 in CI). A
    # server that suggests continue-as-new early makes the run continue as new right after its 429.
    server = DevServer(
        ui=False, extra_args=["--dynamic-config-value", "limit.historyCount.suggestContinueAsNew=20"]
    )
    async with server, running_world_on(server.target, world) as client:
        world.scripts["b"] = [rate_limited("3"), ok()]
        handle = await start_run(client, run_input("b"))
        status = await handle.result(follow_runs=True)
        runs = [h async for h in client.list_workflows(f"WorkflowId = '{handle.id}'")]
        assert len(runs) >= 2, "the run continued as new during its limit"
        assert (status.phase, status.attempt) == (Phase.SUCCEEDED, 2), "one attempt after the limited one"
        calls = world.calls_of(Activity.INVOKE_AGENT, "b")
        assert len(calls) == 2
        paused = [s for s in world.mirrored["b"] if s.phase == Phase.PAUSED and s.resume_at is not None]
        assert paused, "it paused for the limit"
        assert calls[1].at >= paused[0].resume_at, "no call before the limit ended"  # type: ignore[operator]
