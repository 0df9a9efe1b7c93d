"""The attempt's journal: each completed step recorded in ksquad's store through its API (api.attempts) under the
attempt's fence, and read back by the next attempt's agent, which goes on after the last step instead of asking
the model again.

Steps (their `data`):
- `turn`: a model turn, `{"message": <the assistant message>, "usage": <its usage report, when it had one>}`;
- `tool-started`: a tool call about to run, `{"id", "name"}`: recorded before the call, so a retry knows the call
  may have taken effect;
- `tool`: its result, `{"message": <the tool message>}`.
Steps wait in `pending` and are written together (`flush`): before a tool runs, before every model call and
before the answer is given. A flush with nothing to write still asks the API whether the attempt's fence is
current, so an attempt fenced off (a later attempt, a cancel or a deadline, whether or not its cancel reached the
agent) learns it before its next model call and spends no further token. An API that does not answer (ksquad-api
restarting, the store down) is asked again for RETRY_SECONDS, then the attempt goes on, its steps kept until the
API answers: an outage costs durability, never the Run; only a fence that moved stops it (the fence cannot move
while the store is down).

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
RETRY_SECONDS = 2.0  # how long an unanswered API is asked again before the agent goes on without its word
MAX_PENDING = 256  # steps kept for an API that does not answer; past it, the task records no more
IN_FLIGHT = (
    "ksquad: this tool call was in flight when attempt {attempt} stopped; whether it took effect is unknown. Call it "
    "again if you need its result and repeating it is safe."
)


class Superseded(Exception):
    """The attempt's fence has moved: it may not act for the Run (nor call the model) any more."""


@dataclass
class Restored:
    """A conversation's recorded progress: the messages to append, the turns made, the calls still to run
    (OpenAI-style tool_calls of the last turn), and the answer when the last turn gave one."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    to_run: list[dict[str, Any]] = field(default_factory=list)
    answer: str | None = None
    in_flight: list[str] = field(default_factory=list)  # names of the calls answered with IN_FLIGHT
    # The recorded turns' usage reports, each with its "attempt": reported again by the retry, since the
    # orchestrator may have died before it recorded them (it records each call of an attempt once).
    usage: list[dict[str, Any]] = field(default_factory=list)


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

    turns_seen: set[tuple[int, int]] = set()  # (attempt, step): a write retried after its answer was lost is
    answered: set[str] = set()  # recorded twice; each turn and each result counts once
    for step in steps:
        data = step.get("data") or {}
        if step["kind"] == "turn":
            key = (int(step.get("attempt") or 0), int(step.get("step") or 0))
            if key in turns_seen:
                continue
            turns_seen.add(key)
            close_calls()
            if isinstance(data.get("usage"), dict) and key[0] > 0:
                restored.usage.append({**data["usage"], "attempt": key[0]})
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
            if message.get("tool_call_id") in answered:
                continue
            answered.add(str(message.get("tool_call_id")))
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
        self.unanswered: str | None = None  # why the API did not answer the last time it was asked, or None
        self.told = False  # the task said so (once an outage)
        self.writes = 0
        self.bytes = 0

    @property
    def on(self) -> bool:
        return self.api is not None

    async def read(self) -> list[dict[str, Any]]:
        """The Run's recorded steps, every attempt's (asking the fence too); none when the API does not answer (the
        attempt goes on from the start)."""
        if self.api is None:
            return []
        answer = await self._call("GET", None)
        if answer is None:
            return []
        self.asked = True
        steps: list[dict[str, Any]] = answer["steps"]
        return steps

    def add(self, step: int, kind: str, data: dict[str, Any]) -> None:
        if self.api is None or self.full is not None:
            return
        if len(self.pending) >= MAX_PENDING:
            self.full = f"{MAX_PENDING} steps waited for an API that did not answer"
            self.pending = []
            return
        self.pending.append({"step": step, "kind": kind, "data": data})

    async def flush(self) -> None:
        """Write what is pending, or, with nothing pending and nothing asked since the last model call, ask. An API
        that does not answer keeps the steps pending (written at the next flush that it answers) and lets the
        attempt go on: an outage costs durability, not the Run; a fence that moved (409) stops it."""
        if self.api is None or (not self.pending and self.asked):
            return
        body = {"steps": self.pending}
        try:
            answered = await self._call("POST", body)
        except ApiRefused as err:  # a bound of the Run, or a step it will not take: go on without recording
            self.full = f"{err.status}: {err.reason}"
            self.pending = []
            log.warning("checkpoints are no longer recorded: %s", self.full)
            answered = await self._call("POST", {"steps": []})  # the fence is asked all the same
            body = {"steps": []}
        if answered is None:
            return
        self.pending = []
        if body["steps"]:
            self.writes += 1
            self.bytes += len(json.dumps(body))
        self.asked = True

    def model_called(self) -> None:
        self.asked = False

    def news(self) -> str | None:
        """What the task should say, once: the API stopped answering (and the attempt goes on without its word)."""
        if self.unanswered is None or self.told:
            return None
        self.told = True
        return (
            f"ksquad's API does not answer ({self.unanswered}): going on; the steps are recorded when it answers "
            "again, and the attempt's fence is asked then"
        )

    async def _call(self, method: str, body: Any) -> Any:
        """The API's answer, or None when it did not answer within RETRY_SECONDS. Superseded on 409; ApiRefused
        for a refusal of the steps."""
        assert self.api is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_SECONDS
        delay = 0.25
        while True:
            try:
                answer = await call(self.api.url, self.api.token, self.api.ca, method, PATH, body)
            except ApiRefused as err:
                if err.status == 409:
                    raise Superseded(err.reason) from None
                if err.status not in (429, 502, 503, 504):
                    raise
                problem = f"{err.status}: {err.reason}"
            except ApiUnreachable as err:
                problem = str(err)
            else:
                if self.unanswered is not None:
                    self.unanswered, self.told = None, False
                return answer
            if loop.time() + delay > deadline:
                if self.unanswered is None:
                    log.warning("ksquad's API does not answer: %s", problem)
                self.unanswered = problem
                return None
            await asyncio.sleep(delay)
            delay *= 2
