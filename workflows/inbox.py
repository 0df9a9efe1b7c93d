"""Signals, taken so that no sender can break a workflow, and acted on only when the right component sent them.

Any client of the Temporal namespace can signal any workflow with any arguments. The SDK calls a named handler
with whatever arrives, so a signal with one argument too many raised `TypeError` inside the workflow task, which
then failed on every retry, forever (temporalio/sdk-python #355). So no ksquad workflow has a named signal
handler: each has one dynamic handler that hands the raw payloads to its `Inbox`, and the inbox decodes them
itself. A signal whose name is unknown, whose arguments are not the one payload (or none) its handler takes, or
whose payload does not decode (in clear, undecryptable, the wrong type) is recorded (a warning in the worker's
log, `ksquad_signals_refused_total{workflow,signal,reason}`) and ignored.

A signal that changes what the worker does is taken only with a proof: the worker's interceptor
(worker.seals) checks each signal's `ksquad-proof` header, an HMAC with the seal key that only the bridge and the
worker hold over the target workflow, the signal, its payload and a nonce, and puts what it proved in
`SIGNAL_PROOF` while the handler runs. Each signal names the senders it takes (`Accepts.proven_by`); a proof is
taken once, ever, so a signal copied from history and sent again changes nothing: its nonce is remembered, and a
client's nonce says when it was issued (temporal_client.proofs.issued_nonce): once a workflow forgets a nonce
(it keeps the latest `remembered`), it refuses every proof issued no later than the one forgotten. Only
`cancel` is open to every client, as the design promises (`temporal workflow signal --name cancel`).
"""

import re
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue


class Sender(StrEnum):
    """Who may prove a signal: each holds the seal key."""

    BRIDGE = "bridge"  # the CRD bridge (annotations, credential rotations), or the embedded stack's
    WORKER = "worker"  # an activity of the worker, on behalf of the workflow it runs for
    WORKFLOW = "workflow"  # a ksquad workflow (an entity), signed by the worker that runs it


@dataclass(frozen=True)
class Proof:
    """What the interceptor proved about the signal being handled."""

    by: Sender
    sender: str  # the sending workflow's id (WORKER, WORKFLOW), or ""
    sender_chain: str  # that workflow's first run id: which execution of it, or ""
    nonce: str


# Set by the worker's interceptor around each signal handler: None when the signal carries no valid proof.
SIGNAL_PROOF: ContextVar[Proof | None] = ContextVar("ksquad_signal_proof", default=None)

# Proofs remembered per workflow (a FIFO): a Run is sent few proven signals. One issued before the latest
# forgotten is refused (Inbox.floor): only a proof that came this many later than one issued after it would be
# refused wrongly, and a Run's senders (the bridge, its entities) send one at a time.
REMEMBERED_NONCES = 256
# A client's nonce: the time it was issued (ms since the epoch), a dot, random hex (temporal_client.proofs).
ISSUED_NONCE = re.compile(r"(\d{1,15})\.[0-9a-f]{16,64}")
# Workflows started before signals carried proofs take unproven ones while they replay and until they continue
# as new (their histories hold signals without proofs).
SIGNAL_PROOFS_PATCH = "signal-proofs"
# The longest text a signal's payload may put into a status (a reason, an answer is the input signal's own).
MAX_REASON = 500


@dataclass(frozen=True)
class Accepts:
    """What a signal takes: one payload of `payload`'s type (None: no payload), which may be left out when
    `optional`; and who may send it (`proven_by`; None: any client)."""

    payload: Any = None
    optional: bool = False
    proven_by: frozenset[Sender] | None = None
    in_clear: bool = False  # the payload may come unencrypted (cancel's reason, from the Temporal CLI)


OPEN = None  # proven_by: any Temporal client may send it


@dataclass(frozen=True)
class Handler:
    accepts: Accepts
    # called with the payload (None when there is none) and the Proof (None for an open signal, and for one
    # replayed from a history before proofs)
    take: Callable[[Any, Proof | None], None]


