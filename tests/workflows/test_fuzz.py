"""Fuzzing what anyone can send ksquad, with Hypothesis against the real decoders and a real workflow.

- Every decoder of a signal's payload (temporal_client.proofs: the bounded parser, the proof's unwrapping) takes
  any bytes and returns; nothing it can raise escapes.
- The worker's reading of an agent's answer (activities.agents.a2a_compat) gives back every line within its bound
  exactly as sent, however the stream is cut, and refuses a longer one with its reason.
- A paused Run on the dev server takes volleys of random signals (names, counts, encodings, nesting, sizes, proof
  shapes and bodies) from a client without the seal key, with and without the codec: no workflow task fails, its
  state does not move, and it still resumes when the bridge says so and succeeds.

`make test` runs each with a fixed seed and a small budget; `make fuzz` (KSQUAD_FUZZ=1) runs a longer search with
a random seed and says what it tried (the statistics Hypothesis prints)."""

import contextlib
import json
import os
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.service import RPCError

from activities.agents.a2a_compat import MAX_ANSWER_LINE, A2ACompatTransport, AnswerTooLarge
from temporal_client.codec import ENCODING, KEY_ID
from temporal_client.proofs import NOT_JSON, SignalKey, bounded_json
from tests.workflows.test_signals import (  # the volley's clients and the checks after it
    Clients,
    clients,  # noqa: F401  (fixtures)
    no_failed_task,
    ns,  # noqa: F401
    run_state,
    unmoved,
    world,  # noqa: F401
)
from tests.workflows.world import World, hang, ok, run_input, start_run
from workflows.activity_types import Activity
from workflows.signals import RunSignal
from workflows.status import Phase

FUZZING = os.environ.get("KSQUAD_FUZZ") == "1"
# In the suite: fixed examples, a small budget. `make fuzz`: random, long.
BUDGET = settings(
    max_examples=2000 if FUZZING else 60,
    derandomize=not FUZZING,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
WORKFLOW_BUDGET = settings(BUDGET, max_examples=200 if FUZZING else 8)

# JSON of any shape: the leaves, then lists and objects of them, nested.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=40,
)


def proof_shaped(body: Any) -> Any:
    return {"ksquadProof": {"by": "bridge", "nonce": "1.00", "mac": "00"}, "body": body}


# A signal's payload as raw bytes: JSON of any shape (bare, or in a proof's shape), JSON nested deep, arbitrary
# bytes (not JSON, not UTF-8), or a proof's shape with the wrong types in it.
payload_bytes = st.one_of(
    json_values.map(lambda v: _dumps(v)),
    json_values.map(lambda v: _dumps(proof_shaped(v))),
    st.integers(min_value=1, max_value=5000).map(lambda d: b"[" * d + b"]" * d),
    st.integers(min_value=1, max_value=5000).map(lambda d: b'{"a":' * d + b"1" + b"}" * d),
    st.binary(max_size=200),
    st.fixed_dictionaries(
        {
            "ksquadProof": st.one_of(
                json_values, st.fixed_dictionaries({"by": json_values, "nonce": json_values})
            )
        }
    ).map(lambda v: _dumps(v)),
)


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


@BUDGET
@given(payload_bytes)
def test_the_signal_decoders_take_any_bytes_and_return(data: bytes) -> None:
    parsed = bounded_json(data)
    assert parsed is NOT_JSON or isinstance(parsed, dict | list | str | int | float | bool | type(None))
    payload = Payload(metadata={"encoding": b"json/plain"}, data=data)
    unwrapped, proof = SignalKey(b"k" * 32).unwrap("wf", "chain", "pause", [payload])
    assert proof is None, "no proof verifies without the key"
    assert len(unwrapped) <= 1


