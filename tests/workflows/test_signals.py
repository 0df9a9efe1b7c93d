"""No signal can fail a workflow task, and a signal changes what the worker does only when the component allowed
to send it did (workflows.inbox, temporal_client.proofs).

Tried as a client of the Temporal namespace would, on the dev server with the codec on: every signal of every
ksquad workflow with no payload, an extra one, two extra ones, a payload of the wrong type, a payload in clear
(no codec), a payload that does not decrypt, payloads nested past the parser's limit or big (HOSTILE), and a
well-formed payload from a client that holds the codec but not the seal key (the codec endpoint encrypts for whoever may decode). After each volley the workflow's state is what
it was, its history has no failed workflow task, and the workflow still does its job: a paused Run resumes when
the bridge says so and succeeds, a queued one is admitted when its slot is freed, a gate still admits, a
credential is still throttled by a real limit only.
"""

import os
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RawValue

from dev.devserver import DevServer
from temporal_client.codec import ENCODING, KEY_ID, EncryptionCodec
from temporal_client.connection import connect
from tests.workflows.world import World, block, hang, ok, run_input, serving, start_run
from workflows.activity_types import Activity
from workflows.contract import ConcurrencyScope
from workflows.entity_types import (
    CredentialLimit,
    CredentialState,
    CredentialSubscription,
    GateState,
    SlotNotice,
    SlotRelease,
    SlotRequest,
    ThrottleNotice,
    credential_workflow_id,
    gate_workflow_id,
    key_run,
)
from workflows.inbox import REMEMBERED_NONCES
from workflows.signals import RunSignal
from workflows.status import Phase, RunStatus


@dataclass
class Clients:
    ksquad: Client  # the bridge's and the worker's: codec and seal key
    codec_holder: Client  # encrypts with the codec, holds no seal key
    in_clear: Client  # no codec at all


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
async def clients(dev_server: DevServer, world: World) -> AsyncIterator[Clients]:
    codec = EncryptionCodec(secrets.token_bytes(32))
    async with serving(await connect(dev_server.target, codec=codec), world) as ksquad:
        codec_holder = await connect(dev_server.target, codec=codec)
        yield Clients(ksquad, codec_holder, await connect(dev_server.target))


@pytest.fixture
def ns() -> str:
    return f"s-{uuid.uuid4().hex[:8]}"


def garbage() -> RawValue:
    """A payload that claims to be encrypted and is not (sent by a client without the codec, as it is)."""
    return RawValue(Payload(metadata={"encoding": ENCODING, KEY_ID: b"0123456789ab"}, data=os.urandom(48)))


def raw_json(data: bytes) -> RawValue:
    """JSON bytes as a payload, as they are: what a client of the namespace may send (the SDK's own converter could
    not even encode the deepest of these)."""
    return RawValue(Payload(metadata={"encoding": b"json/plain"}, data=data))


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def proof_around(body: bytes) -> bytes:
    return b'{"ksquadProof": {"by": "bridge", "nonce": "n", "mac": "m"}, "body": ' + body + b"}"


# Payloads no decoder may choke on, whatever the signal: nested past the parser's recursion limit (it raised
# RecursionError, which failed the workflow task on every retry: the workflow took nothing more, not even a cancel),
# nested deep enough to parse but not to take, bare or inside a proof's shape, in clear and encrypted; and big
# (of no signal's type: a long text is a well-formed reason).
HOSTILE = [
    ("nested 100,000 deep, in clear", "in_clear", [raw_json(nested(100_000))]),
    ("nested 100,000 deep", "codec_holder", [raw_json(nested(100_000))]),
    ("nested 900 deep", "codec_holder", [raw_json(nested(900))]),
    (
        "a proof's shape around a body nested 100,000 deep",
        "codec_holder",
        [raw_json(proof_around(nested(100_000)))],
    ),
    (
        "a proof's shape around a body nested 900 deep, in clear",
        "in_clear",
        [raw_json(proof_around(nested(900)))],
    ),
    ("a list of 750,000 numbers (1.5 MB)", "codec_holder", [raw_json(b"[" + b"0," * 750_000 + b"0]")]),
]


def volley(good: Any, takes_payload: bool, proven: bool) -> list[tuple[str, str, list[Any]]]:
    """(what, which client, arguments) of every bad way to send a signal whose well-formed payload is `good`."""
    wrong_type = {"unexpected": 1} if isinstance(good, str) else 42
    sends = [
        ("two payloads", "codec_holder", [good, good]),
        ("three payloads", "codec_holder", [good, good, good]),
        ("undecryptable", "in_clear", [garbage()]),
        *HOSTILE,
    ]
    if takes_payload:
        sends += [("wrong type", "codec_holder", [wrong_type])]
        if good is not None and not isinstance(good, str):
            sends += [("none when one is needed", "codec_holder", []), ("in clear", "in_clear", [good])]
    else:
        sends += [("a payload when none is taken", "codec_holder", [good or "x"])]
    if proven:  # well formed, encrypted, but not sent by the bridge or the worker
        sends += [("unproven", "codec_holder", [good] if takes_payload and good is not None else [])]
        sends += [("unproven, in clear", "in_clear", [good] if takes_payload and good is not None else [])]
    return sends


