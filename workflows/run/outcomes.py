"""How an attempt or a run ends other than by success: raised by the phase steps, handled by the lifecycle."""

from datetime import datetime

from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.exceptions import TimeoutError as TemporalTimeoutError

from workflows.activity_types import COPY_REFUSED, UNSEALED


class AttemptFailed(Exception):
    """The attempt failed; the run retries (fence, delete the sandbox, release, back off) while it may."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RunFailed(Exception):
    """The run fails now, without retrying (it can never succeed as written, or a phase ran out of time)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


class RateLimitPause(Exception):
    """The provider said 429: the agent's task ended; the run pauses until `until`, then a new attempt."""

    def __init__(self, until: datetime, message: str) -> None:
        super().__init__(message)
        self.until = until
        self.message = message


class Reroute(Exception):
    """Limits in a row: the run moves to the eligible agent at `agent_index`."""

    def __init__(self, agent_index: int, message: str) -> None:
        super().__init__(message)
        self.agent_index = agent_index
        self.message = message


def cause(err: BaseException) -> str:
    """The innermost message of a Temporal failure chain: what actually went wrong."""
    while isinstance(err, ActivityError | TemporalTimeoutError) and err.cause is not None:
        err = err.cause
    if isinstance(err, TemporalTimeoutError):
        return f"timed out ({err.type.name if err.type else 'timeout'})"
    return str(err) or type(err).__name__


def refusal(err: BaseException | None) -> str | None:
    """UNSEALED or COPY_REFUSED when the bridge or the worker refused to act for this execution (it is not one the
    bridge sealed, or it is a copy of one): nothing it asks for will ever be done, so the run ends with that reason."""
    while err is not None:
        if isinstance(err, ApplicationError) and err.type in (UNSEALED, COPY_REFUSED):
            return err.type
        err = err.cause if isinstance(err, FailureError) else None
    return None
