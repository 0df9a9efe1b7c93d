"""One task's conversation: the messages the model reads (the contract's prompt, then every turn and tool result)
and the task's state between its messages (the question waiting for an answer, the credential the model refused,
the turns made and the tokens spent). A task's first message starts it, follow-ups carry it on (an answer, a
refreshed credential), and the Run's recorded steps restore it (agent.journal: its checkpoints), so a retry goes
on after the last completed step.

Every message comes from an authenticated caller (agent.server's CallerAuth, agent.callers): its contract and
model override are the worker's word. A shared endpoint's caller is one attempt's: its contract must be that
attempt's, and its credentials are read from that namespace only, and only those the caller's token names.
"""

import asyncio
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from a2a.helpers import get_data_parts, get_message_text
from a2a.types import Message
from google.protobuf.json_format import MessageToDict

from agent.callers import Caller
from agent.contract import Contract, ContractError, Model, build_prompt, parse_contract
from agent.credentials import CredentialError, Credentials
from agent.journal import Journal
from agent.journal import restore as restore_steps
from agent.model import ToolCall
from agent.reports import USAGE_KEY, Reports

CONTRACT_PART = "ksquad.io/contract"  # a data part {"ksquad.io/contract": {...}} carries the contract
MODEL_OVERRIDE = "ksquad.io/model"  # message metadata: the model to use now (a fallback switch)
ROTATION_WAIT_SECONDS = float(os.environ.get("KSQUAD_CREDENTIAL_ROTATION_WAIT_SECONDS", "120"))


