"""What the reference agent reports back about a task, in A2A terms the orchestrator maps back: its progress
(WORKING statuses, a keepalive while the model thinks), what each model call cost (`ksquad.io/usage`), how it
ended (the answer as artifacts, or FAILED with `ksquad.io/error`), and the counts behind `GET /ksquad/stats`."""

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from a2a.helpers import new_data_part, new_text_part
from a2a.server.tasks import TaskUpdater
from a2a.types import Message, TaskState

from agent.contract import Model
from agent.model import Usage

T = TypeVar("T")

OUTPUTS_ARTIFACT = "ksquad.io/outputs"
ERROR_KEY = "ksquad.io/error"
# A status update's metadata {"ksquad.io/usage": {"callId", "model", "inputTokens", "outputTokens", "latencyMs"}}:
# what one model call cost (docs/operating.md, "Usage"); the orchestrator records each callId of an attempt once.
# A resumed task sends a list of the earlier attempts' reports, each with its "attempt", recorded if missing.
USAGE_KEY = "ksquad.io/usage"
KEEPALIVE_SECONDS = 10.0  # a status while the model thinks, so a silent agent means a dead one
MAX_OUTPUT_CHARS = 2000


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
class Stats:
    """What this agent was asked to do; tests assert on it (`GET /ksquad/stats`)."""

    messages: int = 0  # distinct new messages executed
    follow_ups: int = 0
    duplicates: int = 0  # repeated message ids, refused
    cancelled: int = 0
    completed: int = 0
    superseded: int = 0  # tasks stopped because their attempt's fence moved (agent.journal)


class Reports:
    """One task's reports: its status updates and artifacts (through its TaskUpdater), counted in the agent's
    Stats."""

    def __init__(self, updater: TaskUpdater, stats: Stats) -> None:
        self.updater = updater
        self.stats = stats

    def _text(self, text: str) -> Message:
        return self.updater.new_agent_message([new_text_part(text)])

    async def status(self, state: TaskState, text: str, metadata: dict[str, Any] | None = None) -> None:
        await self.updater.update_status(state, self._text(text), metadata=metadata)

    async def working(self, text: str, metadata: dict[str, Any] | None = None) -> None:
        await self.status(TaskState.TASK_STATE_WORKING, text, metadata)

    async def failed(self, text: str, error: str, **details: Any) -> None:
        """FAILED, saying why in `ksquad.io/error` (and what the orchestrator needs to act on it in `details`)."""
        await self.status(TaskState.TASK_STATE_FAILED, text, {ERROR_KEY: error, **details})

    async def superseded(self, err: Exception) -> None:
        self.stats.superseded += 1
        await self.failed(f"this attempt was superseded: no further model call is made ({err})", "superseded")

    async def requires_input(self, question: str) -> None:
        await self.updater.requires_input(self._text(question))

    async def cancelled(self, text: str) -> None:
        with contextlib.suppress(RuntimeError):  # a task that already ended cannot be cancelled
            await self.updater.cancel(self._text(text))

    async def usage(self, model: Model, usage: Usage, report: dict[str, Any]) -> None:
        await self.working(
            f"{model.name}: {usage.input_tokens} tokens in, {usage.output_tokens} out", {USAGE_KEY: report}
        )

    async def keepalive(self, work: Awaitable[T], model: Model) -> T:
        """Await the model, reporting every KEEPALIVE_SECONDS that the agent is alive and waiting."""
        task = asyncio.ensure_future(work)
        try:
            while True:
                done, _ = await asyncio.wait([task], timeout=KEEPALIVE_SECONDS)
                if done:
                    return task.result()
                await self.working(f"waiting for {model.name}")
        finally:
            if not task.done():
                task.cancel()  # a cancelled task abandons the model call: the HTTP request is dropped
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def answer(self, text: str) -> None:
        """COMPLETED: the answer as an artifact, and `ksquad.io/outputs` (a small string map) as a data artifact."""
        await self.updater.add_artifact([new_text_part(text)], name="answer")
        await self.updater.add_artifact(
            [new_data_part({"answer": text[:MAX_OUTPUT_CHARS]})], name=OUTPUTS_ARTIFACT
        )
        self.stats.completed += 1
        # The outputs ride on the final message too: a caller that reconnects after the task ended reads the
        # task whole, and the artifacts of a task no one was streaming are not always in it.
        outputs = {"answer": text[:MAX_OUTPUT_CHARS]}
        await self.updater.complete(
            self.updater.new_agent_message(
                [new_text_part(text[:MAX_OUTPUT_CHARS])], metadata={OUTPUTS_ARTIFACT: outputs}
            )
        )
