"""Lifecycle edges on the real stack (the embedded default: Temporal's dev server, the worker, the SQLite store,
local sandboxes running the reference agent, the scripted model over HTTP), not the fake activities of
tests/workflows: a retry, the fallback model, input asked for and given, and each phase's timeout."""

import asyncio
import itertools
import os
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dev.embedded import LOCAL_CREDENTIAL_SECRET
from dev.stack import DevStack, dev_stack
from store import work_item_key
from testbed.embedded import stack_options, wait_terminal
from tests.workflows.test_replay import patches_asked, search_attribute_upserts_by_task
from workflows.entity_types import DEFAULT_RESUME_PER_SECOND
from workflows.patches import CURRENT

NS = "bench"  # wait_terminal's namespace
API = "ksquad.io/v1alpha1"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "flaky": [{"error": 500}, {"text": "fixed on the second try"}],
    "limited": [{"error": 429, "retry_after": "600"}],
    "limited-too": [{"error": 429, "retry_after": "600"}],
    "small": [{"text": "the fallback answered"}],
    "expired": [{"error": 401}],
    "asks": [
        {"tool_calls": [{"name": "ksquad_request_input", "arguments": {"question": "Which test is flaky?"}}]},
        {"text": "fixed test_payment_retry"},
    ],
    "slow": [{"delay": 30, "text": "too late"}],
    "steady": [{"delay": 3, "text": "done in turn"}],
    "no-retry-after": [{"error": 429}, {"text": "after the backoff"}],
    "held-off": [{"error": 429, "retry_after": "120"}],  # every call: a limit short of a re-route
    "ramped": [{"error": 429, "retry_after": "5"}, {"text": "in my place"}],
    "shared": [{"error": 429, "retry_after": "6"}, {"text": "my Team's turn"}],
}


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    options = stack_options(tmp_path / ".ksquad", SCRIPT)
    async with dev_stack(options) as stack:
        yield stack


def agent(name: str, model: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Agent",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"modelEndpointRef": "local", "model": model, **spec},
    }


def run(name: str, agents: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Run",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"agents": agents, **spec},
    }


async def status(dev: DevStack, name: str) -> dict[str, Any]:
    return (await dev.runs.get(NS, name)).status or {}


async def phase_events(dev: DevStack, name: str) -> list[dict[str, Any]]:
    uid = (await dev.runs.get(NS, name)).uid
    return [e.data for e in await dev.store.events(uid) if e.kind == "phase"]


async def until_phase(dev: DevStack, name: str, phase: str, within: float = 60) -> dict[str, Any]:
    for _ in range(int(within / 0.1)):
        if (current := await status(dev, name)).get("phase") == phase:
            return current
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name} not {phase} within {within}s: {await status(dev, name)}")


async def test_an_agent_that_fails_once_is_retried_after_backoff_with_a_new_fence(dev: DevStack) -> None:
    await dev.runs.apply(
        [
            agent("flaky-agent", "flaky"),
            run(
                "retried",
                ["flaky-agent"],
                workItemRef="wi-retry",
                retryPolicy={"backoffSeconds": 2, "maxBackoffSeconds": 2},
            ),
        ]
    )
    assert await wait_terminal(dev, ["retried"], within=90) == {"retried": "Succeeded"}
    final = await status(dev, "retried")
    assert (final["attempt"], final["retries"], final["message"]) == (2, 1, "fixed on the second try")
    backoff = next(e for e in await phase_events(dev, "retried") if e["reason"] == "RetryBackoff")
    waited = datetime.fromisoformat(backoff["message"].rsplit(" at ", 1)[1]) - datetime.fromisoformat(
        backoff["at"]
    )
    assert 1.0 <= waited.total_seconds() <= 2.0, "equal jitter: between half and all of the 2 s backoff"
    history = [(h.action, h.fence) for h in await dev.store.claim_history(work_item_key(NS, "wi-retry"))]
    first = history[0][1]
    # fence-then-release before the retry claims anew: the first holder's writes are refused from the fence on
    assert history == [
        ("claimed", first),
        ("fenced", first + 1),
        ("released", first + 1),
        ("claimed", first + 2),
        ("released", first + 2),
    ], history
    logs = sorted(p.name for p in (dev.state_dir / "sandboxes").glob(f"{NS}_retried-exec-*.log"))
    assert logs == [f"{NS}_retried-exec-1.log", f"{NS}_retried-exec-2.log"], "a new sandbox for the retry"


