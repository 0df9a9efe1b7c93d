"""Agents that hang, flood progress, answer with 10 MB, send a thousand artifacts, report one model call a
thousand times or more calls than a turn may make, send an event that never ends, or do not speak JSON-RPC at
all, each behind a Run on the embedded stack: every run ends with a phase and a reason that says what the agent
did wrong, within its bounds; none hangs, none takes the worker down, nothing huge lands in a status."""

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from activities.agents.recording import MAX_ARTIFACTS, MAX_MODEL_CALLS
from testbed.embedded import MODEL, NAMESPACE, bench_stack, wait_terminal
from tests.faults.bad_agents import (
    A2A_BEHAVIOURS,
    FLOOD_UPDATES,
    MANY_CALLS,
    NOT_JSON_RPC,
    SAME_CALL_REPORTS,
    bad_agents,
)

HANG_SECONDS = 8  # the hanging agent's bound (timeouts.runSeconds)

# behaviour -> (phase, reason) the Run must end in.
EXPECTED: dict[str, tuple[str, str]] = {
    "hang": ("Failed", "RunTimeout"),
    "flood": ("Succeeded", "Succeeded"),
    "huge-artifact": ("Failed", "InvalidAgentResponse"),
    "huge-answer": ("Succeeded", "Succeeded"),
    "many-artifacts": ("Failed", "InvalidAgentResponse"),
    "same-call": ("Succeeded", "Succeeded"),
    "many-calls": ("Failed", "InvalidAgentResponse"),
    **{b: ("Failed", "InvalidAgentResponse") for b in NOT_JSON_RPC},
    # A JSON-RPC internal error answering the message itself: the agent failed the task ("the agent crashed:
    # internal kaboom"). Before the first try stopped looking for an earlier task, the lookup got that error
    # first and called it an invalid answer.
    "rpc-error": ("Failed", "AgentFailed"),
}


def docs_for(behaviour: str, endpoint: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": f"bad-{behaviour}", "namespace": NAMESPACE},
            "spec": {"modelEndpointRef": "local", "model": MODEL, "endpoint": endpoint},
        },
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": f"r-{behaviour}", "namespace": NAMESPACE},
            "spec": {
                "agents": [f"bad-{behaviour}"],
                "workItemRef": f"item-{behaviour}",
                "retryPolicy": {"maxRetries": 0},
                "timeouts": {"runSeconds": HANG_SECONDS if behaviour == "hang" else 300},
            },
        },
    ]


async def test_misbehaving_agents_fail_their_runs_with_a_reason_and_nothing_hangs(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    behaviours = [*A2A_BEHAVIOURS, *NOT_JSON_RPC]
    async with bad_agents() as agents, bench_stack(tmp_path) as (dev, _agent):
        for b in behaviours:
            await dev.store.create_item(NAMESPACE, f"item-{b}", title=b, created_by="tester")
        started = time.monotonic()
        await dev.runs.apply([d for b in behaviours for d in docs_for(b, agents.endpoint(b))])
        phases = await wait_terminal(dev, [f"r-{b}" for b in behaviours], within=300)
        took = time.monotonic() - started
        statuses = {b: (await dev.runs.get(NAMESPACE, f"r-{b}")).status or {} for b in behaviours}
        events = {
            b: [e for e in await dev.store.events((await dev.runs.get(NAMESPACE, f"r-{b}")).uid)]
            for b in behaviours
        }
        on_items = {b: await dev.store.item_events(NAMESPACE, f"item-{b}") for b in behaviours}
        usage = {
            b: await dev.store.run_usage((await dev.runs.get(NAMESPACE, f"r-{b}")).uid)
            for b in ("same-call", "many-calls")
        }

    got = {b: (s.get("phase"), s.get("reason")) for b, s in statuses.items()}
    assert got == EXPECTED, (
        f"phases {phases}; messages: { {b: s.get('message') for b, s in statuses.items()} }"
    )
    for behaviour, status in statuses.items():
        assert status.get("message"), f"{behaviour}: a reason without a message"
        size = len(json.dumps(status))
        assert size < 20_000, f"{behaviour}: a {size}-byte status (nothing huge is copied into it)"
    assert "runSeconds" in statuses["hang"]["message"]
    assert "artifact" in statuses["huge-artifact"]["message"]
    assert "artifacts" in statuses["many-artifacts"]["message"]
    assert "longer than 32 MiB" in statuses["endless-line"]["message"], statuses["endless-line"]["message"]
    # The work item keeps what was recorded whole, and nothing of what was refused.
    many = [e.data for e in on_items["many-artifacts"] if e.kind == "artifact"]
    assert 0 < len(many) <= MAX_ARTIFACTS and all(d and d["size"] > 0 for d in many), many[:3]
    assert not [e for e in on_items["huge-artifact"] if e.kind == "artifact"], (
        "no trace of the 10 MB artifact"
    )
    assert len(statuses["huge-answer"]["outputs"]["answer"]) <= 4096
    assert agents.seen["flood"].sent_updates == FLOOD_UPDATES
    flood_events = [e for e in events["flood"] if e.kind == "status"]
    assert len(flood_events) < 200, f"{len(flood_events)} progress events stored for {FLOOD_UPDATES} updates"
    # One call reported 1,000 times is one call, charged once; a turn reporting a new call id past the bound
    # ends there, its recorded calls kept (they were made) and no row past the bound.
    assert agents.seen["same-call"].sent_updates == SAME_CALL_REPORTS
    same = usage["same-call"]
    assert (same.calls, same.input_tokens, same.output_tokens) == (1, 100, 10), same
    assert statuses["same-call"]["usage"]["calls"] == 1, statuses["same-call"].get("usage")
    assert agents.seen["many-calls"].sent_updates == MANY_CALLS
    assert usage["many-calls"].calls == MAX_MODEL_CALLS, usage["many-calls"]
    assert f"more than {MAX_MODEL_CALLS} model calls" in statuses["many-calls"]["message"]
    print(f"the misbehaving agents were dealt with in {took:.0f}s")
    fault_counts["bad_agents.behaviours"] += len(behaviours)
    fault_counts["bad_agents.flood_updates"] += FLOOD_UPDATES
