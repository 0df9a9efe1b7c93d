"""One agent turn over A2A (`Invocation`): send or find the attempt's message, follow the task's events (recorded,
fenced, by `recording`), and map the task's end to a result or a typed error (`outcomes`). `invoke_agent` runs it."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import httpx
from a2a.client import (
    A2AClientError,
    A2AClientTimeoutError,
    Client,
    ClientCallContext,
)
from a2a.helpers import new_data_part
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
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.agents.a2a_compat import AnswerTooLarge, found_in, not_a2a
from activities.agents.outcomes import DUPLICATE_OF, PAUSED, TERMINAL, agent_error, outcome, struct
from activities.agents.progress import Progress
from activities.agents.recording import Recorder
from store import Holder
from workflows.activity_types import (
    AgentError,
    AgentInvocation,
    AgentResult,
    FailureDetails,
)
from workflows.contract import ExecutionContract

if TYPE_CHECKING:
    from activities.agents import AgentActivities

log = logging.getLogger(__name__)

CONTRACT_PART = "ksquad.io/contract"
MODEL_OVERRIDE = "ksquad.io/model"


async def cancel_and_wait(task: "asyncio.Future[Any]") -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def model_credentials(contract: ExecutionContract) -> dict[str, str]:
    """Each model name of the attempt's contract -> the credential its calls are charged to ("<ns>/<secret>", ""
    for a model without one): the Run's model first, then the Agent's own, its fallback and the Project's."""
    found: dict[str, str] = {}
    for model in contract.models():
        credential = model.credential
        found.setdefault(
            model.name, f"{contract.run.namespace}/{credential.secret_name}" if credential else ""
        )
    return found


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
        self.timing = acts.timing
        self.client = client
        self.inv = inv
        self.progress = progress
        self.identity = inv.contract.run
        self.record = Recorder(
            acts.store,
            holder,
            self.identity,
            progress,
            model_credentials(inv.contract),
            inv.token_budget_left,
        )
        self.acts = acts
        self.work_item: dict[str, str] | None = None  # the contract's workItem, made for this request alone

    async def run(self) -> AgentResult:
        if self.inv.continue_task is None:
            self.work_item = await self.acts.work_item_for(self.inv.contract)
        try:
            return await self._run()
        except AnswerTooLarge as err:
            self._unreadable(err)
            raise
        except A2AClientError as err:  # outside a stream: a broken answer, or nobody answering at all
            self._unreadable(err)
            if "HTTP Error 401" in (err.message or ""):
                raise agent_error(
                    AgentError.INVALID_AGENT_RESPONSE,
                    "the agent refused this worker as the attempt's caller (HTTP 401): the sandbox never learned "
                    "its token's hash, or this worker holds another sandbox token key than the one it was made with",
                    FailureDetails(message=err.message[:500], task_id=self.progress.task_id),
                ) from None
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
            self._unreadable(err)
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"the agent answered with an error: {type(err).__name__}: {err.message}",
                FailureDetails(message=err.message, task_id=self.progress.task_id),
            ) from None

    def _unreadable(self, err: BaseException) -> None:
        """InvalidAgentResponse naming why, when the answer could not be read: a line past its bound, or not
        A2A 1.0 (a2a-sdk's own error says only "This operation is not supported")."""
        too_large = found_in(err, AnswerTooLarge)
        if too_large is not None:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                str(too_large),
                FailureDetails(message=str(too_large), task_id=self.progress.task_id),
            ) from None
        deviation = not_a2a(err)
        if deviation is not None:
            raise agent_error(
                AgentError.INVALID_AGENT_RESPONSE,
                f"the agent's answer is not A2A 1.0: {deviation}",
                FailureDetails(message=deviation[:500], task_id=self.progress.task_id),
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
                await self.record.catch_up_artifacts(final)
            return outcome(final, self.progress)

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
            contract = self.inv.contract.for_sandbox()
            if self.work_item is not None:
                contract["workItem"] = self.work_item
            # Its checkpoints, and the fence it asks for before each model call.
            spec = self.inv.warrant.envelope.spec
            memory = tuple(
                f"{scope}/{name}"
                for scope, name in (("teams", spec.team_ref), ("projects", spec.project_ref))
                if name
            )
            attempt_api = self.acts.keys.attempt_access(self.inv.contract.run, memory)
            if attempt_api is not None:
                contract["attemptApi"] = attempt_api
            if self.inv.token_budget_left is not None:
                contract["tokenBudget"] = self.inv.token_budget_left  # what the Run may still use
            if self.inv.contract.agent.contract_in == "dataPart":
                parts.append(new_data_part({CONTRACT_PART: contract}))
        message = Message(
            role=Role.ROLE_USER, message_id=self.inv.message_id, context_id=self.inv.context_id, parts=parts
        )
        if self.inv.continue_task is None and self.inv.contract.agent.contract_in == "metadata":
            message.metadata.update({CONTRACT_PART: cast(Any, contract)})  # a Struct takes any JSON
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
                    await self.record.status(
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
                    await self.record.artifact(event.artifact_update.artifact)
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

    async def cancel_remote(self) -> bool:
        """CancelTask, then wait (bounded) until the agent reports the task ended. False: it did not say so in
        time (its task may go on); True also when there was no task to cancel."""
        if not self.progress.task_id:
            return True
        with contextlib.suppress(A2AError, A2AClientError):
            answer = await self.client.cancel_task(
                CancelTaskRequest(id=self.progress.task_id),
                context=ClientCallContext(timeout=self.timing.probe_seconds),
            )
            if answer.status.state in TERMINAL:  # the agent stopped it before answering: no need to ask again
                return True
        deadline = asyncio.get_running_loop().time() + self.timing.cancel_wait_seconds
        while asyncio.get_running_loop().time() < deadline:
            with contextlib.suppress(A2AError, A2AClientError):
                task = await self._get(self.progress.task_id)
                if task.status.state in TERMINAL:
                    return True
            await asyncio.sleep(0.2)
        log.warning(
            "%s: task %s not CANCELED after %.0fs",
            self.identity.name,
            self.progress.task_id,
            self.timing.cancel_wait_seconds,
        )
        return False

    def cancel_unconfirmed(self) -> ApplicationError:
        """What the cancelled activity ends with instead of its cancellation when the agent did not confirm it:
        the workflow, which waits for the cancellation to complete, records it on the Run."""
        return agent_error(
            AgentError.CANCEL_UNCONFIRMED,
            f"{self.inv.contract.agent.name} did not confirm the cancel of its task {self.progress.task_id} within "
            f"{self.timing.cancel_wait_seconds:.0f}s: it may still be at work",
            FailureDetails(message="cancel not confirmed", task_id=self.progress.task_id),
        )


def task_text(contract: ExecutionContract) -> str:
    """The message's text: what any A2A agent reads. The task (input `task`, then the other inputs as
    `key: value` lines); a ksquad agent reads the whole contract from the data part beside it."""
    inputs = contract.inputs
    lines = [inputs["task"]] if "task" in inputs else []
    lines += [f"{key}: {value}" for key, value in inputs.items() if key != "task"]
    run = contract.run
    return "\n".join(lines) or f"Attempt {run.attempt} of run {run.namespace}/{run.name}."  # never empty


def _network_failure(err: A2AClientError) -> bool:
    """Transport failures (the agent is gone or unreachable), as opposed to answers we cannot read."""
    cause = err.__cause__
    return isinstance(cause, httpx.TransportError) or "Network communication error" in (err.message or "")
