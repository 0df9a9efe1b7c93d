"""Model usage on the embedded default (Temporal's dev server, the worker, SQLite, local sandboxes of the reference
agent, the scripted model, which reports usage as OpenAI does and counts what it reported): each call an agent
made is recorded once, charged to the Run's attempt and its starter; a Run's `status.usage` sums its attempts,
the failed one's too; the worker's counters, `ksquad usage` and `ksquad runs describe` agree."""

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from dev.stack import DevStack, dev_stack
from store import ModelCall, utcnow
from testbed.embedded import stack_options, wait_terminal
from tests.support.dev import ksquad

NS = "bench"  # wait_terminal's namespace
SCRIPT: dict[str, list[dict[str, Any]]] = {
    # attempt 1: one answered call (a tool it was never offered), then the model fails; attempt 2: the answer
    "counted": [
        {"tool_calls": [{"name": "not_offered", "arguments": {"why": "to count a call"}}]},
        {"error": 500},
        {"text": "counted every token of it"},
    ],
    "single": [{"text": "one call, one answer"}],
}


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as stack:
        yield stack


def docs(name: str, model: str) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": f"{name}-agent", "namespace": NS},
            "spec": {"modelEndpointRef": "local", "model": model},
        },
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "agents": [f"{name}-agent"],
                "inputs": {"task": f"the task of {name}"},
                "retryPolicy": {"backoffSeconds": 1, "maxBackoffSeconds": 1},
            },
        },
    ]


def tokens_counted(direction: str, model: str) -> float:
    found = [
        s.value
        for metric in REGISTRY.collect()
        if metric.name == "ksquad_model_tokens"
        for s in metric.samples
        if s.name == "ksquad_model_tokens_total"
        and s.labels["direction"] == direction
        and s.labels["model"] == model
        and s.labels["namespace"] == NS
    ]
    return sum(found)


async def test_each_call_is_counted_once_per_attempt_and_the_status_sums_the_attempts(dev: DevStack) -> None:
    before = {d: tokens_counted(d, "counted") for d in ("input", "output")}
    await dev.runs.apply([*docs("counted", "counted"), *docs("single", "single")])
    assert await wait_terminal(dev, ["counted", "single"], within=90) == {
        "counted": "Succeeded",
        "single": "Succeeded",
    }
    assert dev.scripted is not None
    served = {name: [c for c in dev.scripted.calls if c.model == name and c.output_tokens] for name in SCRIPT}
    assert len(served["counted"]) == 2 and len(served["single"]) == 1, "the 500 reported no usage"

    run = await dev.runs.get(NS, "counted")
    assert (run.status or {})["attempt"] == 2
    assert (run.status or {})["usage"] == {
        "calls": 2,
        "inputTokens": sum(c.input_tokens for c in served["counted"]),
        "outputTokens": sum(c.output_tokens for c in served["counted"]),
    }, "both attempts' calls, the failed attempt's too, each once"
    first, second = [await dev.store.run_usage(run.uid, attempt) for attempt in (1, 2)]
    assert (first.calls, first.input_tokens) == (1, served["counted"][0].input_tokens)
    assert (second.calls, second.output_tokens) == (1, served["counted"][1].output_tokens)
    assert {d: tokens_counted(d, "counted") - before[d] for d in before} == {
        "input": sum(c.input_tokens for c in served["counted"]),
        "output": sum(c.output_tokens for c in served["counted"]),
    }

    # A report seen again (a worker that restarted mid-turn reads the task again) is the same row.
    again = ModelCall(
        namespace=NS,
        run=f"{NS}/counted",
        run_uid=run.uid,
        attempt=1,
        call_id="1",
        model="counted",
        credential="",
        triggered_by=dev.runs.user,
        input_tokens=999,
        output_tokens=999,
        latency_ms=1,
    )
    assert await dev.store.record_usage(again) is False
    assert await dev.store.run_usage(run.uid, 1) == first

    single = await dev.runs.get(NS, "single")
    assert (single.status or {})["usage"]["calls"] == 1
    by_person = await dev.store.usage("triggered_by", utcnow() - timedelta(hours=1), namespace=NS)
    everything = [c for calls in served.values() for c in calls]
    assert [(u.key, u.calls, u.input_tokens, u.output_tokens) for u in by_person] == [
        (
            dev.runs.user,
            3,
            sum(c.input_tokens for c in everything),
            sum(c.output_tokens for c in everything),
        )
    ]
    by_model = {u.key: u.calls for u in await dev.store.usage("model", utcnow() - timedelta(hours=1))}
    assert by_model == {"counted": 2, "single": 1}

    # What a user reads: `ksquad usage` sums the same records, `runs describe` and `runs get` show a run's.
    cli = ("--state-dir", str(dev.state_dir))
    summed = await ksquad(dev.state_dir.parent, *cli, "usage", "--by", "person", "-n", NS, "-o", "json")
    assert summed.code == 0, summed.err
    assert [(u["person"], u["calls"], u["inputTokens"]) for u in json.loads(summed.out)["items"]] == [
        (dev.runs.user, 3, sum(c.input_tokens for c in everything))
    ]
    table = await ksquad(dev.state_dir.parent, *cli, "usage", "--by", "model", "-A", "--since", "1h")
    assert table.code == 0, table.err
    assert "all namespaces" in table.out and "counted" in table.out.splitlines()[2], table.out
    described = await ksquad(dev.state_dir.parent, *cli, "runs", "describe", f"{NS}/counted")
    usage = run.status["usage"] if run.status else {}
    line = f"usage:    2 model calls, {usage['inputTokens']} tokens in, {usage['outputTokens']} out"
    assert line in described.out, described.out
    got = await ksquad(dev.state_dir.parent, *cli, "runs", "get", f"{NS}/counted")
    assert f"{usage['inputTokens']}+{usage['outputTokens']}" in got.out.splitlines()[1], got.out
    wrong = await ksquad(dev.state_dir.parent, *cli, "usage", "--since", "yesterday")
    assert wrong.code == 1 and "since: 'yesterday' is neither a time" in wrong.err, wrong.err


async def test_a_run_past_its_token_budget_ends_failed_with_its_usage_counted_and_no_retry(
    dev: DevStack,
) -> None:
    """The Team's budget for a Run that sets none, the Run's own over it: the call that passes the budget is the
    last (counted, then the agent's task is cancelled), and the run fails without another attempt."""
    team = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Team",
        "metadata": {"name": "frugal", "namespace": NS},
        "spec": {"agents": ["over-agent"], "tokenBudget": 1},
    }
    over, within = docs("over", "counted"), docs("within", "single")
    over[1]["spec"] = {**over[1]["spec"], "agents": [], "teamRef": "frugal"}
    within[1]["spec"] = {**within[1]["spec"], "teamRef": "frugal", "tokenBudget": 1_000_000}
    await dev.runs.apply([team, *over, *within])
    assert await wait_terminal(dev, ["over", "within"], within=90) == {
        "over": "Failed",
        "within": "Succeeded",
    }
    assert dev.scripted is not None
    made = [c for c in dev.scripted.calls if c.model == "counted"]
    assert len(made) == 1, "no call after the one that passed the budget"
    status = (await dev.runs.get(NS, "over")).status or {}
    assert status["reason"] == "TokenBudgetSpent" and status["attempt"] == 1, status
    assert "token budget is spent" in status["message"], status["message"]
    assert status["usage"] == {
        "calls": 1,
        "inputTokens": made[0].input_tokens,
        "outputTokens": made[0].output_tokens,
    }