async def send_volley(
    clients: Clients, workflow_id: str, signal: str, sends: list[tuple[str, str, list[Any]]]
) -> None:
    for _, which, args in sends:
        client: Client = getattr(clients, which)
        await client.get_workflow_handle(workflow_id).signal(signal, args=args)


# The SDK's deadlock detector fails a task that holds the CPU for 2 s: on a 2-core machine running the cluster
# tests beside these, that is the machine's load, not a signal (a handler that spun would never pass alone).
DEADLOCK_DETECTED = "[TMPRL1101]"
# Failures the server writes about a task in flight, not about the workflow's code: signals buffered past the
# server's size limit while a task runs (a volley of 1.5 MB bodies) fail that task and schedule the next one
# (FORCE_CLOSE_COMMAND), and so does a sticky worker's timeout or new events arriving as the task completes.
SERVER_WRITTEN = {
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
}


async def no_failed_task(handle: WorkflowHandle[Any, Any]) -> None:
    codec = handle._client.data_converter.payload_codec
    assert codec is not None
    failed = []
    async for e in handle.fetch_history_events():
        if e.HasField("workflow_task_failed_event_attributes"):
            failure = e.workflow_task_failed_event_attributes.failure
            if e.workflow_task_failed_event_attributes.cause in SERVER_WRITTEN:
                continue
            await codec.decode_failure(failure)  # the message is encrypted with the rest of the failure
            cause = WorkflowTaskFailedCause.Name(e.workflow_task_failed_event_attributes.cause)
            if not failure.message.startswith(DEADLOCK_DETECTED):
                failed.append(f"{cause}: {failure.message} {failure.stack_trace}")
    assert failed == [], f"a signal failed a workflow task: {failed[0]}"


async def run_state(clients: Clients, workflow_id: str) -> RunStatus:
    state: RunStatus = await clients.ksquad.get_workflow_handle(workflow_id).query(
        "state", result_type=RunStatus
    )
    return state


def unmoved(before: RunStatus, after: RunStatus) -> None:
    """The Run's state as it was: its phase, why it is paused, its status revision and its message."""
    assert (after.phase, after.pause_reason, after.revision, after.message) == (
        before.phase,
        before.pause_reason,
        before.revision,
        before.message,
    )


# Every signal of the Run workflow with a well-formed payload (None: it takes none) and whether it needs a proof.
RUN_SIGNALS: list[tuple[str, Callable[[str], Any], bool, bool]] = [
    (RunSignal.CANCEL, lambda ns: "stop it", True, False),
    (RunSignal.PAUSE, lambda ns: "hold it", True, True),
    (RunSignal.RESUME, lambda ns: None, False, True),
    (RunSignal.INPUT, lambda ns: "the answer", True, True),
    (RunSignal.CREDENTIAL_REFRESHED, lambda ns: f"{ns}/dev-1-key", True, True),
    (RunSignal.REFERENCES_UPDATED, lambda ns: None, False, True),
    (
        RunSignal.CREDENTIAL_THROTTLED,
        lambda ns: ThrottleNotice(
            key=f"{ns}/dev-1-key", until=datetime.now(UTC) + timedelta(hours=1), strikes=1
        ),
        True,
        True,
    ),
    (RunSignal.SLOT_GRANTED, lambda ns: SlotNotice(scope=f"ns/{ns}"), True, True),
    (RunSignal.SLOT_QUEUED, lambda ns: SlotNotice(scope=f"ns/{ns}", position=9), True, True),
    ("no-such-signal", lambda ns: "x", True, False),
]


