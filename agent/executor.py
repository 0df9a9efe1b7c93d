"""The reference agent's A2A executor: contract in, model and tool loop, status and artifacts out.

One task per message (the orchestrator sends one message per attempt, follow-ups for input and refreshed
credentials). Outcomes are reported in A2A terms the orchestrator maps back:
- COMPLETED, with the answer as an artifact and `ksquad.io/outputs` (a small string map) as a data artifact;
- FAILED with metadata `ksquad.io/error: rate_limited` plus the raw `retryAfter`/`retryAfterMs`/`date`,
  the model and the credential, when the model answers 429;
- AUTH_REQUIRED when the model refuses the credential (401); INPUT_REQUIRED when the model asks the user;
- CANCELED on CancelTask or SIGTERM; FAILED with the reason for anything else, among them a credential the agent
  will not send where the contract says (`ksquad.io/error: credential_refused`, naming the host and the Secret's
  `ksquad.io/allowed-hosts` annotation).
A message id seen before is never run again: its task is REJECTED, pointing at the original.

Every message comes from an authenticated caller (agent.server's CallerAuth, agent.callers): its contract and
model override are the worker's word. A shared endpoint's caller is one attempt's: its contract must be that
attempt's, and its credentials are read from that namespace only, and only those the caller's token names.
"""

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from a2a.helpers import (
    get_data_parts,
    get_message_text,
    new_data_part,
    new_task_from_user_message,
    new_text_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, TaskState
from google.protobuf.json_format import MessageToDict

from agent.callers import Caller
from agent.contract import (
    AttemptApi,
    Contract,
    ContractError,
    Model,
    WorkItemAccess,
    build_prompt,
    parse_contract,
)
from agent.credentials import CredentialError, Credentials
from agent.journal import Journal, Superseded, restore
from agent.ksquad_api import ApiRefused, ApiUnreachable
from agent.memory import REMEMBER, recall, remember, remember_tool
from agent.model import (
    CredentialRefused,
    ModelFailed,
    RateLimited,
    ToolCall,
    Unauthorized,
    Usage,
    complete,
)
from agent.spans import task_span, tool_answered, tool_span
from agent.tools import ToolBox, ToolResult, ToolServerError
from agent.work_item import WorkItemError, read_item, set_state
from agent.work_item import comment as comment_on_item

log = logging.getLogger("ksquad.agent")
T = TypeVar("T")

CONTRACT_PART = "ksquad.io/contract"  # a data part {"ksquad.io/contract": {...}} carries the contract
MODEL_OVERRIDE = "ksquad.io/model"  # message metadata: the model to use now (a fallback switch)
OUTPUTS_ARTIFACT = "ksquad.io/outputs"
ERROR_KEY = "ksquad.io/error"
# A status update's metadata {"ksquad.io/usage": {"callId", "model", "inputTokens", "outputTokens", "latencyMs"}}:
# what one model call cost (docs/operating.md, "Usage"); the orchestrator records each callId of an attempt once.
# A resumed task sends a list of the earlier attempts' reports, each with its "attempt", recorded if missing.
USAGE_KEY = "ksquad.io/usage"
DUPLICATE_OF = "ksquad.io/duplicate-of"
ASK_USER = "ksquad_request_input"  # the agent's own tool: the model asks the user a question
MAX_STEPS = 25
KEEPALIVE_SECONDS = 10.0  # a status while the model thinks, so a silent agent means a dead one
MAX_OUTPUT_CHARS = 2000
# A message id is refused as a repeat for a day: far beyond the orchestrator's retries of one send (seconds to
# minutes), and bounded for an agent that lives for months.
SEEN_RETENTION_SECONDS = 24 * 3600.0
ROTATION_WAIT_SECONDS = float(os.environ.get("KSQUAD_CREDENTIAL_ROTATION_WAIT_SECONDS", "120"))

ASK_USER_TOOL = {
    "type": "function",
    "function": {
        "name": ASK_USER,
        "description": "Ask the person who started the run a question, when you cannot go on without the answer.",
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "string"}},
            "required": ["question"],
        },
    },
}


