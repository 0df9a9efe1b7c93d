"""The interrupt slot: signals put an interrupt in it (cancel, pause, another run's rate limit); a phase step
awaits its work through `interruptible()`, which stops that work when an interrupt it accepts arrives."""

import asyncio
import contextlib
from collections.abc import Awaitable
from enum import StrEnum
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import CancelledError as TemporalCancelledError

from workflows.patches import Patches

T = TypeVar("T")
# A Temporal cancel that arrives while another interrupt stops the work is kept (workflow.patched: runs that
# swallowed one before replay as they ran).
CANCEL_KEPT_PATCH = "cancel-kept-while-interrupted"


class Interrupt(StrEnum):
    CANCEL = "cancel"
    PAUSE = "pause"
    THROTTLED = "throttled"  # another run's 429 throttled the credential this run uses


# What may stop a step: claiming, starting a sandbox and the agent's work stop for any interrupt (a throttle
# too: they would only wait); waits and other steps for a cancel or a pause.
ANY_INTERRUPT = frozenset(Interrupt)
CANCEL_OR_PAUSE = frozenset({Interrupt.CANCEL, Interrupt.PAUSE})


class Interrupted(Exception):
    def __init__(self, kind: Interrupt) -> None:
        super().__init__(kind.value)
        self.kind = kind


class PhaseTimeout(Exception):
    """The bound given to `interruptible()` ran out before the work ended."""


class Interrupts:
    def __init__(self, patches: Patches) -> None:
        self.pending: Interrupt | None = None
        self.patches = patches

    def take(self) -> Interrupt:
        """The pending interrupt, consumed unless it is a cancellation (that one stays until the run ends)."""
        assert self.pending is not None
        kind = self.pending
        if kind != Interrupt.CANCEL:
            self.pending = None
        return kind

    async def interruptible(
        self,
        aw: Awaitable[T],
        kinds: frozenset[Interrupt],
        timeout: float | None = None,  # noqa: ASYNC109
        deadline_summary: str | None = None,
    ) -> T:
        """Await `aw` unless an interrupt of `kinds` arrives first: then cancel it (an activity's cancellation
        completes first) and raise Interrupted. With `timeout`, raise PhaseTimeout when it runs out."""
        if self.pending in kinds:
            if asyncio.iscoroutine(aw):
                aw.close()  # never started: close it, or Python warns that it was never awaited
            raise Interrupted(self.take())
        task = asyncio.ensure_future(aw)
        try:
            await workflow.wait_condition(
                lambda: task.done() or self.pending in kinds,
                timeout=timeout,
                timeout_summary=deadline_summary,
            )
        except TimeoutError:
            await cancel_and_wait(task, self.patches)
            raise PhaseTimeout() from None
        except asyncio.CancelledError:
            await cancel_and_wait(task, self.patches)
            raise
        if task.done():
            return task.result()
        kind = self.take()
        await cancel_and_wait(task, self.patches)
        raise Interrupted(kind)


async def cancel_and_wait(task: "asyncio.Future[Any]", patches: Patches) -> None:
    """Cancel `task` and wait until it has ended, whatever it ends with. A cancellation of the waiting run itself
    (Temporal's cancel, arriving while another interrupt stops the work) is not the task's ending and goes on
    up: swallowing it with the task's own CancelledError lost the run's cancellation (it went on to retry)."""
    if task.done():
        return
    task.cancel()
    try:
        await workflow.wait([task])  # raises only when this coroutine itself is cancelled
    except asyncio.CancelledError:
        if not task.done():
            await workflow.wait([task])  # let the work finish stopping (its teardown needs that), then go on
        if patches.patched(CANCEL_KEPT_PATCH):
            raise
        # Recorded before the patch: the run went on without its cancellation, and replays the same way.
    finally:
        if task.done() and not task.cancelled():
            with contextlib.suppress(
                asyncio.CancelledError, ActivityError, TemporalCancelledError, ApplicationError
            ):
                task.result()  # retrieved: the work's own ending is not this caller's error