async def test_a_retried_runs_history_asks_one_patch_and_upserts_once_a_workflow_task(dev: DevStack) -> None:
    """What tests/workflows/test_replay.py checks of the recorded histories, on a Run of the real stack (a real
    sandbox and agent, a failed attempt, a backoff, a retry): one patch marker, `workflows.patches.CURRENT`, and
    at most one upsert of ksquad's search attributes a workflow task."""
    await dev.runs.apply(
        [
            agent("flaky-agent", "flaky"),
            run("shaped", ["flaky-agent"], retryPolicy={"backoffSeconds": 1, "maxBackoffSeconds": 1}),
        ]
    )
    assert await wait_terminal(dev, ["shaped"], within=90) == {"shaped": "Succeeded"}
    history = await dev.client.get_workflow_handle(f"{NS}/shaped").fetch_history()
    events = history.to_json_dict()["events"]
    assert patches_asked(events) == [CURRENT]
    upserts = search_attribute_upserts_by_task(events)
    assert sum(upserts) >= 4 and max(upserts) == 1, upserts


async def test_the_fallback_model_takes_over_mid_run_without_pausing(dev: DevStack) -> None:
    await dev.runs.apply(
        [agent("careful", "limited", fallbackModel={"model": "small"}), run("fell-back", ["careful"])]
    )
    assert await wait_terminal(dev, ["fell-back"], within=60) == {"fell-back": "Succeeded"}
    final = await status(dev, "fell-back")
    assert (final["attempt"], final["model"], final["message"]) == (1, "small", "the fallback answered")
    reasons = [e["reason"] for e in await phase_events(dev, "fell-back")]
    assert "ModelFallback" in reasons and "RateLimited" not in reasons, reasons


async def test_the_projects_fallback_model_answers_once_the_agents_own_is_limited_too(dev: DevStack) -> None:
    project = {
        "apiVersion": API,
        "kind": "Project",
        "metadata": {"name": "pool", "namespace": NS},
        "spec": {"fallbackModel": {"model": "small"}},
    }
    careful = agent("careful-too", "limited", fallbackModel={"model": "limited-too"})
    await dev.runs.apply([project, careful, run("pooled", ["careful-too"], projectRef="pool")])
    assert await wait_terminal(dev, ["pooled"], within=60) == {"pooled": "Succeeded"}
    final = await status(dev, "pooled")
    assert (final["attempt"], final["model"], final["message"]) == (1, "small", "the fallback answered")
    events = [(e["reason"], e["message"]) for e in await phase_events(dev, "pooled")]
    fallbacks = [m for r, m in events if r == "ModelFallback"]
    assert len(fallbacks) == 2 and "the Project's fallback model" in fallbacks[1], events
    assert "RateLimited" not in [r for r, _ in events], events
    assert dev.scripted is not None
    assert [c.model for c in dev.scripted.calls] == ["limited", "limited-too", "small"], (
        "one call each, in order"
    )


