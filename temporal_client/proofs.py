"""Proofs on signals: who sent a signal, shown with the seal key that only the bridge and the worker hold.

Temporal tells a workflow nothing about who sent it a signal, and every client of the namespace may send any
signal to any workflow. So each signal a ksquad component sends is wrapped with a proof: its one payload becomes
`{"ksquadProof": {...}, "body": <the payload>}` (no body for a signal without one), where the proof is an HMAC with
the seal key over the target workflow, the signal's name, the body, who sends it (`by`: the bridge, a worker
activity on behalf of the workflow it runs for, a workflow), that sender's workflow and execution, the execution
of the target it is meant for (when the sender knows it) and a nonce. The worker unwraps it before the handler
runs (worker.seals), and the workflow's inbox (workflows.inbox) takes each proof once, ever. A copy of a signal
from history carries a proof already taken, or issued before those the workflow forgot; a signal to another
workflow, or to another execution of the same workflow id, does not verify. (The proof travels in the payload, not in a header: the time-skipping test server
drops the headers of a signal-with-start and of a workflow's signal to another.)

Senders sign through `SignalProver`, a client interceptor: every signal the client sends (and the signal of a
signal-with-start) is signed as `SIGNING` says at the time, else as the client's default. A client without one
(the ksquad CLI, a user's `temporal` CLI) signs nothing, and its signals are taken only where the design leaves
them open (cancel).
"""

import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import temporalio.client
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadConverter

from workflows.inbox import Proof, Sender

PROOF_KEY = "ksquadProof"
BODY_KEY = "body"
PROOF_VERSION = "signal-v1"


@dataclass(frozen=True)
class Signing:
    """Who a signal is sent as."""

    by: Sender
    sender: str = ""  # the workflow a worker activity runs for, or the sending workflow
    sender_chain: str = ""  # its first run id
    to_chain: str = ""  # the target's first run id, when the sender knows which execution it means


# What the signals sent in this context are signed as (worker.seals sets it around each activity).
SIGNING: ContextVar[Signing | None] = ContextVar("ksquad_signing", default=None)


@contextlib.contextmanager
def signing_as(signing: Signing) -> Iterator[None]:
    token = SIGNING.set(signing)
    try:
        yield
    finally:
        SIGNING.reset(token)


# What a signal's payload may be, as anyone may send one: ksquad's own are a few kilobytes, a few levels deep.
MAX_SIGNAL_BYTES = 1 << 20
MAX_SIGNAL_DEPTH = 32
NOT_JSON = object()


def bounded_json(data: bytes) -> Any:
    """`data` parsed as JSON, or NOT_JSON: not JSON, over MAX_SIGNAL_BYTES, or nested deeper than MAX_SIGNAL_DEPTH.
    Nothing else escapes: a parser that recursed past the interpreter's limit (`[[[[...]]]]` a few thousand deep)
    raised RecursionError, which no handler caught, and the workflow task failed on every retry."""
    if len(data) > MAX_SIGNAL_BYTES:
        return NOT_JSON
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        return NOT_JSON
    level, deepest = [(value, 1)], 1
    while level:  # no recursion of our own: by levels, and only containers
        value_at, depth = level.pop()
        deepest = max(deepest, depth)
        if deepest > MAX_SIGNAL_DEPTH:
            return NOT_JSON
        children = (
            value_at.values()
            if isinstance(value_at, dict)
            else value_at
            if isinstance(value_at, list)
            else ()
        )
        level.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