# The comment an attempt leaves on its work item when it finishes.
FINISHED = "finished: its answer is the Run's (its status and its artifact `answer`)"


def usage_report(call: int, model: Model, usage: Usage, seconds: float) -> dict[str, Any]:
    """What a model call cost, as the orchestrator records it (once per callId of an attempt)."""
    return {
        "callId": str(call),
        "model": model.name,
        "inputTokens": usage.input_tokens,
        "outputTokens": usage.output_tokens,
        "latencyMs": round(seconds * 1000),
    }


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


@dataclass
class Stats:
    """What this agent was asked to do; tests assert on it (`GET /ksquad/stats`)."""

    messages: int = 0  # distinct new messages executed
    follow_ups: int = 0
    duplicates: int = 0  # repeated message ids, refused
    cancelled: int = 0
    completed: int = 0
    superseded: int = 0  # tasks stopped because their attempt's fence moved (agent.journal)


class KsquadAgentExecutor(AgentExecutor):
    def __init__(self, contract: Contract | None = None) -> None:
        self.env_contract = contract
        # Only tasks that may be continued keep their conversation (paused for input or a credential); a
        # long-lived agent (an Agent's `endpoint`) serving thousands of runs must not keep every one.
        self.conversations: dict[str, Conversation] = {}
        self.seen: dict[str, str] = {}  # message id -> task id, kept SEEN_RETENTION_SECONDS
        self._seen_at: collections.deque[tuple[float, str]] = collections.deque()
        self.running: dict[str, asyncio.Task[Any]] = {}
        self.stats = Stats()

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        assert message is not None and context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        caller = context.call_context.state.get("auth")
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(message))
            original = self.seen.get(message.message_id)
            if original is not None:  # the same message again (a retried sender): never run it twice
                self.stats.duplicates += 1
                await updater.update_status(
                    TaskState.TASK_STATE_REJECTED,
                    self._text(updater, f"message {message.message_id} already runs"),
                    metadata={DUPLICATE_OF: original},
                )
                return
            self._remember(message.message_id, context.task_id)
            self.stats.messages += 1
            try:
                conversation = self._start(message, caller)
            except ContractError as err:
                await updater.update_status(
                    TaskState.TASK_STATE_FAILED,
                    self._text(updater, str(err)),
                    metadata={ERROR_KEY: "invalid_contract"},
                )
                return
            self.conversations[context.task_id] = conversation
        else:
            self.stats.follow_ups += 1
            existing = self.conversations.get(context.task_id)
            if existing is None:
                await updater.update_status(
                    TaskState.TASK_STATE_FAILED,
                    self._text(updater, "this agent has no memory of the task (restarted?)"),
                    metadata={ERROR_KEY: "unknown_task"},
                )
                return
            conversation = existing
            try:
                self._resume(conversation, message, caller)
            except ContractError as err:
                await updater.update_status(
                    TaskState.TASK_STATE_FAILED,
                    self._text(updater, str(err)),
                    metadata={ERROR_KEY: "invalid_contract"},
                )
                return
        current = asyncio.current_task()
        assert current is not None
        self.running[context.task_id] = current
        try:
            with task_span(conversation.contract, context.task_id):
                await self._work(conversation, updater)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            with contextlib.suppress(RuntimeError):  # cancel() may have reported CANCELED already
                await updater.cancel(self._text(updater, "cancelled"))
            raise
        finally:
            self.running.pop(context.task_id, None)
            if conversation.pending_question is None and conversation.refused_key is None:
                self.conversations.pop(context.task_id, None)  # ended: no follow-up can come

    def _remember(self, message_id: str, task_id: str) -> None:
        now = time.monotonic()
        while self._seen_at and now - self._seen_at[0][0] > SEEN_RETENTION_SECONDS:
            self.seen.pop(self._seen_at.popleft()[1], None)
        self.seen[message_id] = task_id
        self._seen_at.append((now, message_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        with contextlib.suppress(RuntimeError):
            await updater.cancel(self._text(updater, "cancelled on request"))

    async def cancel_all(self) -> None:
        """SIGTERM: stop every task (each reports CANCELED) and wait, briefly, for them to finish."""
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # --- the conversation ---------------------------------------------------------------------------------

    def _start(self, message: Message, caller: Any) -> Conversation:
        if not isinstance(caller, Caller):  # CallerAuth lets no request through without one
            raise ContractError("the message comes from no authenticated caller")
        contract = self.env_contract
        for part in get_data_parts(list(message.parts)):
            if isinstance(part, dict) and CONTRACT_PART in part:
                contract = parse_contract(part[CONTRACT_PART])
        if contract is None:
            raise ContractError(
                "no execution contract: set KSQUAD_EXECUTION_CONTRACT or send it in the message"
            )
        credentials = _credentials_of(caller, contract)
        # The message's text only says which attempt this is: the task itself comes from the contract.
        return Conversation(
            contract,
            self._model(contract, message),
            build_prompt(contract),
            credentials,
            journal=Journal(contract.attempt_api),
        )

    def _resume(self, conversation: Conversation, message: Message, caller: Any) -> None:
        if not isinstance(caller, Caller):
            raise ContractError("the message comes from no authenticated caller")
        # A follow-up (a later activity) carries a token of its own: still this attempt's, maybe other credentials.
        conversation.credentials = _credentials_of(caller, conversation.contract)
        text = get_message_text(message).strip()
        conversation.model = self._model(conversation.contract, message, conversation.model)
        if conversation.pending_question is not None:  # the answer to the model's question
            answer = {
                "role": "tool",
                "tool_call_id": conversation.pending_question,
                "content": text or "(no answer)",
            }
            conversation.messages.append(answer)
            conversation.journal.add(conversation.turns, "tool", {"message": answer})
            conversation.pending_question = None
        # else: the credential was refreshed; the conversation goes on where it stopped

    def _model(self, contract: Contract, message: Message, current: Model | None = None) -> Model:
        metadata = MessageToDict(message.metadata) if message.HasField("metadata") else {}
        override = metadata.get(MODEL_OVERRIDE)
        if isinstance(override, dict):
            return Model.model_validate(override)
        return current or contract.model

    async def _work(self, conversation: Conversation, updater: TaskUpdater) -> None:
        contract = conversation.contract
        if conversation.refused_key is not None:
            await self._await_rotation(conversation, updater)
        if contract.work_item is not None and not conversation.item_read:
            conversation.item_read = True
            await self._read_work_item(contract.work_item, conversation, updater)
        try:
            if (
                contract.attempt_api is not None
                and contract.attempt_api.memory
                and not conversation.memory_read
            ):
                conversation.memory_read = True
                await self._recall(contract.attempt_api, conversation, updater)
            await self._work_journaled(conversation, updater)
        except Superseded as err:
            self.stats.superseded += 1
            await updater.update_status(
                TaskState.TASK_STATE_FAILED,
                self._text(updater, f"this attempt was superseded: no further model call is made ({err})"),
                metadata={ERROR_KEY: "superseded"},
            )

    async def _recall(self, api: AttemptApi, conversation: Conversation, updater: TaskUpdater) -> None:
        """The squad's memories into the conversation, before the first model call (context: going on without
        them when they cannot be read)."""
        try:
            text = await recall(api, conversation.contract.run.namespace)
        except (ApiRefused, ApiUnreachable) as err:
            await updater.update_status(
                TaskState.TASK_STATE_WORKING,
                self._text(updater, f"squad memory: {err}: going on without it"),
            )
            return
        if text is not None:
            conversation.messages.append({"role": "user", "content": text})

    async def _restore(self, conversation: Conversation, updater: TaskUpdater) -> list[ToolCall]:
        """The Run's recorded steps into the conversation (once a task): what earlier attempts (or this one's
        earlier task) completed is not asked of the model again. The calls of the last turn still to run."""
        if conversation.restored:
            return []
        conversation.restored = True
        restored = restore(await conversation.journal.read())
        if not restored.turns:
            return []
        conversation.messages.extend(restored.messages)
        conversation.turns = restored.turns
        conversation.answer = restored.answer
        note = f"resuming after step {restored.turns} recorded by an earlier attempt"
        if restored.in_flight:
            note += f"; in flight when it stopped, result unknown: {', '.join(restored.in_flight)}"
        metadata: dict[str, Any] = {"ksquad.io/resumed-after": restored.turns}
        if restored.usage:
            metadata[USAGE_KEY] = restored.usage  # the earlier attempts' calls, each recorded once
        await updater.update_status(
            TaskState.TASK_STATE_WORKING, self._text(updater, note), metadata=metadata
        )
        return [
            ToolCall(
                c["id"], c.get("function", {}).get("name", ""), c.get("function", {}).get("arguments", "")
            )
            for c in restored.to_run
        ]

    async def _work_journaled(self, conversation: Conversation, updater: TaskUpdater) -> None:
        contract, journal = conversation.contract, conversation.journal
        to_run = await self._restore(conversation, updater)
        if conversation.answer is not None:  # the last recorded turn was the answer: give it, call nothing
            await self._finish(conversation.answer, updater, contract, conversation.item_state != "done")
            return
        async with contextlib.AsyncExitStack() as stack:
            try:
                tools = await stack.enter_async_context(ToolBox(contract))
            except ToolServerError as err:
                await self._note_on_item(contract, f"failed: {err}", updater)
                await updater.update_status(
                    TaskState.TASK_STATE_FAILED,
                    self._text(updater, str(err)),
                    metadata={ERROR_KEY: "tool_server_failed"},
                )
                return
            definitions = [*tools.definitions(), ASK_USER_TOOL]
            api = contract.attempt_api
            if api is not None and api.memory:
                definitions.append(remember_tool(api))
            while True:
                for call in to_run:
                    if call.name == ASK_USER:
                        await journal.flush()  # the turn that asks is recorded before the question goes out
                        conversation.pending_question = call.id
                        question = _argument(call.arguments, "question") or "The agent needs input."
                        await updater.requires_input(self._text(updater, question))
                        return
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING,
                        self._text(updater, f"calling tool {call.name}"),
                        metadata={"ksquad.io/tool": call.name},
                    )
                    journal.add(conversation.turns, "tool-started", {"id": call.id, "name": call.name})
                    await journal.flush()  # a retry knows the call may have taken effect
                    with tool_span(call.name, call.id, call.arguments) as span:
                        if call.name == REMEMBER and api is not None and api.memory:
                            text, failed = await remember(api, contract.run.namespace, call.arguments)
                            result = ToolResult(text, failed)
                        else:
                            result = await tools.call(call.name, call.arguments)
                        tool_answered(span, result.text, result.is_error)
                    message = {"role": "tool", "tool_call_id": call.id, "content": result.text}
                    conversation.messages.append(message)
                    journal.add(conversation.turns, "tool", {"message": message})
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING,
                        self._text(updater, f"{call.name}: {result.text[:200]}"),
                        metadata={"ksquad.io/tool": call.name, "ksquad.io/tool-error": result.is_error},
                    )
                if conversation.turns >= MAX_STEPS:
                    await updater.update_status(
                        TaskState.TASK_STATE_FAILED,
                        self._text(updater, f"no answer after {MAX_STEPS} steps"),
                        metadata={ERROR_KEY: "too_many_steps"},
                    )
                    return
                conversation.turns += 1
                step = conversation.turns
                model = conversation.model
                await journal.flush()  # and the API's word that this attempt is still current
                if (news := journal.news()) is not None:
                    await updater.update_status(TaskState.TASK_STATE_WORKING, self._text(updater, news))
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING,
                    self._text(updater, f"step {step}: asking {model.name}"),
                    metadata={"ksquad.io/step": step},
                )
                started = time.monotonic()
                journal.model_called()
                try:
                    turn = await self._keepalive(
                        complete(model, conversation.messages, definitions, conversation.credentials),
                        updater,
                        model,
                    )
                except RateLimited as err:
                    conversation.turns -= 1  # not a step: the next model (or this one, later) makes it
                    credential = model.credential.secret_name if model.credential else None
                    await updater.update_status(
                        TaskState.TASK_STATE_FAILED,
                        self._text(updater, str(err)),
                        metadata={
                            ERROR_KEY: "rate_limited",
                            "retryAfter": err.retry_after,
                            "retryAfterMs": err.retry_after_ms,
                            "date": err.date,
                            "resets": err.resets,
                            "model": model.name,
                            "credential": f"{contract.run.namespace}/{credential}" if credential else None,
                        },
                    )
                    return
                except CredentialRefused as err:
                    await updater.update_status(
                        TaskState.TASK_STATE_FAILED,
                        self._text(updater, str(err)),
                        metadata={ERROR_KEY: "credential_refused", "model": model.name},
                    )
                    return
                except Unauthorized as err:
                    conversation.turns -= 1
                    conversation.refused_key = _fingerprint(conversation)
                    await updater.update_status(
                        TaskState.TASK_STATE_AUTH_REQUIRED,
                        self._text(updater, str(err)),
                        metadata={ERROR_KEY: "unauthorized", "model": model.name},
                    )
                    return
                except ModelFailed as err:
                    # What went wrong goes on the item's record too: the retry (in a new sandbox) reads it there.
                    await self._note_on_item(contract, f"failed: {err}", updater)
                    await updater.update_status(
                        TaskState.TASK_STATE_FAILED,
                        self._text(updater, str(err)),
                        metadata={ERROR_KEY: "model_failed", "model": model.name},
                    )
                    return
                message = turn.assistant_message()
                conversation.messages.append(message)
                report = (
                    None
                    if turn.usage is None
                    else usage_report(step, model, turn.usage, time.monotonic() - started)
                )
                # The turn's record carries its usage: a retry reports it again, in case the orchestrator died
                # before it recorded the report below (it records each call once).
                journal.add(step, "turn", {"message": message, **({"usage": report} if report else {})})
                conversation.model_calls += 1
                if turn.usage is not None and report is not None:
                    conversation.tokens_used += turn.usage.input_tokens + turn.usage.output_tokens
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING,
                        self._text(
                            updater,
                            f"{model.name}: {turn.usage.input_tokens} tokens in, {turn.usage.output_tokens} out",
                        ),
                        metadata={USAGE_KEY: report},
                    )
                budget = contract.token_budget
                if turn.tool_calls and budget is not None and conversation.tokens_used >= budget:
                    # Another call would pass the Run's budget: stop before making it.
                    await journal.flush()
                    await updater.update_status(
                        TaskState.TASK_STATE_FAILED,
                        self._text(
                            updater,
                            f"the Run's token budget is spent: {conversation.tokens_used} of {budget} tokens "
                            "used, and the task needs another model call",
                        ),
                        metadata={ERROR_KEY: "token_budget_spent"},
                    )
                    return
                if not turn.tool_calls:
                    await journal.flush()
                    await self._finish(turn.text, updater, contract, conversation.item_state != "done")
                    return
                to_run = turn.tool_calls

    async def _await_rotation(self, conversation: Conversation, updater: TaskUpdater) -> None:
        """After AUTH_REQUIRED the orchestrator says the credential was rotated; a mounted Secret reaches the
        sandbox some time later (the kubelet syncs it). Wait, bounded, until the key differs from the refused
        one, so the retry does not spend itself on the old key."""
        refused, conversation.refused_key = conversation.refused_key, None
        await updater.update_status(
            TaskState.TASK_STATE_WORKING,
            self._text(updater, "waiting for the rotated credential to reach the sandbox"),
        )
        deadline = asyncio.get_running_loop().time() + ROTATION_WAIT_SECONDS
        # A file changes with no event to wait on: poll it.
        while asyncio.get_running_loop().time() < deadline:
            if _fingerprint(conversation) != refused:
                return
            await asyncio.sleep(0.5)

    async def _read_work_item(
        self, access: WorkItemAccess, conversation: Conversation, updater: TaskUpdater
    ) -> None:
        """The item and its record after the task: what earlier attempts, other agents and people said; an open
        or blocked item is in progress from now."""
        try:
            state, text = await read_item(access)
            conversation.item_state = state
            conversation.messages.append({"role": "user", "content": text})
            if state in ("open", "blocked"):
                await set_state(access, "in-progress")
        except WorkItemError as err:
            await updater.update_status(
                TaskState.TASK_STATE_WORKING,
                self._text(updater, f"work item {access.namespace}/{access.id}: {err}: going on without it"),
            )

    async def _note_on_item(
        self, contract: Contract, what: str, updater: TaskUpdater, done: bool = False
    ) -> None:
        """A comment on the attempt's work item saying how it went, and the item done if the attempt finished
        (nothing without an item)."""
        if contract.work_item is None:
            return
        run = contract.run
        try:
            await comment_on_item(
                contract.work_item, f"Attempt {run.attempt} of run {run.namespace}/{run.name} {what}"
            )
            if done:
                await set_state(contract.work_item, "done")
        except WorkItemError as err:  # a fenced-off attempt's comment is refused: its outcome still stands
            await updater.update_status(
                TaskState.TASK_STATE_WORKING,
                self._text(updater, f"could not comment on the work item: {err}"),
            )

    async def _finish(self, text: str, updater: TaskUpdater, contract: Contract, mark_done: bool) -> None:
        # The item's record says it finished, not what it answered: people who may read the item (the built-in
        # `view` role among them) need not be those who may read the Run, whose answer it is.
        await self._note_on_item(contract, FINISHED, updater, done=mark_done)
        await updater.add_artifact([new_text_part(text)], name="answer")
        await updater.add_artifact(
            [new_data_part({"answer": text[:MAX_OUTPUT_CHARS]})], name=OUTPUTS_ARTIFACT
        )
        self.stats.completed += 1
        # The outputs ride on the final message too: a caller that reconnects after the task ended reads the
        # task whole, and the artifacts of a task no one was streaming are not always in it.
        outputs = {"answer": text[:MAX_OUTPUT_CHARS]}
        await updater.complete(
            updater.new_agent_message(
                [new_text_part(text[:MAX_OUTPUT_CHARS])], metadata={OUTPUTS_ARTIFACT: outputs}
            )
        )

    async def _keepalive(self, work: Awaitable[T], updater: TaskUpdater, model: Model) -> T:
        """Await the model, reporting every KEEPALIVE_SECONDS that the agent is alive and waiting."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=KEEPALIVE_SECONDS)
                if done:
                    return task.result()
                await updater.update_status(
                    TaskState.TASK_STATE_WORKING, self._text(updater, f"waiting for {model.name}")
                )
        finally:
            if not task.done():
                task.cancel()  # a cancelled task abandons the model call: the HTTP request is dropped
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    @staticmethod
    def _text(updater: TaskUpdater, text: str) -> Message:
        return updater.new_agent_message([new_text_part(text)])


def _fingerprint(conversation: Conversation) -> str | None:
    credential = conversation.model.credential
    try:
        key = conversation.credentials.value(credential) if credential else ""
    except CredentialError:
        return None
    return hashlib.sha256(key.encode()).hexdigest()


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


def _argument(arguments: str, name: str) -> str:
    try:
        value = json.loads(arguments or "{}").get(name)
    except (json.JSONDecodeError, AttributeError):
        return ""
    return str(value) if value is not None else ""