@pytest.mark.parametrize("first", ["nothing", "the temporal CLI"])
async def test_input_asked_for_is_given_and_the_same_task_goes_on(dev: DevStack, first: str) -> None:
    """`ksquad runs input` answers (the embedded API checks that the run waits for one, and signs it as the bridge
    does). The temporal CLI's `input` signal is refused, in clear and through the codec endpoint alike: it carries
    no proof of the bridge's (workflows.inbox), so a client of the namespace cannot answer for a person."""
    await dev.runs.apply([agent("asker", "asks"), run("asked", ["asker"])])
    paused = await until_phase(dev, "asked", "Paused")
    assert (paused["pauseReason"], paused["message"]) == ("InputRequired", "Which test is flaky?")
    bin_dir = Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin"
    if first == "the temporal CLI":
        command = [
            str(bin_dir / "temporal"),
            "workflow",
            "signal",
            "--address",
            dev.server.target,
            "-w",
            f"{NS}/asked",
            "--name",
            "input",
            "--input",
            '"test_payment_retry"',
        ]
        token = (dev.state_dir / "api.token").read_text().strip()
        through_codec = ["--codec-endpoint", f"{dev.api_url}/codec", "--codec-auth", f"Bearer {token}"]
        for attempt in (command, command + through_codec):
            done = await asyncio.to_thread(subprocess.run, attempt, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        await asyncio.sleep(2)
        still = await status(dev, "asked")
        assert (still["phase"], still["pauseReason"]) == ("Paused", "InputRequired"), (
            "an unproven answer was taken"
        )
    command = [
        str(bin_dir / "ksquad"),
        "--state-dir",
        str(dev.state_dir),
        "runs",
        "input",
        f"{NS}/asked",
        "test_payment_retry",
    ]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert await wait_terminal(dev, ["asked"], within=60) == {"asked": "Succeeded"}
    final = await status(dev, "asked")
    assert (final["attempt"], final["message"]) == (1, "fixed test_payment_retry"), "the same attempt went on"


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (
            {"agents": ["slow-agent"], "timeouts": {"runSeconds": 3}, "retryPolicy": {"maxRetries": 0}},
            "RunTimeout",
        ),
        ({"agents": ["asker"], "timeouts": {"pausedSeconds": 2}}, "InputRequiredTimeout"),
        ({"agents": ["ghost"], "timeouts": {"claimSeconds": 3}}, "ReferencesNotFound"),
        ({"agents": ["held-off-agent"], "timeouts": {"rateLimitedSeconds": 3}}, "RateLimitedTimeout"),
    ],
    ids=["run", "paused", "claim", "rate-limited"],
)
async def test_each_phase_timeout_ends_the_run_with_its_reason(
    dev: DevStack, spec: dict[str, Any], reason: str
) -> None:
    agents = [agent("slow-agent", "slow"), agent("asker", "asks"), agent("held-off-agent", "held-off")]
    await dev.runs.apply([*agents, run("bounded", **spec)])
    assert await wait_terminal(dev, ["bounded"], within=60) == {"bounded": "Failed"}
    assert (await status(dev, "bounded"))["reason"] == reason


def team(name: str, agents: list[str], limit: int) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": "Team",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"agents": agents, "maxConcurrentRuns": limit},
    }


async def test_a_team_of_one_admits_its_runs_in_order_and_a_queued_delete_frees_nothing(
    dev: DevStack,
) -> None:
    """A queued Run deleted frees nothing; one paused and resumed with the CLI while Queued asks again and is
    admitted when the slot frees (before, its gate took the second request for a copy of the first)."""
    await dev.runs.apply(
        [agent("steady-agent", "steady"), team("one", ["steady-agent"], 1), run("q1", [], teamRef="one")]
    )
    await until_phase(dev, "q1", "Running")
    await dev.runs.apply([run("q2", [], teamRef="one")])
    queued = await until_phase(dev, "q2", "Queued")
    assert "position 1" in queued["message"], queued
    await dev.runs.apply([run("q3", [], teamRef="one")])
    assert "position 2" in (await until_phase(dev, "q3", "Queued"))["message"]
    await dev.runs.delete(NS, "q2")  # while Queued: it held no slot, so q1 keeps it and q3 waits
    assert (await status(dev, "q1"))["phase"] == "Running"
    assert (await status(dev, "q3"))["phase"] == "Queued"
    await ksquad(dev, "runs", "pause", f"{NS}/q3")
    await until_phase(dev, "q3", "Paused")
    await ksquad(dev, "runs", "resume", f"{NS}/q3")
    for _ in range(300):  # Queued "resumed by request" first, then the gate's answer
        if "position 1" in (again := await status(dev, "q3")).get("message", ""):
            break
        await asyncio.sleep(0.1)
    assert (again["phase"], again["reason"]) == ("Queued", "ConcurrencyLimit"), again
    assert "position 1" in again["message"], again
    assert (await status(dev, "q1"))["phase"] == "Running"
    assert await wait_terminal(dev, ["q1", "q3"], within=90) == {"q1": "Succeeded", "q3": "Succeeded"}
    q1_done = next(e["at"] for e in await phase_events(dev, "q1") if e["phase"] == "Succeeded")
    q3_claimed = next(e["at"] for e in await phase_events(dev, "q3") if e["phase"] == "Claiming")
    assert datetime.fromisoformat(q3_claimed) >= datetime.fromisoformat(q1_done), "one at a time"