class Refused(Exception):
    """Why a signal was ignored: `code` (a metric label, from a fixed set) and the detail (the log line)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


class Inbox:
    """One workflow's signal handlers by name, and the nonces of the proofs it took (carried over continue-as-new
    by the workflow that owns `nonces`)."""

    def __init__(
        self,
        workflow_type: str,
        handlers: dict[str, Handler],
        nonces: list[str],
        patched: Callable[[str], bool] = workflow.patched,
        remembered: int = REMEMBERED_NONCES,
        floor: int = 0,
    ) -> None:
        self.workflow_type = workflow_type
        self.patched = patched  # the owner's (workflows.patches), or the SDK's
        self.handlers = handlers
        self.nonces = nonces
        self.remembered = remembered
        # Proofs issued at or before it are refused: the latest issue time among the nonces forgotten.
        self.floor = floor

    def deliver(self, name: str, args: Sequence[RawValue]) -> None:
        handler = self.handlers.get(name)
        try:
            if handler is None:
                raise Refused("unknown", "no such signal")
            value = _payload(handler.accepts, args)
            proof = self._proof(handler.accepts)
        except Refused as why:
            refused(self.workflow_type, name, why, known=handler is not None)
            return
        handler.take(value, proof)

    def _proof(self, accepts: Accepts) -> Proof | None:
        if accepts.proven_by is None:
            return None
        proof = SIGNAL_PROOF.get()
        if proof is None:
            if not self.patched(SIGNAL_PROOFS_PATCH):
                return None  # replaying a history from before proofs: taken as it was
            raise Refused("unproven", "no valid proof (only the bridge and the worker may send it)")
        if proof.by not in accepts.proven_by:
            raise Refused("wrong_sender", f"proved by the {proof.by}, which may not send it")
        issued = issued_at(proof.nonce)
        if issued and issued <= self.floor:
            raise Refused(
                "replayed", "a proof issued before those already forgotten (a copy of an earlier signal)"
            )
        if proof.nonce in self.nonces:
            raise Refused("replayed", "a proof already taken (a copy of an earlier signal)")
        self.nonces.append(proof.nonce)
        for forgotten in self.nonces[: -self.remembered]:
            self.floor = max(self.floor, issued_at(forgotten))
        del self.nonces[: -self.remembered]
        return proof


def issued_at(nonce: str) -> int:
    """When a client's nonce was issued (ms since the epoch); 0 for a workflow's nonce, or one from before."""
    match = ISSUED_NONCE.fullmatch(nonce)
    return int(match.group(1)) if match else 0


def _payload(accepts: Accepts, args: Sequence[RawValue]) -> Any:
    """The payload, decoded; None for a signal that takes none (or left an optional one out)."""
    if accepts.payload is None:
        if args:
            raise Refused("arguments", f"takes no payload, got {len(args)}")
        return None
    if not args:
        if accepts.optional:
            return None
        raise Refused("arguments", "takes one payload, got none")
    if len(args) > 1:
        raise Refused("arguments", f"takes one payload, got {len(args)}")
    # A payload that may come in clear is read untyped (ksquad's converter builds no typed value from one), and
    # must be text: cancel's reason.
    hint = Any if accepts.in_clear else accepts.payload
    try:
        value = workflow.payload_converter().from_payload(args[0].payload, hint)
    except Exception as err:  # in clear, undecryptable or not JSON: whatever the converter refuses
        raise Refused("payload", f"its payload does not decode ({type(err).__name__})") from None
    if accepts.in_clear and not isinstance(value, str) and not (value is None and accepts.optional):
        raise Refused("payload", f"its payload is not text ({type(value).__name__})")
    return value


def printable(text: str, limit: int = MAX_REASON) -> str:
    """Text from a signal as a status may show it: no control characters, bounded."""
    cleaned = "".join(c if c.isprintable() else " " for c in text)
    return cleaned[:limit]


def refused(workflow_type: str, signal: str, why: Refused, known: bool = True) -> None:
    """Recorded once (never while replaying): a log line naming the workflow, and a counter (its labels from
    fixed sets: a sender cannot make new series)."""
    info = workflow.info()
    workflow.logger.warning(
        "ignored signal %r to %s %s: %s", printable(signal, 100), workflow_type, info.workflow_id, why
    )
    workflow.metric_meter().create_counter(
        "ksquad_signals_refused", "signals a ksquad workflow recorded and ignored"
    ).add(1, {"workflow": workflow_type, "signal": signal if known else "(unknown)", "reason": why.code})
