"""The reference agent's A2A executor: the A2A lifecycle of its tasks. A message starts a task (or follows one up),
its conversation (agent.conversation) runs its turns (agent.turns), and a cancel stops it; the executor keeps the
conversations that may still be continued, the message ids it has seen, and the tasks running.

One task per message (the orchestrator sends one message per attempt, follow-ups for input and refreshed
credentials). Outcomes are reported in A2A terms the orchestrator maps back (agent.reports):
- COMPLETED, with the answer as an artifact and `ksquad.io/outputs` (a small string map) as a data artifact;
- FAILED with metadata `ksquad.io/error: rate_limited` plus the raw `retryAfter`/`retryAfterMs`/`date`,
  the model and the credential, when the model answers 429;
- AUTH_REQUIRED when the model refuses the credential (401); INPUT_REQUIRED when the model asks the user;
- CANCELED on CancelTask or SIGTERM; FAILED with the reason for anything else, among them a credential the agent
  will not send where the contract says (`ksquad.io/error: credential_refused`, naming the host and the Secret's
  `ksquad.io/allowed-hosts` annotation).
A message id seen before is never run again: its task is REJECTED, pointing at the original.

Every message comes from an authenticated caller (agent.server's CallerAuth, agent.callers); what a caller's
message may start or continue is agent.conversation's to check.
"""

import asyncio
import collections
import time
from typing import Any

from a2a.helpers import new_task_from_user_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import TaskState

from agent.contract import Contract, ContractError
from agent.conversation import Conversation
from agent.reports import Reports, Stats
from agent.spans import task_span
from agent.turns import work

DUPLICATE_OF = "ksquad.io/duplicate-of"
# A message id is refused as a repeat for a day: far beyond the orchestrator's retries of one send (seconds to
# minutes), and bounded for an agent that lives for months.
SEEN_RETENTION_SECONDS = 24 * 3600.0


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
        reports = Reports(TaskUpdater(event_queue, context.task_id, context.context_id), self.stats)
        caller = context.call_context.state.get("auth")
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(message))
            original = self.seen.get(message.message_id)
            if original is not None:  # the same message again (a retried sender): never run it twice
                self.stats.duplicates += 1
                await reports.status(
                    TaskState.TASK_STATE_REJECTED,
                    f"message {message.message_id} already runs",
                    {DUPLICATE_OF: original},
                )
                return
            self._remember(message.message_id, context.task_id)
            self.stats.messages += 1
            try:
                conversation = Conversation.start(message, caller, self.env_contract)
            except ContractError as err:
                await reports.failed(str(err), "invalid_contract")
                return
            self.conversations[context.task_id] = conversation
        else:
            self.stats.follow_ups += 1
            existing = self.conversations.get(context.task_id)
            if existing is None:
                await reports.failed("this agent has no memory of the task (restarted?)", "unknown_task")
                return
            conversation = existing
            try:
                conversation.resume(message, caller)
            except ContractError as err:
                await reports.failed(str(err), "invalid_contract")
                return
        current = asyncio.current_task()
        assert current is not None
        self.running[context.task_id] = current
        try:
            with task_span(conversation.contract, context.task_id):
                await work(conversation, reports)
        except asyncio.CancelledError:
            self.stats.cancelled += 1
            await reports.cancelled("cancelled")  # cancel() may have reported CANCELED already
            raise
        finally:
            self.running.pop(context.task_id, None)
            if not conversation.paused:
                self.conversations.pop(context.task_id, None)  # ended: no follow-up can come

    def _remember(self, message_id: str, task_id: str) -> None:
        now = time.monotonic()
        while self._seen_at and now - self._seen_at[0][0] > SEEN_RETENTION_SECONDS:
            self.seen.pop(self._seen_at.popleft()[1], None)
        self.seen[message_id] = task_id
        self._seen_at.append((now, message_id))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None
        reports = Reports(TaskUpdater(event_queue, context.task_id, context.context_id), self.stats)
        await reports.cancelled("cancelled on request")

    async def cancel_all(self) -> None:
        """SIGTERM: stop every task (each reports CANCELED) and wait, briefly, for them to finish."""
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