@pytest.mark.parametrize(("signal", "good", "takes", "proven"), RUN_SIGNALS, ids=[s[0] for s in RUN_SIGNALS])
async def test_a_paused_run_takes_no_bad_signal_and_resumes_when_the_bridge_says_so(
    clients: Clients,
    world: World,
    ns: str,
    signal: str,
    good: Callable[[str], Any],
    takes: bool,
    proven: bool,
) -> None:
    world.scripts["r"] = [hang(), ok()]
    handle = await start_run(clients.ksquad, run_input("r", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    await handle.signal(RunSignal.PAUSE, "by the bridge")
    await world.until_phase("r", "Paused")
    before = await run_state(clients, handle.id)

    await send_volley(clients, handle.id, signal, volley(good(ns), takes, proven))
    await handle.signal(RunSignal.REFERENCES_UPDATED)  # a proven signal after the volley: it was all handled

    unmoved(before, await run_state(clients, handle.id))
    assert len(world.calls_of(Activity.INVOKE_AGENT, "r")) == 1, "no signal started an attempt"
    await no_failed_task(handle)
    await handle.signal(RunSignal.RESUME)
    assert (await handle.result()).phase == Phase.SUCCEEDED


async def test_a_running_run_is_not_stopped_by_a_forged_limit_and_a_cancel_in_clear_still_cancels(
    clients: Clients, world: World, ns: str
) -> None:
    world.scripts["r"] = [block()]
    handle = await start_run(clients.ksquad, run_input("r", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    notice = ThrottleNotice(key=f"{ns}/dev-1-key", until=datetime.now(UTC) + timedelta(hours=1), strikes=3)
    for client in (clients.codec_holder, clients.in_clear):
        await client.get_workflow_handle(handle.id).signal(RunSignal.CREDENTIAL_THROTTLED, notice)
        await client.get_workflow_handle(handle.id).signal(RunSignal.PAUSE, "forged")
    await handle.signal(RunSignal.REFERENCES_UPDATED)
    assert (await run_state(clients, handle.id)).phase == Phase.RUNNING
    assert world.cancelled == [], "the agent's task was not stopped"
    # `temporal workflow signal --name cancel --input '"..."'` from anyone: cancel is open, its reason in clear too
    await clients.in_clear.get_workflow_handle(handle.id).signal(RunSignal.CANCEL, "from the temporal CLI")
    status = await handle.result()
    assert (status.phase, status.message) == (Phase.CANCELLED, "from the temporal CLI")
    await no_failed_task(handle)


async def copied_signal(handle: WorkflowHandle[Any, Any], signal: str) -> list[RawValue]:
    """The payloads of the first `signal` in the workflow's history, as stored (encrypted, the proof inside)."""
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_signaled_event_attributes"):
            signaled = event.workflow_execution_signaled_event_attributes
            if signaled.signal_name == signal:
                return [RawValue(p) for p in signaled.input.payloads]
    raise AssertionError(f"no {signal} in {handle.id}'s history")


async def test_a_runs_own_signal_copied_from_its_history_is_refused_however_many_came_between(
    clients: Clients, world: World, ns: str
) -> None:
    """A proof is taken once, ever: the Run remembers the latest REMEMBERED_NONCES proofs, and refuses any proof
    issued before one it forgot. (Before: a `pause` copied from history was taken again once 256 proven signals
    had pushed its nonce out, as applying 300 Agents to a namespace does.)"""
    world.scripts["r"] = [hang(), block()]
    handle = await start_run(clients.ksquad, run_input("r", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    await handle.signal(RunSignal.PAUSE, "by the bridge")
    await world.until_phase("r", "Paused")
    await handle.signal(RunSignal.RESUME)
    await world.until_phase("r", "Running")
    pause = await copied_signal(handle, RunSignal.PAUSE)

    await clients.in_clear.get_workflow_handle(handle.id).signal(RunSignal.PAUSE, args=pause)  # remembered
    for _ in range(REMEMBERED_NONCES + 10):  # the bridge's own signals, proven, each taken
        await handle.signal(RunSignal.REFERENCES_UPDATED)
    await clients.in_clear.get_workflow_handle(handle.id).signal(RunSignal.PAUSE, args=pause)  # forgotten
    await handle.signal(RunSignal.REFERENCES_UPDATED)  # a proven signal after the copies: they were handled

    state = await run_state(clients, handle.id)
    assert state.phase == Phase.RUNNING, f"a copied pause was taken: {state.phase} {state.message}"
    assert len(world.calls_of(Activity.INVOKE_AGENT, "r")) == 2
    await no_failed_task(handle)
    world.release("r")
    assert (await handle.result()).phase == Phase.SUCCEEDED


async def test_a_queued_run_is_not_admitted_by_a_forged_grant_and_is_when_the_slot_frees(
    clients: Clients, world: World, ns: str
) -> None:
    scope = ConcurrencyScope(key=f"ns/{ns}", limit=1)
    world.scopes["holder"] = world.scopes["queued"] = [scope]
    world.scripts["holder"] = [block()]
    holder = await start_run(clients.ksquad, run_input("holder", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "holder")
    queued = await start_run(clients.ksquad, run_input("queued", namespace=ns))
    await world.until_phase("queued", "Queued")
    grant = SlotNotice(scope=scope.key)
    await send_volley(clients, queued.id, RunSignal.SLOT_GRANTED, volley(grant, True, True))
    # a grant copied from the gate's own signal to the holder, sent to the queued run: not its gate's notice for it
    await clients.codec_holder.get_workflow_handle(queued.id).signal(RunSignal.SLOT_GRANTED, grant)
    await queued.signal(RunSignal.REFERENCES_UPDATED)
    assert (await run_state(clients, queued.id)).phase == Phase.QUEUED
    assert world.calls_of(Activity.INVOKE_AGENT, "queued") == []
    await no_failed_task(queued)
    world.release("holder")
    assert (await holder.result()).phase == Phase.SUCCEEDED
    assert (await queued.result()).phase == Phase.SUCCEEDED


async def test_a_gate_takes_no_forged_or_malformed_message_and_still_admits(
    clients: Clients, world: World, ns: str
) -> None:
    scope = ConcurrencyScope(key=f"ns/{ns}", limit=1)
    world.scopes["holder"] = world.scopes["next"] = [scope]
    world.scripts["holder"] = [block()]
    holder = await start_run(clients.ksquad, run_input("holder", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "holder")
    gate = clients.ksquad.get_workflow_handle(gate_workflow_id(scope.key))
    before = await gate.query("state_query", result_type=GateState)
    assert [key_run(k)[0] for k in before.holders] == [holder.id]
    # the holder's slot freed, a stranger queued and the limit raised, by whoever holds the codec
    release = SlotRelease(run_id=holder.id)
    acquire = SlotRequest(run_id=f"{ns}/stranger", limit=50)
    await send_volley(clients, gate.id, "release", volley(release, True, True))
    await send_volley(clients, gate.id, "acquire", volley(acquire, True, True))
    await send_volley(clients, gate.id, "no-such-signal", volley("x", True, False))
    after = await gate.query("state_query", result_type=GateState)
    assert (after.holders, after.waiting, after.limit) == (before.holders, before.waiting, before.limit)
    await no_failed_task(gate)
    following = await start_run(clients.ksquad, run_input("next", namespace=ns))
    await world.until_phase("next", "Queued")
    world.release("holder")
    assert (await holder.result()).phase == Phase.SUCCEEDED
    assert (await following.result()).phase == Phase.SUCCEEDED


async def test_the_credential_entities_take_no_forged_limit_and_start_from_nothing_but_their_own_state(
    clients: Clients, world: World, ns: str
) -> None:
    """A forged limit would pause every run of the credential; an entity started by a stranger with a state of
    their choosing (a limit, subscribers) would carry it."""
    key = f"{ns}/dev-1-key"
    world.scripts["r"] = [block()]
    handle = await start_run(clients.ksquad, run_input("r", namespace=ns))
    await world.wait_entered(Activity.INVOKE_AGENT, "r")
    until = datetime.now(UTC) + timedelta(hours=1)
    limit = CredentialLimit(run_id=handle.id, until=until)
    throttle = clients.ksquad.get_workflow_handle(credential_workflow_id(key))  # the run subscribed to it
    for signal, good in (
        ("limited", limit),
        ("subscribe", CredentialSubscription(run_id=f"{ns}/stranger")),
        ("unsubscribe", CredentialSubscription(run_id=handle.id)),
        ("cleared", CredentialSubscription(run_id=handle.id)),
    ):
        await send_volley(clients, throttle.id, signal, volley(good, True, True))
    state = await throttle.query("state_query", result_type=CredentialState)
    assert (state.throttled_until, state.strikes, state.subscribers) == (None, 0, [handle.id])
    await no_failed_task(throttle)

    other = f"{ns}/other-key"
    forged = CredentialState(key=other, throttled_until=until, strikes=9, subscribers=[handle.id])
    stranger_throttle = await clients.codec_holder.start_workflow(
        "CredentialThrottle",
        forged,
        id=credential_workflow_id(other),
        task_queue="ksquad",
        start_signal="limited",
        start_signal_args=[limit],
    )
    announcer = await clients.codec_holder.start_workflow(
        "CredentialAnnouncer",
        {"key": key, "reporters": [limit.model_dump(mode="json")]},
        id=f"credential-limit/{key}",
        task_queue="ksquad",
        start_signal="limited",
        start_signal_args=[limit],
    )
    await send_volley(clients, announcer.id, "limited", volley(limit, True, True))
    state = await stranger_throttle.query("state_query", result_type=CredentialState)
    assert (state.throttled_until, state.strikes, state.subscribers) == (None, 0, [])
    await handle.signal(RunSignal.REFERENCES_UPDATED)
    assert (await run_state(clients, handle.id)).phase == Phase.RUNNING
    assert world.cancelled == [], "no forged limit stopped the agent"
    scheduled = [
        e
        async for e in announcer.fetch_history_events()
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == [], "the stranger's announcer announced nothing"
    for entity in (stranger_throttle, announcer):
        await no_failed_task(entity)
        await entity.terminate("test over")
    world.release("r")
    assert (await handle.result()).phase == Phase.SUCCEEDED
