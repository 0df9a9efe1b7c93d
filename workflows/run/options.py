"""How the Run workflow calls activities: typed stubs (`workflows.activity_types`) with the option presets
every call picks from. A phase's deadline bounds its activities as a whole; bookkeeping is bounded per try."""

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.workflow import ActivityCancellationType

from workflows.activity_types import EntitySignal, signal_with_start
from workflows.entity_types import ThrottleNotice
from workflows.envelope import Warrant
from workflows.model import KsquadModel

A = TypeVar("A")
R = TypeVar("R")

AGENT_HEARTBEAT_TIMEOUT = timedelta(seconds=30)

# Short activities retry until their phase's deadline (schedule-to-close), with capped backoff.
RETRY_UNTIL_DEADLINE = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
# Bookkeeping activities (publish, fence, release, entity signals) are bounded per attempt and by attempts,
# never by schedule-to-close: that clock includes time spent waiting in the task queue, so a busy worker
# (thousands of runs resuming) would fail runs whose work was never even tried.
RETRY_BOOKKEEPING = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30), maximum_attempts=10
)

EntityKind = Literal["CredentialThrottle", "ConcurrencyGate"]


def tenant_priority(namespace: str) -> Priority:
    """The run's namespace as its activities' fairness key: on a server with `matching.enableFairness`, the task
    queue dispatches a backlog round the namespaces, so one tenant's thousand sandboxes do not delay another's
    first (elsewhere the key is carried and ignored)."""
    return Priority(fairness_key=namespace)


def start(
    stub: Callable[[A], Awaitable[R]],
    arg: A,
    *,
    summary: str,
    task_queue: str | None = None,
    deadline: datetime | None = None,
    start_to_close: float = 60,
    heartbeat: timedelta | None = None,
    retry: RetryPolicy | None = None,
    cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
    priority: Priority = Priority.default,
) -> workflow.ActivityHandle[R]:
    """Start the activity `stub` names (its command is issued now, in this step) and return its handle. A
    `deadline` (a phase's bound, from the Run's timeouts) bounds it as a whole, queue time and retries included;
    without one it gets `start_to_close` per try and RETRY_BOOKKEEPING's tries."""
    schedule_to_close = None
    if deadline is not None:
        schedule_to_close = timedelta(seconds=max(1.0, (deadline - workflow.now()).total_seconds()))
    return workflow.start_activity(
        stub,
        arg,
        task_queue=task_queue,
        schedule_to_close_timeout=schedule_to_close,
        start_to_close_timeout=timedelta(seconds=start_to_close),
        heartbeat_timeout=heartbeat,
        retry_policy=retry or (RETRY_UNTIL_DEADLINE if deadline is not None else RETRY_BOOKKEEPING),
        cancellation_type=cancellation_type,
        summary=summary,
        priority=priority,
    )


async def call(
    stub: Callable[[A], Awaitable[R]],
    arg: A,
    *,
    summary: str,
    task_queue: str | None = None,
    deadline: datetime | None = None,
    start_to_close: float = 60,
    heartbeat: timedelta | None = None,
    retry: RetryPolicy | None = None,
    cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
    priority: Priority = Priority.default,
) -> R:
    """Run the activity `stub` names, with `start`'s options, and return its result. A coroutine, not `start`'s
    handle: a call handed to `interruptible` and closed unstarted (an interrupt was already pending) must schedule
    nothing, or the history would differ. The options are spelled out again so that mypy checks every call site."""
    return await start(
        stub,
        arg,
        summary=summary,
        task_queue=task_queue,
        deadline=deadline,
        start_to_close=start_to_close,
        heartbeat=heartbeat,
        retry=retry,
        cancellation_type=cancellation_type,
        priority=priority,
    )


async def call_local(
    stub: Callable[[A], Awaitable[R]], arg: A, *, summary: str, start_to_close: float = 60
) -> R:
    """Run the short bookkeeping activity `stub` names as a local activity of this worker, with
    RETRY_BOOKKEEPING's tries: the server dispatches no task and records one marker, and the workflow goes on in
    the same workflow task instead of a new one (a scheduled, started and completed activity, and a workflow
    task, saved on every run)."""
    return await workflow.execute_local_activity(
        stub,
        arg,
        start_to_close_timeout=timedelta(seconds=start_to_close),
        retry_policy=RETRY_BOOKKEEPING,
        summary=summary,
    )


# The Run's warrant, as the workflow holds it once references are resolved (workflows.envelope).
WarrantOf = Callable[[], Warrant]


async def entity_signal(
    warrant: Warrant, kind: EntityKind, workflow_id: str, signal: str, arg: KsquadModel
) -> ThrottleNotice | None:
    """Signal-with-start an entity workflow (a credential's throttle, a concurrency gate), as the run the warrant
    is for. Short RPCs from this worker's own client: as a local activity the server dispatches no task and
    records one marker."""
    message = EntitySignal(
        warrant=warrant,
        workflow=kind,
        workflow_id=workflow_id,
        signal=signal,
        arg=arg.model_dump(mode="json"),
    )
    return await call_local(
        signal_with_start, message, summary=f"{signal} -> {workflow_id}", start_to_close=30
    )


def later(seconds: float) -> datetime:
    """The workflow's clock `seconds` from now (a phase's deadline)."""
    return workflow.now() + timedelta(seconds=seconds)