@BUDGET
@given(
    lines=st.lists(st.binary(max_size=300).map(lambda b: b.replace(b"\n", b" ") + b"\n"), max_size=12),
    cuts=st.lists(st.integers(min_value=1, max_value=97), min_size=1, max_size=8),
)
async def test_an_agents_answer_reads_back_as_sent_however_it_is_cut(
    lines: list[bytes], cuts: list[int]
) -> None:
    sent = b"".join(lines)
    chunks, at, i = [], 0, 0
    while at < len(sent):
        chunks.append(sent[at : at + cuts[i % len(cuts)]])
        at += cuts[i % len(cuts)]
        i += 1
    assert await _read(chunks) == sent


async def test_a_line_one_byte_past_its_bound_is_refused_and_one_at_it_is_read() -> None:
    at_bound = b"x" * (MAX_ANSWER_LINE - 1) + b"\n"
    assert await _read([at_bound[i : i + 65536] for i in range(0, len(at_bound), 65536)]) == at_bound
    past = b"x" * (MAX_ANSWER_LINE + 1) + b"\n"
    with pytest.raises(AnswerTooLarge):
        await _read([past[i : i + 65536] for i in range(0, len(past), 65536)])


async def _read(chunks: list[bytes]) -> bytes:
    class Chunks(httpx.AsyncByteStream):
        async def __aiter__(self) -> Any:
            for chunk in chunks:
                yield chunk

    transport = A2ACompatTransport(httpx.MockTransport(lambda _: httpx.Response(200, stream=Chunks())))
    async with httpx.AsyncClient(transport=transport) as http:
        return (await http.get("http://agent.test/")).content


# Every name but `cancel`, which anyone may send and which ends the Run, as it should (tests/workflows/test_signals.py).
SIGNAL_NAMES = [
    *(s.value for s in RunSignal if s != RunSignal.CANCEL),
    "",
    "x" * 300,
    "pause\x00",
    "__stack_trace",
]

# One signal as anyone may send it: a name (ksquad's or not), 0-3 payloads, each in clear or as if encrypted, and
# which client sends it (with the codec, which encrypts, or without).
one_signal = st.tuples(
    st.sampled_from(SIGNAL_NAMES) | st.text(max_size=20).filter(lambda name: name != RunSignal.CANCEL),
    st.lists(
        st.one_of(
            payload_bytes.map(lambda d: ("json", d)),
            st.binary(min_size=0, max_size=64).map(lambda d: ("encrypted-looking", d)),
        ),
        max_size=3,
    ),
    st.sampled_from(["codec_holder", "in_clear"]),
)


def _raw(kind: str, data: bytes) -> RawValue:
    if kind == "json":
        return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data))
    return RawValue(Payload(metadata={"encoding": ENCODING, KEY_ID: b"0123456789ab"}, data=data))


@pytest.fixture
async def paused_run(clients: Clients, world: World, ns: str) -> Any:  # noqa: F811
    world.scripts["r"] = [hang(), ok()]
    handle = await start_run(clients.ksquad, run_input("r", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    await handle.signal(RunSignal.PAUSE, "by the bridge")
    await world.until_phase("r", "Paused")
    yield handle
    await handle.signal(RunSignal.RESUME)
    assert (await handle.result()).phase == Phase.SUCCEEDED, "it still resumes and succeeds"
    assert len(world.calls_of(Activity.INVOKE_AGENT, "r")) == 2, "no signal started an attempt"


@WORKFLOW_BUDGET
@given(volley=st.lists(one_signal, min_size=1, max_size=12))
async def test_a_paused_run_takes_any_volley_of_signals_and_nothing_moves(
    clients: Clients,  # noqa: F811
    paused_run: Any,
    volley: list[tuple[str, list[tuple[str, bytes]], str]],
) -> None:
    before = await run_state(clients, paused_run.id)
    for name, payloads, which in volley:
        client = getattr(clients, which)
        # What the server itself refuses (an empty name, say) never reaches the workflow.
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(paused_run.id).signal(
                name, args=[_raw(k, d) for k, d in payloads]
            )
    await paused_run.signal(RunSignal.REFERENCES_UPDATED)  # proven, after the volley: it was all handled
    unmoved(before, await run_state(clients, paused_run.id))
    await no_failed_task(paused_run)
