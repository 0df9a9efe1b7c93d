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

from temporal_client.codec import CodecKeyError, ensure_key_file, load_key
from temporal_client.proofs import SignalKey
from workflows.activity_types import Sandbox
from workflows.contract import ExecutionContract, Resolution, ResolvedAgent
from workflows.spec import SandboxPolicy

SEAL_KEY_FILE_ENV = "KSQUAD_SEAL_KEY_FILE"


class Unsealed(Exception):
    """What the worker was handed is not what the bridge resolved or the worker made."""


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

    # --- agents: sealed by the bridge, checked by the worker ---------------------------------------------

    def _agent_mac(self, namespace: str, uid: str, agent: ResolvedAgent) -> str:
        # A field added since agent-v1 goes into the MAC only when set: a resolution sealed before an upgrade
        # (a run in flight across it) keeps its seal.
        later = {name for name in ("project_fallback_model", "placement") if getattr(agent, name) is None}
        body = agent.model_dump(mode="json", exclude={"seal", *later})
        return self._mac("agent-v1", namespace, uid, json.dumps(body, sort_keys=True, separators=(",", ":")))

    def seal_agent(self, namespace: str, uid: str, agent: ResolvedAgent) -> ResolvedAgent:
        return agent.model_copy(update={"seal": self._agent_mac(namespace, uid, agent)})

    def seal_resolution(self, namespace: str, uid: str, resolution: Resolution) -> Resolution:
        agents = [self.seal_agent(namespace, uid, agent) for agent in resolution.agents]
        return resolution.model_copy(update={"agents": agents})

    def check_contract(self, contract: ExecutionContract, policy: SandboxPolicy | None = None) -> None:
        """The contract's agent is one the bridge resolved for this Run, its model that agent's own or its
        fallback, and (for a sandbox) the policy the one the bridge resolved."""
        run, agent = contract.run, contract.agent
        expected = self._agent_mac(run.namespace, run.uid, agent)
        if agent.seal is None or not hmac.compare_digest(agent.seal, expected):
            raise Unsealed(
                f"agent {agent.name} of Run {run.namespace}/{run.name} (uid {run.uid}) is not as the bridge "
                f"resolved it (its seal is {'missing' if agent.seal is None else 'wrong'}): the worker acts only on "
                f"resolutions sealed with the key it shares with the bridge ({SEAL_KEY_FILE_ENV})"
            )
        resolved = (agent.model, agent.fallback_model, agent.project_fallback_model)
        if contract.model not in [m for m in resolved if m is not None]:
            raise Unsealed(
                f"model {contract.model.name} at {contract.model.url} is neither agent {agent.name}'s model nor "
                "a fallback (its own, its Project's) as the bridge resolved them"
            )
        if policy is not None and policy != agent.sandbox_policy:
            raise Unsealed(
                f"sandbox policy {policy.model_dump(by_alias=True)} is not the one the bridge resolved for Run "
                f"{run.namespace}/{run.name}"
            )

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
