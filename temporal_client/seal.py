"""Seals: how the worker tells what the bridge resolved (and the sandboxes it made itself) from what anyone who
can write to the Temporal namespace could hand it.

A Run's workflow input, its continue-as-new carry and every activity's arguments pass through Temporal, so a
client of the namespace could start a RunWorkflow whose resolution names any Secret as the credential, any
URL as the model or any image, or schedule an agent call at any endpoint. The bridge, which resolved the Run
against the API server, seals each eligible agent with a key it shares with the worker and no one else (not
the API, whose codec endpoint encrypts for whoever may use it): an HMAC-SHA256 over the Run's namespace and uid
and the agent as resolved (model URLs, credentials and the hosts they may go to, image, endpoint, tools, the
sandbox policy). The worker checks the seal before it makes a sandbox or calls an agent, and seals the sandbox
it made (its name, kind and endpoint, for that run and attempt) so that an agent call goes only to a sandbox
this worker made, or to the sealed agent's own endpoint. Anything else is refused with `Unsealed`.

The key is 32 random bytes in a file (`KSQUAD_SEAL_KEY_FILE`: the chart's Secret `<release>-seal-key`, mounted
into the bridge and the worker only; `.ksquad/seal.key` for the embedded stack). Rotating it refuses the
resolutions sealed before: restart the bridge and worker together, between runs.
"""

import hashlib
import hmac
import json
import os
from pathlib import Path
from typing import TypeVar

from temporal_client.codec import CodecKeyError, ensure_key_file, load_key
from temporal_client.proofs import SignalKey
from workflows.activity_types import Sandbox
from workflows.contract import ExecutionContract, Resolution
from workflows.envelope import RunEnvelope, Warrant

E = TypeVar("E", bound=RunEnvelope)

SEAL_KEY_FILE_ENV = "KSQUAD_SEAL_KEY_FILE"


class Unsealed(Exception):
    """What the worker was handed is not what the bridge resolved or the worker made."""


class Copied(Unsealed):
    """A sealed envelope or warrant, under a workflow or an execution it was not sealed for: a copy."""