@dataclass
class Conversation:
    contract: Contract
    model: Model
    messages: list[dict[str, Any]]
    credentials: Credentials  # where this conversation's keys are read (a shared endpoint: the caller's)
    pending_question: str | None = None  # the tool call id of an unanswered ksquad_request_input
    refused_key: str | None = None  # a fingerprint of the credential the model refused (AUTH_REQUIRED)
    item_read: bool = False  # the work item went into the conversation (once: a follow-up goes on from there)
    item_state: str | None = None  # its state when read: an item already done is not marked done again
    memory_read: bool = False  # the squad's memories went into the conversation (once)
    model_calls: int = 0  # answered model calls of this task
    journal: Journal = field(default_factory=lambda: Journal(None))  # where its steps are recorded
    restored: bool = False  # the Run's recorded steps were read into it (once a task)
    turns: int = (
        0  # model turns of the conversation, recorded ones included: the step, and a usage report's id
    )
    answer: str | None = None  # a recorded last turn that was the answer
    tokens_used: int = 0  # their tokens, in and out, against the contract's tokenBudget

    @classmethod
    def start(cls, message: Message, caller: Any, env_contract: Contract | None) -> "Conversation":
        """The conversation of a task's first message: its contract is the message's, else the environment's."""
        if not isinstance(caller, Caller):  # CallerAuth lets no request through without one
            raise ContractError("the message comes from no authenticated caller")
        contract = env_contract
        for part in get_data_parts(list(message.parts)):
            if isinstance(part, dict) and CONTRACT_PART in part:
                contract = parse_contract(part[CONTRACT_PART])
        if contract is None:
            raise ContractError(
                "no execution contract: set KSQUAD_EXECUTION_CONTRACT or send it in the message"
            )
        credentials = _credentials_of(caller, contract)
        # The message's text only says which attempt this is: the task itself comes from the contract.
        return cls(
            contract,
            _model(contract, message),
            build_prompt(contract),
            credentials,
            journal=Journal(contract.attempt_api),
        )

    def resume(self, message: Message, caller: Any) -> None:
        """A follow-up: the answer to the model's question, or word that the credential was refreshed."""
        if not isinstance(caller, Caller):
            raise ContractError("the message comes from no authenticated caller")
        # A follow-up (a later activity) carries a token of its own: still this attempt's, maybe other credentials.
        self.credentials = _credentials_of(caller, self.contract)
        text = get_message_text(message).strip()
        self.model = _model(self.contract, message, self.model)
        if self.pending_question is not None:  # the answer to the model's question
            answer = {
                "role": "tool",
                "tool_call_id": self.pending_question,
                "content": text or "(no answer)",
            }
            self.messages.append(answer)
            self.journal.add(self.turns, "tool", {"message": answer})
            self.pending_question = None
        # else: the credential was refreshed; the conversation goes on where it stopped

    @property
    def paused(self) -> bool:
        """Waiting for a follow-up (an answer, or a rotated credential): the task may be continued."""
        return self.pending_question is not None or self.refused_key is not None

    def fingerprint(self) -> str | None:
        """A fingerprint of the key the model is called with now (None: it cannot be read)."""
        credential = self.model.credential
        try:
            key = self.credentials.value(credential) if credential else ""
        except CredentialError:
            return None
        return hashlib.sha256(key.encode()).hexdigest()

    async def await_rotation(self, reports: Reports) -> None:
        """After AUTH_REQUIRED the orchestrator says the credential was rotated; a mounted Secret reaches the
        sandbox some time later (the kubelet syncs it). Wait, bounded, until the key differs from the refused
        one, so the retry does not spend itself on the old key."""
        refused, self.refused_key = self.refused_key, None
        await reports.working("waiting for the rotated credential to reach the sandbox")
        deadline = asyncio.get_running_loop().time() + ROTATION_WAIT_SECONDS
        # A file changes with no event to wait on: poll it.
        while asyncio.get_running_loop().time() < deadline:
            if self.fingerprint() != refused:
                return
            await asyncio.sleep(0.5)

    async def restore(self, reports: Reports) -> list[ToolCall]:
        """The Run's recorded steps into the conversation (once a task): what earlier attempts (or this one's
        earlier task) completed is not asked of the model again. The calls of the last turn still to run."""
        if self.restored:
            return []
        self.restored = True
        restored = restore_steps(await self.journal.read())
        if not restored.turns:
            return []
        self.messages.extend(restored.messages)
        self.turns = restored.turns
        self.answer = restored.answer
        note = f"resuming after step {restored.turns} recorded by an earlier attempt"
        if restored.in_flight:
            note += f"; in flight when it stopped, result unknown: {', '.join(restored.in_flight)}"
        metadata: dict[str, Any] = {"ksquad.io/resumed-after": restored.turns}
        if restored.usage:
            metadata[USAGE_KEY] = restored.usage  # the earlier attempts' calls, each recorded once
        await reports.working(note, metadata)
        return [
            ToolCall(
                c["id"], c.get("function", {}).get("name", ""), c.get("function", {}).get("arguments", "")
            )
            for c in restored.to_run
        ]


def _model(contract: Contract, message: Message, current: Model | None = None) -> Model:
    metadata = MessageToDict(message.metadata) if message.HasField("metadata") else {}
    override = metadata.get(MODEL_OVERRIDE)
    if isinstance(override, dict):
        return Model.model_validate(override)
    return current or contract.model


def _credentials_of(caller: Caller, contract: Contract) -> Credentials:
    """A sandbox's caller is the worker of its one attempt: the contract is its word. A shared endpoint's caller is
    one attempt's: the contract must be that attempt's, and only the credentials its token names are read, from
    its namespace."""
    claims = caller.claims
    if claims is None:
        return Credentials()
    run = contract.run
    if (run.namespace, run.uid, run.attempt, run.fence) != (
        claims.namespace,
        claims.uid,
        claims.attempt,
        claims.fence,
    ):
        raise ContractError(
            f"the contract is for {run.namespace}/{run.name} attempt {run.attempt} (fence {run.fence}), the caller's "
            f"token for {claims.namespace} run {claims.uid} attempt {claims.attempt} (fence {claims.fence})"
        )
    return Credentials(namespace=claims.namespace, permitted=claims.credentials)
