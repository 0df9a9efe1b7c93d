"""A task's turns, until the model answers or the task must stop. First what the conversation reads beyond the
contract's prompt (a rotated credential awaited, the work item, the squad's memories, the Run's recorded steps);
then turn after turn: the model called with the conversation and its tools, the turn recorded in the attempt's
journal and its cost reported, and its tool calls run (agent.tool_calls), until a turn without tool calls is the
answer.

The model's refusals end the task as the orchestrator expects: a 429 is FAILED `rate_limited` with the raw
`retryAfter`/`retryAfterMs`/`date`, the model and the credential; a 401 is AUTH_REQUIRED (the task waits for a
rotated credential); a credential the agent will not send where the contract says is FAILED `credential_refused`.
MAX_STEPS turns or a spent token budget end it too, and an attempt whose fence moved (agent.journal's Superseded)
stops before its next model call."""

import contextlib
import time

from a2a.types import TaskState

from agent.attempt_item import FINISHED, note_on_item, read_work_item
from agent.contract import AttemptApi
from agent.conversation import Conversation
from agent.journal import Superseded
from agent.ksquad_api import ApiRefused, ApiUnreachable
from agent.memory import recall
from agent.model import (
    CredentialRefused,
    ModelFailed,
    RateLimited,
    ToolCall,
    Unauthorized,
    complete,
)
from agent.reports import ERROR_KEY, Reports, usage_report
from agent.tool_calls import ToolCalls
from agent.tools import ToolBox, ToolServerError

MAX_STEPS = 25


async def work(conversation: Conversation, reports: Reports) -> None:
    contract = conversation.contract
    if conversation.refused_key is not None:
        await conversation.await_rotation(reports)
    if contract.work_item is not None and not conversation.item_read:
        conversation.item_read = True
        await read_work_item(contract.work_item, conversation, reports)
    try:
        if contract.attempt_api is not None and contract.attempt_api.memory and not conversation.memory_read:
            conversation.memory_read = True
            await _recall(contract.attempt_api, conversation, reports)
        await _work_journaled(conversation, reports)
    except Superseded as err:
        await reports.superseded(err)


async def _recall(api: AttemptApi, conversation: Conversation, reports: Reports) -> None:
    """The squad's memories into the conversation, before the first model call (context: going on without
    them when they cannot be read)."""
    try:
        text = await recall(api, conversation.contract.run.namespace)
    except (ApiRefused, ApiUnreachable) as err:
        await reports.working(f"squad memory: {err}: going on without it")
        return
    if text is not None:
        conversation.messages.append({"role": "user", "content": text})


async def _work_journaled(conversation: Conversation, reports: Reports) -> None:
    contract = conversation.contract
    to_run = await conversation.restore(reports)
    if conversation.answer is not None:  # the last recorded turn was the answer: give it, call nothing
        await _finish(conversation.answer, conversation, reports)
        return
    async with contextlib.AsyncExitStack() as stack:
        try:
            box = await stack.enter_async_context(ToolBox(contract))
        except ToolServerError as err:
            await note_on_item(contract, f"failed: {err}", reports)
            await reports.failed(str(err), "tool_server_failed")
            return
        tools = ToolCalls(conversation, reports, box)
        while True:
            if not await tools.run(to_run):
                return  # the model asked the user: the task waits for the answer
            if conversation.turns >= MAX_STEPS:
                await reports.failed(f"no answer after {MAX_STEPS} steps", "too_many_steps")
                return
            calls = await _turn(conversation, reports, tools)
            if calls is None:
                return
            to_run = calls


async def _turn(conversation: Conversation, reports: Reports, tools: ToolCalls) -> list[ToolCall] | None:
    """One model turn, recorded and its cost reported: the tool calls it makes, or None when the task ended
    (answered, or stopped by the model's refusal or a bound)."""
    contract, journal = conversation.contract, conversation.journal
    conversation.turns += 1
    step = conversation.turns
    model = conversation.model
    await journal.flush()  # and the API's word that this attempt is still current
    if (news := journal.news()) is not None:
        await reports.working(news)
    await reports.working(f"step {step}: asking {model.name}", {"ksquad.io/step": step})
    started = time.monotonic()
    journal.model_called()
    try:
        turn = await reports.keepalive(
            complete(model, conversation.messages, tools.definitions, conversation.credentials), model
        )
    except RateLimited as err:
        conversation.turns -= 1  # not a step: the next model (or this one, later) makes it
        credential = model.credential.secret_name if model.credential else None
        await reports.failed(
            str(err),
            "rate_limited",
            retryAfter=err.retry_after,
            retryAfterMs=err.retry_after_ms,
            date=err.date,
            resets=err.resets,
            model=model.name,
            credential=f"{contract.run.namespace}/{credential}" if credential else None,
        )
        return None
    except CredentialRefused as err:
        await reports.failed(str(err), "credential_refused", model=model.name)
        return None
    except Unauthorized as err:
        conversation.turns -= 1
        conversation.refused_key = conversation.fingerprint()
        await reports.status(
            TaskState.TASK_STATE_AUTH_REQUIRED, str(err), {ERROR_KEY: "unauthorized", "model": model.name}
        )
        return None
    except ModelFailed as err:
        # What went wrong goes on the item's record too: the retry (in a new sandbox) reads it there.
        await note_on_item(contract, f"failed: {err}", reports)
        await reports.failed(str(err), "model_failed", model=model.name)
        return None
    message = turn.assistant_message()
    conversation.messages.append(message)
    report = None if turn.usage is None else usage_report(step, model, turn.usage, time.monotonic() - started)
    # The turn's record carries its usage: a retry reports it again, in case the orchestrator died
    # before it recorded the report below (it records each call once).
    journal.add(step, "turn", {"message": message, **({"usage": report} if report else {})})
    conversation.model_calls += 1
    if turn.usage is not None and report is not None:
        conversation.tokens_used += turn.usage.input_tokens + turn.usage.output_tokens
        await reports.usage(model, turn.usage, report)
    budget = contract.token_budget
    if turn.tool_calls and budget is not None and conversation.tokens_used >= budget:
        # Another call would pass the Run's budget: stop before making it.
        await journal.flush()
        await reports.failed(
            f"the Run's token budget is spent: {conversation.tokens_used} of {budget} tokens "
            "used, and the task needs another model call",
            "token_budget_spent",
        )
        return None
    if not turn.tool_calls:
        await journal.flush()
        await _finish(turn.text, conversation, reports)
        return None
    return turn.tool_calls


async def _finish(text: str, conversation: Conversation, reports: Reports) -> None:
    # The item's record says it finished, not what it answered: people who may read the item (the built-in
    # `view` role among them) need not be those who may read the Run, whose answer it is.
    await note_on_item(conversation.contract, FINISHED, reports, done=conversation.item_state != "done")
    await reports.answer(text)