class SignalKey:
    """The MACs of signal proofs, with the seal key (temporal_client.seal.Sealer holds it)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _mac(self, target: str, signal: str, body: bytes | None, signing: Signing, nonce: str) -> str:
        parts = (
            PROOF_VERSION,
            target,
            signal,
            signing.by.value,
            signing.sender,
            signing.sender_chain,
            signing.to_chain,
            nonce,
            "-" if body is None else hashlib.sha256(body).hexdigest(),
        )
        return hmac.new(self._key, "\0".join(parts).encode(), hashlib.sha256).hexdigest()

    def wrap(
        self, target: str, signal: str, body: Any, has_body: bool, signing: Signing, nonce: str
    ) -> dict[str, Any]:
        """The signal's one argument, proven: `body` is its payload as JSON (ignored when not `has_body`)."""
        proof = {
            "by": signing.by.value,
            "sender": signing.sender,
            "senderChain": signing.sender_chain,
            "toChain": signing.to_chain,
            "nonce": nonce,
            "mac": self._mac(target, signal, _canonical(body) if has_body else None, signing, nonce),
        }
        return {PROOF_KEY: proof, BODY_KEY: body} if has_body else {PROOF_KEY: proof}

    def unwrap(
        self, target: str, chain: str, signal: str, payloads: Sequence[Payload]
    ) -> tuple[list[Payload], Proof | None]:
        """The signal's payloads as its handler takes them, and the proof they carried (None: none, or one that
        does not verify, or is meant for another execution of `target`, whose current one is `chain`)."""
        if len(payloads) != 1:
            return list(payloads), None
        wrapped = bounded_json(payloads[0].data)
        if not isinstance(wrapped, dict) or PROOF_KEY not in wrapped or set(wrapped) - {PROOF_KEY, BODY_KEY}:
            return list(payloads), None
        unwrapped = []
        if BODY_KEY in wrapped:
            body = Payload()
            body.CopyFrom(payloads[0])  # the codec's marks (in clear, unreadable) stay with the body
            body.data = json.dumps(wrapped[BODY_KEY]).encode()
            unwrapped.append(body)
        return unwrapped, self._verified(target, chain, signal, wrapped)

    def _verified(self, target: str, chain: str, signal: str, wrapped: dict[str, Any]) -> Proof | None:
        try:
            proof = wrapped[PROOF_KEY]
            signing = Signing(
                by=Sender(proof["by"]),
                sender=str(proof["sender"]),
                sender_chain=str(proof["senderChain"]),
                to_chain=str(proof["toChain"]),
            )
            nonce, mac = str(proof["nonce"]), str(proof["mac"])
        except (ValueError, KeyError, TypeError):
            return None
        body = _canonical(wrapped[BODY_KEY]) if BODY_KEY in wrapped else None
        if not nonce or not hmac.compare_digest(mac, self._mac(target, signal, body, signing, nonce)):
            return None
        if signing.to_chain and signing.to_chain != chain:
            return None  # meant for another execution of this workflow id (an earlier Run of the same name)
        return Proof(by=signing.by, sender=signing.sender, sender_chain=signing.sender_chain, nonce=nonce)

    def signed_args(
        self,
        converter: PayloadConverter,
        target: str,
        signal: str,
        args: Sequence[Any],
        signing: Signing,
        nonce: str,
    ) -> list[Any]:
        """A signal's arguments as sent with a proof: its one payload (or none) wrapped. Signals with more
        arguments are none of ksquad's: sent as they are."""
        if len(args) > 1:
            return list(args)
        body = json.loads(converter.to_payload(args[0]).data) if args else None
        return [self.wrap(target, signal, body, bool(args), signing, nonce)]


def issued_nonce() -> str:
    """A client's nonce: when it was issued (milliseconds since the epoch, this machine's clock), then 96 random
    bits. The MAC covers it, so the time cannot be changed; a workflow refuses a proof issued before the ones it
    has forgotten (workflows.inbox), so a copy is refused however many signals came between. To a worker that
    reads no time in it, it is a nonce as any other."""
    return f"{time.time_ns() // 1_000_000}.{secrets.token_hex(12)}"


class SignalProver(temporalio.client.Interceptor):
    """Signs every signal its client sends: as `SIGNING` says, else as `default` (None: signs nothing then)."""

    def __init__(self, key: SignalKey, converter: PayloadConverter, default: Signing | None) -> None:
        self.key = key
        self.converter = converter
        self.default = default

    def intercept_client(
        self, next: temporalio.client.OutboundInterceptor
    ) -> temporalio.client.OutboundInterceptor:
        return _SigningOutbound(next, self)

    def signed(self, target: str, signal: str, args: Sequence[Any]) -> list[Any]:
        signing = SIGNING.get() or self.default
        if signing is None:
            return list(args)
        return self.key.signed_args(self.converter, target, signal, args, signing, issued_nonce())


class _SigningOutbound(temporalio.client.OutboundInterceptor):
    def __init__(self, next: temporalio.client.OutboundInterceptor, prover: SignalProver) -> None:
        super().__init__(next)
        self.prover = prover

    async def signal_workflow(self, input: temporalio.client.SignalWorkflowInput) -> None:
        input.args = self.prover.signed(input.id, input.signal, input.args)
        await super().signal_workflow(input)

    async def start_workflow(
        self, input: temporalio.client.StartWorkflowInput
    ) -> temporalio.client.WorkflowHandle[Any, Any]:
        if input.start_signal is not None:  # a signal-with-start: its signal is proven as any other
            input.start_signal_args = self.prover.signed(
                input.id, input.start_signal, input.start_signal_args
            )
        return await super().start_workflow(input)
