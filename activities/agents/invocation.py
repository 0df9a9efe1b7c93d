"""One agent turn over A2A (`Invocation`): send or find the attempt's message, follow the task's events, store
progress and artifacts fenced, and map the task's end to a result or a typed error. `invoke_agent` runs it."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    Client,
    ClientCallContext,
)
from a2a.helpers import get_data_parts, get_message_text, get_text_parts, new_data_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import A2AError, InternalError, UnsupportedOperationError
from google.protobuf.json_format import MessageToDict
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.claims import as_activity_error
from store import Holder, StaleFence, StoreError
from workflows.activity_types import (
    CLAIM_LEASE_SECONDS,
    AgentError,
    AgentInvocation,
    AgentResult,
    FailureDetails,
    RateLimitDetails,
    TaskPause,
)
from workflows.contract import ExecutionContract
from workflows.status import Artifact

if TYPE_CHECKING:
    from activities.agents import AgentActivities

log = logging.getLogger(__name__)

CONTRACT_PART = "ksquad.io/contract"
MODEL_OVERRIDE = "ksquad.io/model"
OUTPUTS_ARTIFACT = "ksquad.io/outputs"
ERROR_KEY = "ksquad.io/error"
DUPLICATE_OF = "ksquad.io/duplicate-of"

MAX_OUTPUTS = 32  # keys in status.outputs
MAX_OUTPUT_VALUE = 4096  # characters per output value
MAX_ARTIFACT_BYTES = 1 << 20  # stored inline; larger artifacts are refused as invalid responses
MAX_ARTIFACTS = 64  # per attempt: they are listed in the Run's status, which must stay small
# Progress is stored as it comes up to a burst, then at most PROGRESS_PER_SECOND (a token bucket); the updates
# not stored are counted in the next stored one, and every change of state is stored. An agent flooding
# progress must not flood the store.
PROGRESS_BURST = 20
PROGRESS_PER_SECOND = 5.0
TERMINAL = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
}
PAUSED = {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}
# An agent's card is read once per endpoint for this long: a long-lived agent (an Agent's `endpoint`) served a
# card request for every run, a third of its work for a short task. Sandboxes have an endpoint each, so for
# them nothing changes; a failed call forgets its endpoint's card.
CARD_TTL_SECONDS = 30.0
MAX_CACHED_CARDS = 256


def agent_error(kind: AgentError, message: str, details: Any) -> ApplicationError:
    return ApplicationError(message[:2000], details, type=kind.value, non_retryable=True)


def struct(message: Any) -> dict[str, Any]:
    """A protobuf Struct field as a dict ({} when unset)."""
    return MessageToDict(message) if message is not None and message.ListFields() else {}


@dataclass
class Timing:
    heartbeat_seconds: float = 5.0
    stall_seconds: float = 20.0  # no event for this long: ask the agent whether it is still there
    probe_seconds: float = 5.0
    cancel_wait_seconds: float = 10.0
    lease_seconds: float = CLAIM_LEASE_SECONDS


@dataclass
class Progress:
    """What the activity has seen of the remote task (also its heartbeat details)."""

    task_id: str | None = None
    state: str = ""
    events: int = 0
    artifacts: list[Artifact] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    recorded_state: int | None = None  # of the last status stored
    tokens: float = PROGRESS_BURST  # status updates that may be stored now, refilled at PROGRESS_PER_SECOND
    refilled_at: float = field(default_factory=time.monotonic)
    coalesced: int = 0  # status updates not stored since the last stored one
    answer: str = ""  # the text of the last text artifact: the agent's answer when it sends one

    def may_record(self, state: int) -> bool:
        now = time.monotonic()
        self.tokens = min(PROGRESS_BURST, self.tokens + (now - self.refilled_at) * PROGRESS_PER_SECOND)
        self.refilled_at = now
        if state != self.recorded_state or self.tokens >= 1:
            self.tokens -= 1
            return True
        self.coalesced += 1
        return False

    def heartbeat(self) -> dict[str, Any]:
        return {"taskId": self.task_id, "state": self.state, "events": self.events}


def previous_task_id() -> str | None:
    """The remote task an earlier attempt of this activity started, from its last heartbeat."""
    details = activity.info().heartbeat_details
    if details and isinstance(details[0], dict):
        task_id = details[0].get("taskId")
        return str(task_id) if task_id else None
    return None


async def cancel_and_wait(task: "asyncio.Future[Any]") -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


class Invocation:
    """One run of invoke_agent against one agent."""

    def __init__(
        self,
        acts: "AgentActivities",
        client: Client,
        inv: AgentInvocation,
        holder: Holder,
        progress: Progress,
    ) -> None:
        self.store = acts.store
        self.timing = acts.timing
        self.client = client
        self.inv = inv
        self.holder = holder
        self.progress = progress
        self.identity = inv.contract.run

    async def run(self) -> AgentResult:
        try:
            return await self._run()
        except A2AClientError as err:  # outside a stream: a broken answer, or nobody answering at all
            if _network_failure(err):
                raise agent_error(
                    AgentError.SANDBOX_LOST,
                    f"the agent stopped answering: {err.message}",
                    FailureDetails(message=err.message, task_id=self.progress.task_id),
                ) from None
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"invalid A2A response: {err.message}",
                FailureDetails(message=err.message, task_id=self.progress.task_id),
            ) from None
        except A2AError as err:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"the agent answered with an error: {type(err).__name__}: {err.message}",
                FailureDetails(message=err.message, task_id=self.progress.task_id),
            ) from None

    async def _run(self) -> AgentResult:
        task = await self._find_task()
        events = self._follow(task) if task is not None else self._send()
        while True:
            try:
                final = await self._consume(events)
            except A2AClientTimeoutError:
                final = None  # a long silence: is the agent still there?
            except InternalError as err:
                raise agent_error(
                    AgentError.AGENT_FAILED,
                    f"the agent crashed: {err.message}",
                    FailureDetails(message=err.message, task_id=self.progress.task_id),
                ) from None
            except A2AClientError as err:
                if not _network_failure(err):
                    raise
                final = None  # the stream broke: is the agent still there?
            if final is None or final.status.state not in TERMINAL | PAUSED:
                task = await self._probe()
                if task.status.state in TERMINAL | PAUSED:
                    final = task
                else:
                    events = self._follow(task)
                    continue
            duplicate_of = struct(final.metadata).get(DUPLICATE_OF)
            if final.status.state == TaskState.TASK_STATE_REJECTED and duplicate_of:
                # our own agent refused a repeated message id: follow the original task instead
                self.progress.task_id = str(duplicate_of)
                events = self._follow(await self._get(str(duplicate_of)))
                continue
            if final.status.state == TaskState.TASK_STATE_COMPLETED:
                await self._catch_up_artifacts(final)
            return self._outcome(final)

    # --- finding, sending, following ----------------------------------------------------------------------

    async def _find_task(self) -> Task | None:
        if self.progress.task_id:
            return await self._get(self.progress.task_id)
        if self.inv.continue_task is not None or activity.info().attempt == 1:
            # The first try of this call: no earlier try can have sent its message, so there is nothing to
            # find (a round trip to the agent saved per run; our agent also refuses a repeated message id).
            return None
        listed = await self.client.list_tasks(
            ListTasksRequest(context_id=self.inv.context_id, history_length=50)
        )
        for task in listed.tasks:
            if any(m.message_id == self.inv.message_id for m in task.history):
                log.info("%s: found task %s for message %s", self.identity.name, task.id, self.inv.message_id)
                self.progress.task_id = task.id
                return task
        return None

    async def _get(self, task_id: str) -> Task:
        return await self.client.get_task(GetTaskRequest(id=task_id, history_length=1))

    def _message(self) -> Message:
        text = task_text(self.inv.contract)
        if self.inv.continue_task is not None:
            text = self.inv.continue_task.text or "The credential was refreshed: continue."
        parts = [Part(text=text)]
        # The contract (prompts, inputs) travels over A2A, never in a pod spec.
        if self.inv.continue_task is None:
            parts.append(new_data_part({CONTRACT_PART: self.inv.contract.for_sandbox()}))
        message = Message(
            role=Role.ROLE_USER, message_id=self.inv.message_id, context_id=self.inv.context_id, parts=parts
        )
        message.metadata.update(
            {MODEL_OVERRIDE: self.inv.contract.model.model_dump(mode="json", exclude_none=True)}
        )
        if self.inv.continue_task is not None:
            message.task_id = self.inv.continue_task.task_id
            message.context_id = self.inv.continue_task.context_id
        return message

    async def _send(self) -> AsyncIterator[StreamResponse]:
        async for event in self.client.send_message(SendMessageRequest(message=self._message())):
            yield event

    async def _follow(self, task: Task) -> AsyncIterator[StreamResponse]:
        """Resubscribe to a running task: its snapshot first, then live events."""
        self.progress.task_id = task.id
        if task.status.state in TERMINAL | PAUSED:
            yield StreamResponse(task=task)
            return
        try:
            async for event in self.client.subscribe(SubscribeToTaskRequest(id=task.id)):
                yield event
        except UnsupportedOperationError:  # it ended meanwhile
            yield StreamResponse(task=await self._get(task.id))

    async def _consume(self, events: AsyncIterator[StreamResponse]) -> Task | None:
        """Record the events; return the task once it is over or waits, None when the stream just ended."""
        final: Task | None = None
        async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
            async for event in stream:
                self.progress.events += 1
                kind = event.WhichOneof("payload")
                if kind == "task":
                    final = event.task
                    self.progress.task_id = event.task.id
                    self.progress.state = TaskState.Name(event.task.status.state)
                elif kind == "status_update":
                    update = event.status_update
                    self.progress.task_id = update.task_id
                    self.progress.state = TaskState.Name(update.status.state)
                    await self._record_status(
                        update.status.state, update.status.message, struct(update.metadata)
                    )
                    if update.status.state in TERMINAL | PAUSED:
                        final = Task(
                            id=update.task_id,
                            context_id=update.context_id,
                            status=update.status,
                            metadata=update.metadata,
                        )
                elif kind == "artifact_update":
                    await self._record_artifact(event.artifact_update.artifact)
                elif kind is None:  # valid JSON-RPC whose result is none of the A2A stream events
                    raise agent_error(
                        AgentError.INVALID_AGENT_RESPONSE,
                        "the agent answered with an event that is no task, status, artifact or message",
                        FailureDetails(message=str(event)[:500]),
                    )
                elif kind == "message":  # a plain A2A agent may answer with a message: its answer, done
                    answer = event.message
                    final = Task(
                        id=answer.task_id or answer.message_id,
                        context_id=answer.context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=answer),
                    )
                activity.heartbeat(self.progress.heartbeat())
                if final is not None and final.status.state in TERMINAL | PAUSED:
                    return final
        return final

    async def _probe(self) -> Task:
        """The stream went quiet or broke: ask for the task. An agent that does not answer is lost."""
        if not self.progress.task_id:
            raise agent_error(
                AgentError.SANDBOX_LOST,
                "the agent stopped answering before it started a task",
                FailureDetails(message="no task id"),
            )
        try:
            return await self.client.get_task(
                GetTaskRequest(id=self.progress.task_id, history_length=1),
                context=ClientCallContext(timeout=self.timing.probe_seconds),
            )
        except (A2AClientError, A2AError) as err:
            raise agent_error(
                AgentError.SANDBOX_LOST,
                f"the agent stopped answering: {err.message}",
                FailureDetails(message=err.message, task_id=self.progress.task_id),
            ) from None

    async def cancel_remote(self) -> None:
        """CancelTask, then wait (bounded) until the agent reports CANCELED."""
        if not self.progress.task_id:
            return
        with contextlib.suppress(A2AError, A2AClientError):
            await self.client.cancel_task(
                CancelTaskRequest(id=self.progress.task_id),
                context=ClientCallContext(timeout=self.timing.probe_seconds),
            )
        deadline = asyncio.get_running_loop().time() + self.timing.cancel_wait_seconds
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(A2AError, A2AClientError):
                task = await self._get(self.progress.task_id)
                if task.status.state in TERMINAL:
                    return
            await asyncio.sleep(0.2)
        log.warning(
            "%s: task %s not CANCELED after %.0fs",
            self.identity.name,
            self.progress.task_id,
            self.timing.cancel_wait_seconds,
        )

    # --- recording (fenced) -------------------------------------------------------------------------------

    async def _record_status(self, state: int, message: Message, metadata: dict[str, Any]) -> None:
        progress = self.progress
        if not progress.may_record(state):
            return
        text = get_message_text(message) if message.parts else ""
        data = {"state": TaskState.Name(state), **_small(metadata)}
        if progress.coalesced:
            data["coalesced"] = progress.coalesced
        await self._fenced(
            self.store.append_event(
                self.holder,
                self.identity.fence,
                self.identity.attempt,
                "status",
                text[:4000],
                data,
                work_item_ref=self.identity.work_item_ref,
            )
        )
        progress.recorded_state, progress.coalesced = state, 0

    async def _record_artifact(self, artifact: Any) -> None:
        # An unnamed artifact is named by its place (its id is a UUID, which says nothing to a user).
        name = artifact.name or f"artifact-{len(self.progress.artifacts) + 1}"
        data = get_data_parts(list(artifact.parts))
        texts = get_text_parts(list(artifact.parts))
        if name == OUTPUTS_ARTIFACT:
            for part in data:
                self._take_outputs(part)
            return
        if len(self.progress.artifacts) >= MAX_ARTIFACTS:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"more than {MAX_ARTIFACTS} artifacts in one attempt (the next was {name})",
                FailureDetails(message=f"more than {MAX_ARTIFACTS} artifacts", task_id=self.progress.task_id),
            )
        content = ("\n".join(texts) if texts else json.dumps(data)).encode()
        if len(content) > MAX_ARTIFACT_BYTES:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"artifact {name} is {len(content)} bytes, more than the {MAX_ARTIFACT_BYTES} allowed",
                FailureDetails(message="artifact too large", task_id=self.progress.task_id),
            )
        media_type = "text/plain" if texts else "application/json"
        if texts:
            self.progress.answer = "\n".join(texts)
        await self._fenced(
            self.store.put_artifact(
                self.holder,
                self.identity.fence,
                name,
                media_type=media_type,
                content=content,
                work_item_ref=self.identity.work_item_ref,
            )
        )
        self.progress.artifacts.append(
            Artifact(
                name=name,
                media_type=media_type,
                size=len(content),
                uri=f"ksquad://runs/{self.identity.uid}/artifacts/{name}",
            )
        )

    def _take_outputs(self, outputs: Any) -> None:
        if isinstance(outputs, dict):
            for key, value in list(outputs.items())[:MAX_OUTPUTS]:
                self.progress.outputs[str(key)] = str(value)[:MAX_OUTPUT_VALUE]

    async def _catch_up_artifacts(self, task: Task) -> None:
        """A task read whole (found again after a restart, or probed after a broken stream) carries artifacts
        whose stream events this call never saw."""
        seen = {a.name for a in self.progress.artifacts}
        for artifact in task.artifacts:
            name = artifact.name or artifact.artifact_id
            if name == OUTPUTS_ARTIFACT or name not in seen:
                await self._record_artifact(artifact)

    async def _fenced(self, write: Any) -> None:
        try:
            await write
        except StaleFence as err:
            raise ApplicationError(f"fenced off: {err}", type="StaleFence", non_retryable=True) from None
        except StoreError as err:
            raise as_activity_error(err) from None

    # --- outcomes -----------------------------------------------------------------------------------------

    def _outcome(self, task: Task) -> AgentResult:
        state = task.status.state
        text = get_message_text(task.status.message) if task.status.message.parts else ""
        metadata = {**struct(task.metadata), **struct(task.status.message.metadata)}
        if state == TaskState.TASK_STATE_COMPLETED:
            if not self.progress.outputs:
                self._take_outputs(metadata.get(OUTPUTS_ARTIFACT))
            # The agent's answer: its text artifact when it sent one (the final status may only say "done"),
            # else its final message.
            return AgentResult(
                task_id=task.id,
                outputs=self.progress.outputs,
                artifacts=self.progress.artifacts,
                summary=(self.progress.answer or text)[:500],
            )
        pause = TaskPause(task_id=task.id, context_id=task.context_id, message=text[:2000])
        if state == TaskState.TASK_STATE_INPUT_REQUIRED:
            raise agent_error(AgentError.INPUT_REQUIRED, text or "the agent needs input", pause)
        if state == TaskState.TASK_STATE_AUTH_REQUIRED:
            raise agent_error(
                AgentError.CREDENTIAL_EXPIRED, text or "the agent's credential was refused", pause
            )
        if state == TaskState.TASK_STATE_FAILED and metadata.get(ERROR_KEY) == "rate_limited":
            details = RateLimitDetails(
                retry_after=_str(metadata.get("retryAfter")),
                retry_after_ms=_str(metadata.get("retryAfterMs")),
                response_date=_str(metadata.get("date")),
                provider_resets=_resets(metadata.get("resets")),
                observed_at=datetime.now(UTC),
                model=_str(metadata.get("model")),
                credential=_str(metadata.get("credential")),
            )
            raise agent_error(AgentError.RATE_LIMITED, text or "rate limited", details)
        what = {
            TaskState.TASK_STATE_CANCELED: "the agent cancelled the task",
            TaskState.TASK_STATE_REJECTED: "the agent rejected the task",
        }.get(state, "the agent failed")
        message = f"{what}: {text}" if text else what
        raise agent_error(
            AgentError.AGENT_FAILED, message, FailureDetails(message=message[:2000], task_id=task.id)
        )


def task_text(contract: ExecutionContract) -> str:
    """The message's text: what any A2A agent reads. The task (input `task`, then the other inputs as
    `key: value` lines); a ksquad agent reads the whole contract from the data part beside it."""
    inputs = contract.inputs
    lines = [inputs["task"]] if "task" in inputs else []
    lines += [f"{key}: {value}" for key, value in inputs.items() if key != "task"]
    run = contract.run
    return "\n".join(lines) or f"Attempt {run.attempt} of run {run.namespace}/{run.name}."  # never empty


def _resets(value: Any) -> dict[str, str]:
    """The provider's reset headers as the agent passed them up (anything else is ignored)."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k)[:128]: str(v)[:128] for k, v in list(value.items())[:16] if isinstance(v, str | int | float)
    }


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _small(metadata: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in list(metadata.items())[:20] if len(json.dumps(v, default=str)) < 1000}


def _network_failure(err: A2AClientError) -> bool:
    """Transport failures (the agent is gone or unreachable), as opposed to answers we cannot read."""
    cause = err.__cause__
    return isinstance(cause, httpx.TransportError) or "Network communication error" in (err.message or "")