async def test_a_run_queued_past_queued_seconds_fails_with_the_reason(dev: DevStack) -> None:
    await dev.runs.apply(
        [agent("slow-agent", "slow"), team("busy", ["slow-agent"], 1), run("holder", [], teamRef="busy")]
    )
    await until_phase(dev, "holder", "Running")
    await dev.runs.apply([run("waiter", [], teamRef="busy", timeouts={"queuedSeconds": 3})])
    assert await wait_terminal(dev, ["waiter"], within=60) == {"waiter": "Failed"}
    assert (await status(dev, "waiter"))["reason"] == "QueueTimeout"
    await dev.runs.delete(NS, "holder")


async def test_a_429_without_retry_after_pauses_within_the_jitter_bounds(dev: DevStack) -> None:
    await dev.runs.apply([agent("bare-429", "no-retry-after"), run("backed-off", ["bare-429"])])
    paused = await until_phase(dev, "backed-off", "Paused")
    assert paused["pauseReason"] == "RateLimited"
    assert dev.scripted is not None
    answered_429 = next(c.at for c in dev.scripted.calls if c.model == "no-retry-after")
    waited = datetime.fromisoformat(paused["resumeAt"]).timestamp() - answered_429
    # Equal jitter on the first strike: between half and all of the 10 s base, from when the 429 came back (the
    # ramp adds at most 1/10 s, and the workflow sees the 429 a moment after the model sent it). Measured from the
    # Paused event instead, the time it took to record the pause would count against the lower bound.
    assert 5.0 <= waited <= 10.2 + 1, waited
    assert await wait_terminal(dev, ["backed-off"], within=60) == {"backed-off": "Succeeded"}


async def test_a_work_item_held_past_claim_seconds_fails_the_second_run_with_the_reason(
    dev: DevStack,
) -> None:
    await dev.runs.apply([agent("slow-agent", "slow"), run("first", ["slow-agent"], workItemRef="wi-shared")])
    await until_phase(dev, "first", "Running")
    await dev.runs.apply(
        [run("second", ["slow-agent"], workItemRef="wi-shared", timeouts={"claimSeconds": 3})]
    )
    assert await wait_terminal(dev, ["second"], within=60) == {"second": "Failed"}
    final = await status(dev, "second")
    assert final["reason"] == "ClaimTimeout" and "wi-shared" in final["message"], final
    assert (await status(dev, "first"))["phase"] == "Running", "the holder keeps its claim"
    await dev.runs.delete(NS, "first")