class Sealer:
    def __init__(self, key: bytes) -> None:
        self._key = key
        self.signals = SignalKey(key)  # proofs on signals (temporal_client.proofs)

    @classmethod
    def from_file(cls, path: Path) -> "Sealer":
        return cls(load_key(path))

    @classmethod
    def for_embedded(cls, path: Path) -> "Sealer":
        """The embedded stack's key, made on first start (mode 0600)."""
        return cls(ensure_key_file(path))

    def _mac(self, *parts: str) -> str:
        message = "\0".join(parts).encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    # --- envelopes and warrants: sealed by the bridge, checked by the bridge and the worker --------------

    def _envelope_mac(self, envelope: RunEnvelope) -> str:
        body = json.dumps(envelope.sealed_fields(), sort_keys=True, separators=(",", ":"))
        return self._mac("envelope-v1", envelope.workflow_id, body)

    def seal_envelope(self, envelope: E) -> E:
        """The start input, sealed (a RunInput keeps its other fields; a carry is never sealed)."""
        return envelope.model_copy(update={"seal": self._envelope_mac(envelope)})

    def check_envelope(self, envelope: RunEnvelope, workflow_id: str) -> None:
        """The envelope is one the bridge sealed, and it was started under the workflow id it was sealed for."""
        if envelope.seal is None or not hmac.compare_digest(envelope.seal, self._envelope_mac(envelope)):
            raise Unsealed(
                f"the start input of Run {envelope.namespace}/{envelope.name} is not one the bridge sealed "
                f"(its seal is {'missing' if envelope.seal is None else 'wrong'}): the bridge and the worker act "
                f"only on envelopes sealed with the key they share ({SEAL_KEY_FILE_ENV})"
            )
        if workflow_id != envelope.workflow_id:
            raise Copied(
                f"workflow {workflow_id} was started with the envelope of Run {envelope.namespace}/{envelope.name}, "
                f"sealed for workflow {envelope.workflow_id}: a copy, refused"
            )

    def _warrant_mac(self, envelope_seal: str, resolution: Resolution) -> str:
        body = resolution.model_dump(mode="json", exclude={"seal"})
        return self._mac("warrant-v1", envelope_seal, json.dumps(body, sort_keys=True, separators=(",", ":")))

    def seal_warrant(self, envelope: RunEnvelope, chain: str, resolution: Resolution) -> Resolution:
        """The resolution of a checked envelope, for the execution `chain` (the first run id of the workflow's
        chain) and no other."""
        assert envelope.seal is not None
        bound = resolution.model_copy(update={"chain": chain, "envelope_seal": envelope.seal, "seal": None})
        return bound.model_copy(update={"seal": self._warrant_mac(envelope.seal, bound)})

    def check_warrant(self, warrant: Warrant, workflow_id: str) -> str:
        """The warrant is the bridge's, for an envelope it sealed and started under `workflow_id`; returns the
        execution (chain) it is for, which the caller compares with the server's word."""
        envelope, resolution = warrant.envelope, warrant.resolution
        self.check_envelope(envelope, workflow_id)
        expected = self._warrant_mac(resolution.envelope_seal or "", resolution)
        if (
            resolution.seal is None
            or resolution.chain is None
            or resolution.envelope_seal != envelope.seal
            or not hmac.compare_digest(resolution.seal, expected)
        ):
            raise Unsealed(
                f"the resolution of Run {envelope.namespace}/{envelope.name} is not one the bridge sealed for its "
                "envelope: the worker acts only on warrants of the key it shares with the bridge "
                f"({SEAL_KEY_FILE_ENV})"
            )
        if resolution.outcome != "resolved":
            raise Unsealed(
                f"the warrant of Run {envelope.namespace}/{envelope.name} resolved nothing to act on"
            )
        return resolution.chain

    # --- sandboxes: sealed and checked by the worker -----------------------------------------------------

    def _sandbox_mac(self, uid: str, attempt: int, sandbox: Sandbox) -> str:
        return self._mac("sandbox-v1", uid, str(attempt), sandbox.kind, sandbox.name, sandbox.endpoint)

    def seal_sandbox(self, contract: ExecutionContract, sandbox: Sandbox) -> Sandbox:
        return sandbox.model_copy(
            update={"seal": self._sandbox_mac(contract.run.uid, contract.run.attempt, sandbox)}
        )

    def check_endpoint(self, contract: ExecutionContract, endpoint: str, sandbox: Sandbox | None) -> None:
        """An agent call goes to the sealed agent's own endpoint, or to a sandbox this worker made for the run's
        attempt."""
        if contract.agent.endpoint and endpoint == contract.agent.endpoint:
            return
        if sandbox is not None and sandbox.endpoint == endpoint and sandbox.seal is not None:
            expected = self._sandbox_mac(contract.run.uid, contract.run.attempt, sandbox)
            if hmac.compare_digest(sandbox.seal, expected):
                return
        run = contract.run
        raise Unsealed(
            f"endpoint {endpoint} is neither agent {contract.agent.name}'s endpoint nor a sandbox this worker made "
            f"for Run {run.namespace}/{run.name} attempt {run.attempt}"
        )


def sealer_from_env(program: str) -> Sealer:
    """The sealer of the key the environment names; a process without one refuses to start, saying why."""
    path = os.environ.get(SEAL_KEY_FILE_ENV)
    if not path:
        raise SystemExit(
            f"{program}: {SEAL_KEY_FILE_ENV} is not set: the bridge seals each resolution with a key it shares with "
            "the worker, which acts on nothing unsealed (the chart mounts its Secret <release>-seal-key; elsewhere, "
            "give both the same file of 32 random bytes)"
        )
    try:
        return Sealer.from_file(Path(path))
    except CodecKeyError as err:
        raise SystemExit(f"{program}: {SEAL_KEY_FILE_ENV}: {err}") from None
