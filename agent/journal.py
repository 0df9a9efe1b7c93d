"""The attempt's journal: each completed step recorded in ksquad's store through its API (api.attempts) under the
attempt's fence, and read back by the next attempt's agent, which goes on after the last step instead of asking
the model again.

Steps (their `data`):
- `turn`: a model turn, `{"message": <the assistant message>}`;
- `tool-started`: a tool call about to run, `{"id", "name"}`: recorded before the call, so a retry knows the call
  may have taken effect;
- `tool`: its result, `{"message": <the tool message>}`.
Steps wait in `pending` and are written together (`flush`): before a tool runs, before every model call and
before the answer is given. A flush with nothing to write still asks the API whether the attempt's fence is
current: no model call is made before the API has said so since the last one, so an attempt fenced off (a later
attempt, a cancel or a deadline, whether or not its cancel reached the agent) spends no further token.

`restore` rebuilds a conversation from the recorded steps: every turn and tool result in order; a tool call that
was started and has no result is answered with IN_FLIGHT (the model decides whether to call it again: tools run at
least once, never silently twice); calls of the last turn never started are returned to be run; a last turn without
tool calls is the answer.
"""

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from agent.contract import AttemptApi
from agent.ksquad_api import ApiRefused, ApiUnreachable, call

log = logging.getLogger("ksquad.agent")

PATH = "/attempts/checkpoints"
PATIENCE_SECONDS = 30.0  # how long an unanswered API is asked again before the attempt fails
IN_FLIGHT = (
    "ksquad: this tool call was in flight when attempt {attempt} stopped; whether it took effect is unknown. Call it "
    "again if you need its result and repeating it is safe."
)


class Superseded(Exception):
    """The attempt's fence has moved: it may not act for the Run (nor call the model) any more."""


class JournalUnavailable(Exception):
    """ksquad's API did not answer within PATIENCE_SECONDS: no model call is made without its word."""


@dataclass
class Restored:
    """A conversation's recorded progress: the messages to append, the turns made, the calls still to run
    (OpenAI-style tool_calls of the last turn), and the answer when the last turn gave one."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    to_run: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None
    in_flight: list[str] = field(default_factory=list)  # names of the calls answered with IN_FLIGHT


def restore(steps: list[dict[str, Any]]) -> Restored:
    restored = Restored()
    open_calls: list[dict[str, Any]] = []  # the last turn's calls without a result
    started: dict[str, int] = {}  # call id -> the attempt that started it

    def close_calls() -> None:
        """The last turn's calls without a result, answered before anything that follows them."""
        for call_ in open_calls:
            attempt = started.get(call_["id"])
            text = (
                IN_FLIGHT.format(attempt=attempt) if attempt is not None else "ksquad: this call was not run."
            )
            restored.messages.append({"role": "tool", "tool_call_id": call_["id"], "content": text})
            if attempt is not None:
                restored.in_flight.append(call_.get("function", {}).get("name", "?"))
        open_calls.clear()

    for step in steps:
        data = step.get("data") or {}
        if step["kind"] == "turn":
            close_calls()
            message = data["message"]
            restored.messages.append(message)
            restored.turns += 1
            open_calls.extend(message.get("tool_calls") or [])
            started.clear()
            restored.answer = None if open_calls else str(message.get("content") or "")
        elif step["kind"] == "tool-started":
            started[str(data["id"])] = int(step.get("attempt") or 0)
        elif step["kind"] == "tool":
            message = data["message"]
            restored.messages.append(message)
            open_calls[:] = [c for c in open_calls if c["id"] != message.get("tool_call_id")]
    restored.to_run = [c for c in open_calls if c["id"] not in started]
    open_calls[:] = [c for c in open_calls if c["id"] in started]
    close_calls()
    return restored


class Journal:
    """One task's journal (None `api`: nothing is recorded or asked, as for an agent without ksquad's API)."""

    def __init__(self, api: AttemptApi | None) -> None:
        self.api = api
        self.pending: list[dict[str, Any]] = []
        self.asked = False  # the API said the fence is current since the last model call
        self.full: str | None = None  # why steps are no longer recorded (a bound of the Run), or None
        self.writes = 0
        self.bytes = 0

    @property
    def on(self) -> bool:
        return self.api is not None

    async def read(self) -> list[dict[str, Any]]:
        """The Run's recorded steps, every attempt's (asking the fence too)."""
        if self.api is None:
            return []
        answer = await self._call("GET", None)
        self.asked = True
        steps: list[dict[str, Any]] = answer["steps"]
        return steps

    def add(self, step: int, kind: str, data: dict[str, Any]) -> None:
        if self.api is not None and self.full is None:
            self.pending.append({"step": step, "kind": kind, "data": data})

    async def flush(self) -> None:
        """Write what is pending, or, with nothing pending and nothing asked since the last model call, ask."""
        if self.api is None or (not self.pending and self.asked):
            return
        steps, self.pending = self.pending, []
        body = {"steps": steps}
        try:
            await self._call("POST", body)
        except ApiRefused as err:  # a bound of the Run, or a step it will not take: go on without recording
            self.full = f"{err.status}: {err.reason}"
            log.warning("checkpoints are no longer recorded: %s", self.full)
            await self._call("POST", {"steps": []})  # the fence is asked all the same
        else:
            self.writes += 1
            self.bytes += len(json.dumps(body))
        self.asked = True

    def model_called(self) -> None:
        self.asked = False

    async def _call(self, method: str, body: Any) -> Any:
        assert self.api is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PATIENCE_SECONDS
        delay = 0.5
        while True:
            try:
                return await call(self.api.url, self.api.token, self.api.ca, method, PATH, body)
            except ApiRefused as err:
                if err.status == 409:
                    raise Superseded(err.reason) from None
                if err.status not in (429, 502, 503, 504):
                    raise
                problem = f"{err.status}: {err.reason}"
            except ApiUnreachable as err:
                problem = str(err)
            if loop.time() + delay > deadline:
                raise JournalUnavailable(
                    f"ksquad's API did not take the attempt's checkpoint for {PATIENCE_SECONDS:.0f}s ({problem}): "
                    "no model call is made without its word that this attempt is still current"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