async def ksquad(dev: DevStack, *args: str) -> None:
    """The `ksquad` command, as a user runs it against this stack."""
    command = [
        str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "ksquad"),
        "--state-dir",
        str(dev.state_dir),
    ]
    done = await asyncio.to_thread(subprocess.run, [*command, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


async def test_a_pause_while_rate_limited_takes_over_and_the_limit_holds_after_resume(dev: DevStack) -> None:
    await dev.runs.apply([agent("limited-agent", "limited"), run("held", ["limited-agent"])])
    limited = await until_phase(dev, "held", "Paused")
    assert limited["pauseReason"] == "RateLimited"
    await ksquad(dev, "runs", "pause", f"{NS}/held", "--reason", "hold it")
    for _ in range(300):
        if (held := await status(dev, "held"))["pauseReason"] == "Manual":
            break
        await asyncio.sleep(0.1)
    assert (held["pauseReason"], held["reason"], held["message"]) == ("Manual", "Manual", "hold it"), held
    await ksquad(dev, "runs", "resume", f"{NS}/held")
    for _ in range(300):
        if (again := await status(dev, "held"))["pauseReason"] == "RateLimited":
            break
        await asyncio.sleep(0.1)
    assert again["resumeAt"] == limited["resumeAt"], "the provider's limit is not forgotten"
    await ksquad(dev, "runs", "cancel", f"{NS}/held")
    assert await wait_terminal(dev, ["held"], within=30) == {"held": "Cancelled"}


@pytest.mark.parametrize(("model", "reason"), [("asks", "InputRequired"), ("expired", "CredentialExpired")])
async def test_a_run_paused_on_its_agents_task_is_cancelled_by_the_cli(
    dev: DevStack, model: str, reason: str
) -> None:
    """Paused with the agent's task waiting (for a person's input, for a new credential): `ksquad runs cancel` ends
    it Cancelled through Cancelling, with the reason given, and no model call follows."""
    await dev.runs.apply([agent(f"{model}-agent", model), run("waiting", [f"{model}-agent"])])
    paused = await until_phase(dev, "waiting", "Paused")
    assert paused["pauseReason"] == reason, paused
    assert dev.scripted is not None
    calls = len(dev.scripted.calls)
    await ksquad(dev, "runs", "cancel", f"{NS}/waiting", "--reason", "not needed")
    assert await wait_terminal(dev, ["waiting"], within=30) == {"waiting": "Cancelled"}
    final = await status(dev, "waiting")
    assert (final["reason"], final["message"]) == ("Cancelled", "not needed"), final
    phases = [e["phase"] for e in await phase_events(dev, "waiting")]
    assert phases[-3:] == ["Paused", "Cancelling", "Cancelled"], phases
    assert len(dev.scripted.calls) == calls, "no model call after the cancel"


async def test_runs_paused_on_one_credential_resume_in_a_ramp_and_none_calls_before_its_place(
    dev: DevStack,
) -> None:
    # One run's 429 limits the credential; runs created meanwhile pause before their first call. Each gets its own
    # place in the ramp (DEFAULT_RESUME_PER_SECOND apart) and calls the model at its place, never before: the
    # provider that answered 429 sees no call until the limit ends, then a trickle instead of all at once.
    names = ["first"] + [f"late-{i}" for i in range(5)]

    def ramp_run(name: str) -> dict[str, Any]:
        return run(name, ["ramp-agent"], inputs={"task": f"ramp run {name}"})

    await dev.runs.apply([agent("ramp-agent", "ramped"), ramp_run("first")])
    limited = await until_phase(dev, "first", "Paused")
    assert limited["pauseReason"] == "RateLimited"
    await dev.runs.apply([ramp_run(name) for name in names[1:]])
    places: dict[str, datetime] = {}
    for name in names:
        paused = await until_phase(dev, name, "Paused")
        places[name] = datetime.fromisoformat(paused["resumeAt"])
    assert await wait_terminal(dev, names, within=90) == dict.fromkeys(names, "Succeeded")

    assert dev.scripted is not None
    calls = [c for c in dev.scripted.calls if c.model == "ramped"]
    assert len(calls) == len(names) + 1, "the one 429, then one call per run"
    ordered = sorted(places.values())
    assert ordered[0] >= datetime.fromisoformat(limited["resumeAt"]) and len(set(ordered)) == len(names)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ordered)]
    assert all(gap >= 1 / DEFAULT_RESUME_PER_SECOND - 0.001 for gap in gaps), gaps
    for name in names:
        (resumed,) = [c for c in calls[1:] if c.task.endswith(f"ramp run {name}")]
        assert resumed.at >= places[name].timestamp(), f"{name} called before its place"


