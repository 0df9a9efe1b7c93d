"""Model usage in the store, on real PostgreSQL and SQLite: a call recorded once however often it is reported,
summed per attempt and run, and per credential, namespace, person or model over a window."""

from datetime import timedelta

import pytest
from a2a.types import Message, TaskState
from prometheus_client import REGISTRY

from activities.agents.progress import Progress
from activities.agents.recording import OTHER_MODEL, USAGE_KEY, Recorder, usage_call
from store import USAGE_GROUPS, Holder, ModelCall, Store
from tests.activities.conftest import Clock
from workflows.contract import RunIdentity


def call(run: str, attempt: int, call_id: str, **fields: object) -> ModelCall:
    namespace, name = run.split("/")
    values: dict[str, object] = {
        "namespace": namespace,
        "run": run,
        "run_uid": f"uid-{name}",
        "attempt": attempt,
        "call_id": call_id,
        "model": "gpt",
        "credential": f"{namespace}/openai",
        "triggered_by": "alice",
        "input_tokens": 100,
        "output_tokens": 10,
        "latency_ms": 250,
        **fields,
    }
    return ModelCall(**values)  # type: ignore[arg-type]


async def test_a_call_is_recorded_once_and_summed_per_attempt_and_run(store: Store) -> None:
    assert await store.record_usage(call("payments/fix", 1, "1"))
    assert await store.record_usage(call("payments/fix", 1, "2", output_tokens=30))
    assert not await store.record_usage(call("payments/fix", 1, "2", output_tokens=999)), "seen again: no row"
    assert await store.record_usage(call("payments/fix", 2, "1")), "another attempt's call 1 is another call"
    first = await store.run_usage("uid-fix", 1)
    assert (first.calls, first.input_tokens, first.output_tokens) == (2, 200, 40)
    whole = await store.run_usage("uid-fix")
    assert (whole.calls, whole.input_tokens, whole.output_tokens) == (3, 300, 50)
    none = await store.run_usage("uid-nothing")
    assert (none.calls, none.input_tokens, none.output_tokens) == (0, 0, 0)


async def test_usage_sums_by_each_grouping_over_a_window(store: Store, clock: Clock) -> None:
    start = clock()
    await store.record_usage(call("payments/a", 1, "1", triggered_by="alice"))
    clock.advance(3600)
    await store.record_usage(call("payments/b", 1, "1", triggered_by="bob", input_tokens=500))
    await store.record_usage(call("search/c", 1, "1", triggered_by="bob", model="claude", credential=""))
    by_person = await store.usage("triggered_by", start)
    assert [(u.key, u.calls, u.input_tokens) for u in by_person] == [("bob", 2, 600), ("alice", 1, 100)]
    later = await store.usage("triggered_by", start + timedelta(minutes=30))
    assert [(u.key, u.calls) for u in later] == [("bob", 2)], "the window starts after alice's call"
    earlier = await store.usage("namespace", start, until=start + timedelta(minutes=30))
    assert [(u.key, u.calls) for u in earlier] == [("payments", 1)]
    in_payments = await store.usage("credential", start, namespace="payments")
    assert [(u.key, u.calls, u.input_tokens) for u in in_payments] == [("payments/openai", 2, 600)]
    assert {u.key for u in await store.usage("model", start)} == {"gpt", "claude"}
    assert set(USAGE_GROUPS) == {"credential", "namespace", "triggered_by", "model"}
    with pytest.raises(ValueError, match="summed by one of credential"):
        await store.usage("run_uid; drop table model_usage", start)


@pytest.mark.parametrize(
    "report",
    [
        "1200 tokens",
        {"model": "gpt", "inputTokens": 1, "outputTokens": 1},  # no callId
        {"callId": "", "model": "gpt", "inputTokens": 1, "outputTokens": 1},
        {"callId": "x" * 65, "model": "gpt", "inputTokens": 1, "outputTokens": 1},
        {"callId": "1", "model": "gpt", "inputTokens": -1, "outputTokens": 1},
        {"callId": "1", "model": "gpt", "inputTokens": 1.5, "outputTokens": 1},
        {"callId": "1", "model": "gpt", "inputTokens": True, "outputTokens": 1},
        {"callId": "1", "model": "gpt", "inputTokens": 1 << 40, "outputTokens": 1},
        {"callId": "1", "model": "", "inputTokens": 1, "outputTokens": 1},
        {"callId": "1", "model": "gpt", "inputTokens": "12", "outputTokens": 1},
    ],
)
def test_a_usage_report_in_another_shape_is_not_a_call(report: object) -> None:
    assert usage_call(report) is None


