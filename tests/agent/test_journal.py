"""agent.journal.restore: a conversation rebuilt from the recorded steps of one or more attempts, as the model saw
it: turns and tool results in order, a call started and not answered told as in flight (never silently run again),
calls never started given back to run, a recorded answer given as the answer; a chain of attempts rebuilt as each of
them saw it; steps written twice (a retried write) counted once."""

import itertools
from typing import Any

from agent.journal import restore

STEPS = itertools.count(1)  # each turn its own step, as the agent numbers them


def turn(attempt: int, *calls: str, text: str | None = None, step: int | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "notes", "arguments": "{}"}} for c in calls
        ]
    number = next(STEPS) if step is None else step
    return {"attempt": attempt, "step": number, "kind": "turn", "data": {"message": message}}


def started(attempt: int, call: str) -> dict[str, Any]:
    return {"attempt": attempt, "step": 0, "kind": "tool-started", "data": {"id": call, "name": "notes"}}


def result(attempt: int, call: str) -> dict[str, Any]:
    message = {"role": "tool", "tool_call_id": call, "content": f"result of {call}"}
    return {"attempt": attempt, "step": 0, "kind": "tool", "data": {"message": message}}


def test_a_started_call_without_a_result_is_told_in_flight_and_one_never_started_is_run() -> None:
    restored = restore([turn(1, "a"), started(1, "a"), result(1, "a"), turn(1, "b", "c"), started(1, "b")])
    assert restored.turns == 2 and restored.answer is None
    contents = [m.get("content") for m in restored.messages]
    assert contents[:3] == [None, "result of a", None]
    assert [m.get("tool_call_id") for m in restored.messages[3:]] == ["b"]
    assert "in flight when attempt 1 stopped" in str(contents[3])
    assert restored.in_flight == ["notes"]
    assert [c["id"] for c in restored.to_run] == ["c"], "c never started: it is run, not reported"


def test_a_recorded_answer_is_the_answer_and_nothing_is_run() -> None:
    restored = restore([turn(1, "a"), started(1, "a"), result(1, "a"), turn(1, text="fixed")])
    assert (restored.turns, restored.answer, restored.to_run) == (2, "fixed", [])


def test_a_chain_of_attempts_is_rebuilt_as_each_saw_it() -> None:
    """Attempt 2 resumed attempt 1 (its in-flight call told as such, not recorded), then died in turn; attempt 3 sees
    the in-flight answer where attempt 2's model saw it, before attempt 2's turn."""
    steps = [turn(1, "a"), started(1, "a"), turn(2, "b"), started(2, "b"), result(2, "b")]
    restored = restore(steps)
    assert [m["role"] for m in restored.messages] == ["assistant", "tool", "assistant", "tool"]
    assert "attempt 1" in restored.messages[1]["content"] and restored.messages[3]["content"] == "result of b"
    assert (restored.turns, restored.to_run, restored.answer) == (2, [], None)


def test_nothing_recorded_restores_nothing() -> None:
    restored = restore([])
    assert (restored.turns, restored.messages, restored.to_run, restored.answer) == (0, [], [], None)


def test_steps_recorded_twice_by_a_retried_write_count_once() -> None:
    """The agent writes again when a write's answer was lost: the store then holds the steps twice."""
    once = [turn(1, "a", step=1), started(1, "a"), result(1, "a"), turn(1, text="fixed", step=2)]
    twice = [*once[:3], *once[:3], once[3], once[3]]
    assert restore(twice) == restore(once)
    assert (restore(twice).turns, len(restore(twice).messages)) == (2, 3)


def test_the_recorded_turns_usage_is_given_back_with_its_attempt_once() -> None:
    """The retry reports it again: the orchestrator may have died before it recorded the report."""
    cost = {"callId": "1", "model": "gpt", "inputTokens": 10, "outputTokens": 2, "latencyMs": 5}
    first = turn(1, "a", step=1)
    first["data"]["usage"] = cost
    steps = [
        first,
        started(1, "a"),
        first,
        turn(2, text="done", step=2),
    ]  # the first written twice; one cost-less
    assert restore(steps).usage == [{**cost, "attempt": 1}]