async def test_a_small_team_on_a_limited_credential_resumes_beside_a_big_one_not_behind_it(
    dev: DevStack,
) -> None:
    # Team big's six runs pause on the credential's limit before Team small's two arrive. In pause order small
    # would call seventh and eighth; the ramp goes round the Teams (store.ramps), so they call first and third
    # (each beside big's run of the same rank, the later arrival first).
    def team(name: str) -> dict[str, Any]:
        return {
            "apiVersion": API,
            "kind": "Team",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"agents": ["shared-agent"]},
        }

    def team_run(name: str) -> dict[str, Any]:
        spec = {"teamRef": name.split("-")[0], "inputs": {"task": f"fair run {name}"}}
        return {"apiVersion": API, "kind": "Run", "metadata": {"name": name, "namespace": NS}, "spec": spec}

    big = [f"big-{i}" for i in range(6)]
    small = ["small-0", "small-1"]
    # A slot of a second: a run asks again when its turn comes, and on a loaded machine that can be a tenth of a
    # second late, past a 10/s slot (still one run per slot, but the order is then only about fair).
    endpoint = {
        "apiVersion": API,
        "kind": "ModelEndpoint",
        "metadata": {"name": "slow-ramp", "namespace": NS},
        "spec": {
            "url": dev.model_url,
            "credentialSecretRef": {"name": LOCAL_CREDENTIAL_SECRET},
            "resumePerSecond": 1,
        },
    }
    shared = agent("shared-agent", "shared", modelEndpointRef="slow-ramp")
    await dev.runs.apply([endpoint, shared, team("big"), team("small"), team_run(big[0])])
    limited = await until_phase(dev, big[0], "Paused")
    assert limited["pauseReason"] == "RateLimited"
    await dev.runs.apply([team_run(name) for name in big[1:]])
    for name in big[1:]:
        await until_phase(dev, name, "Paused")
    # One after the other: within a Team the ramp keeps the order its runs entered it in.
    for name in small:
        await dev.runs.apply([team_run(name)])
        paused = await until_phase(dev, name, "Paused")
        assert datetime.fromisoformat(paused["resumeAt"]) > datetime.now(UTC), (
            "small paused before the limit ended"
        )
    names = big + small
    assert await wait_terminal(dev, names, within=90) == dict.fromkeys(names, "Succeeded")

    # Each run's turn is the resumeAt of its last Paused event; it left Paused at or after it, and called after.
    turns: dict[str, datetime] = {}
    for name in names:
        events = await phase_events(dev, name)
        last = max(i for i, e in enumerate(events) if e["phase"] == "Paused")
        turns[name] = datetime.fromisoformat(events[last]["resumeAt"])
        assert datetime.fromisoformat(events[last + 1]["at"]) >= turns[name], f"{name} left Paused early"
    order = sorted(names, key=lambda n: turns[n])
    assert order.index("small-0") == 0 and order.index("small-1") == 2, order
    assert [n for n in order if n.startswith("big")] == sorted(big, key=lambda n: turns[n])
    opens = datetime.fromisoformat(limited["resumeAt"])
    slots = sorted((turns[n] - opens).total_seconds() for n in names)
    assert slots == pytest.approx(list(range(len(names))), abs=0.01), (
        f"one run per slot, from the limit: {slots}"
    )
    assert dev.scripted is not None
    calls = [c for c in dev.scripted.calls if c.model == "shared"]
    assert len(calls) == len(names) + 1, "the one 429, then one call per run"
    for name in names:
        (call,) = [c for c in calls[1:] if c.task.endswith(f"fair run {name}")]
        assert call.at >= turns[name].timestamp(), f"{name} called before its turn"
