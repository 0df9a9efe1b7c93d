"""How a remote task ends for the run: COMPLETED is the result; every other end is a typed, non-retryable
ApplicationError (RateLimited with the raw Retry-After, CredentialExpired, InputRequired, AgentFailed with the
agent's message) the workflow maps to its policies."""

from datetime import UTC, datetime
from typing import Any

from a2a.helpers import get_message_text
from a2a.types import Task, TaskState
from google.protobuf.json_format import MessageToDict
from temporalio.exceptions import ApplicationError

from activities.agents.progress import OUTPUTS_ARTIFACT, Progress
from workflows.activity_types import AgentError, AgentResult, FailureDetails, RateLimitDetails, TaskPause

ERROR_KEY = "ksquad.io/error"
DUPLICATE_OF = "ksquad.io/duplicate-of"
TERMINAL = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_REJECTED,
}
PAUSED = {TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED}


def agent_error(kind: AgentError, message: str, details: Any) -> ApplicationError:
    return ApplicationError(message[:2000], details, type=kind.value, non_retryable=True)


def struct(message: Any) -> dict[str, Any]:
    """A protobuf Struct field as a dict ({} when unset)."""
    return MessageToDict(message) if message is not None and message.ListFields() else {}


def outcome(task: Task, progress: Progress) -> AgentResult:
    """What the task's end means for the run: its result, or the typed error the workflow maps to a policy."""
    state = task.status.state
    text = get_message_text(task.status.message) if task.status.message.parts else ""
    metadata = {**struct(task.metadata), **struct(task.status.message.metadata)}
    if state == TaskState.TASK_STATE_COMPLETED:
        if not progress.outputs:
            progress.take_outputs(metadata.get(OUTPUTS_ARTIFACT))
        # The agent's answer: its text artifact when it sent one (the final status may only say "done"),
        # else its final message.
        return AgentResult(
            task_id=task.id,
            outputs=progress.outputs,
            artifacts=progress.artifacts,
            summary=(progress.answer or text)[:500],
        )
    pause = TaskPause(task_id=task.id, context_id=task.context_id, message=text[:2000])
    if state == TaskState.TASK_STATE_INPUT_REQUIRED:
        raise agent_error(AgentError.INPUT_REQUIRED, text or "the agent needs input", pause)
    if state == TaskState.TASK_STATE_AUTH_REQUIRED:
        raise agent_error(AgentError.CREDENTIAL_EXPIRED, text or "the agent's credential was refused", pause)
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
    if state == TaskState.TASK_STATE_FAILED and metadata.get(ERROR_KEY) == "token_budget_spent":
        # The agent stopped before a call its budget (the contract's tokenBudget) does not cover: the run ends.
        message = text or "the Run's token budget is spent"
        raise agent_error(
            AgentError.TOKEN_BUDGET_SPENT, message, FailureDetails(message=message[:2000], task_id=task.id)
        )
    what = {
        TaskState.TASK_STATE_CANCELED: "the agent cancelled the task",
        TaskState.TASK_STATE_REJECTED: "the agent rejected the task",
    }.get(state, "the agent failed")
    message = f"{what}: {text}" if text else what
    raise agent_error(
        AgentError.AGENT_FAILED, message, FailureDetails(message=message[:2000], task_id=task.id)
    )


def _resets(value: Any) -> dict[str, str]:
    """The provider's reset headers as the agent passed them up (anything else is ignored)."""
    if not isinstance(value, dict):
        return {}
    return {
        str(k)[:128]: str(v)[:128] for k, v in list(value.items())[:16] if isinstance(v, str | int | float)
    }


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