def test_a_usage_report_in_the_documented_shape_is_read_whole_numbers_from_protobuf_floats() -> None:
    report = {
        "callId": "3",
        "model": "gpt-4.1",
        "inputTokens": 1200.0,
        "outputTokens": 310,
        "latencyMs": 2400,
    }
    assert usage_call(report) == ("3", "gpt-4.1", 1200, 310, 2400)


async def test_a_reported_model_the_contract_does_not_name_is_stored_but_counted_as_other(
    store: Store, clock: Clock
) -> None:
    """An agent that names a new model in every report makes no new Prometheus series."""
    holder = Holder(uid="uid-spray", run="team-a/spray", triggered_by="alice")
    identity = RunIdentity(namespace="team-a", name="spray", uid="uid-spray", attempt=1, fence=1)
    recorder = Recorder(store, holder, identity, Progress(), {"gpt": "team-a/openai"})
    before = REGISTRY.get_sample_value(
        "ksquad_model_calls_total",
        {"namespace": "team-a", "credential": "", "model": OTHER_MODEL, "user": "alice"},
    )
    for n in range(3):
        report = {"callId": str(n), "model": f"made-up-{n}", "inputTokens": 5, "outputTokens": 1}
        await recorder.usage(report)
    await recorder.usage({"callId": "9", "model": "gpt", "inputTokens": 5, "outputTokens": 1})
    after = REGISTRY.get_sample_value(
        "ksquad_model_calls_total",
        {"namespace": "team-a", "credential": "", "model": OTHER_MODEL, "user": "alice"},
    )
    assert (after or 0) - (before or 0) == 3
    assert (
        REGISTRY.get_sample_value(
            "ksquad_model_calls_total",
            {"namespace": "team-a", "credential": "", "model": "made-up-0", "user": "alice"},
        )
        is None
    )
    by_model = {u.key: u.calls for u in await store.usage("model", clock())}
    assert by_model == {"made-up-0": 1, "made-up-1": 1, "made-up-2": 1, "gpt": 1}, "the store keeps the names"


async def test_a_resumed_agents_reports_of_earlier_attempts_are_recorded_once_and_no_later_one(
    store: Store, clock: Clock
) -> None:
    """The orchestrator can die between an agent's report and its row (the worker killed with the sandbox): the retry's
    agent sends the recorded turns' reports again, each with its attempt (agent.journal). A call already recorded
    stays one row; a report naming an attempt after the current one is dropped."""
    holder = Holder(uid="uid-resumed", run="team-r/resumed", triggered_by="alice")

    def recorder(attempt: int) -> Recorder:
        identity = RunIdentity(
            namespace="team-r", name="resumed", uid="uid-resumed", attempt=attempt, fence=attempt
        )
        return Recorder(store, holder, identity, Progress(), {"gpt": "team-r/openai"})

    def report(call_id: str, **more: object) -> dict[str, object]:
        return {"callId": call_id, "model": "gpt", "inputTokens": 10, "outputTokens": 2, **more}

    await recorder(1).usage(report("1"))  # attempt 1 recorded its first call; its second report was lost
    await store.begin_attempt(holder, 2)
    again = [report("1", attempt=1), report("2", attempt=1), report("2", attempt=1), report("1", attempt=3)]
    await recorder(2).status(TaskState.TASK_STATE_WORKING, Message(), {USAGE_KEY: again})
    await recorder(2).usage(report("1"))  # attempt 2's own first call
    first, second = [await store.run_usage("uid-resumed", a) for a in (1, 2)]
    assert (first.calls, first.input_tokens, second.calls) == (2, 20, 1)
    assert (await store.run_usage("uid-resumed", 3)).calls == 0
    rows = await store.usage("credential", clock(), namespace="team-r")
    assert {u.key: u.calls for u in rows} == {"team-r/openai": 3}, "charged to the contract's credential"
