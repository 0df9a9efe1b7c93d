"""The pauses that wait for a signal: Manual (`pause`, then `resume`), InputRequired (`input`) and
CredentialExpired (`credential_refreshed`), each bounded by timeouts.pausedSeconds. A `pause` sent during another
pause takes over at once; after `resume` the run waits again for what it was waiting for."""

from collections.abc import Callable

from temporalio import workflow

from workflows.activity_types import TaskPause
from workflows.run.holdings import Holdings
from workflows.run.interrupts import CANCEL_OR_PAUSE, Interrupt, Interrupted, Interrupts
from workflows.run.mirror import StatusMirror
from workflows.run.options import later
from workflows.run.outcomes import RunFailed
from workflows.signals import RunSignal
from workflows.spec import RunSpec
from workflows.status import PauseReason, Phase


class Pauses:
    def __init__(self, spec: RunSpec, mirror: StatusMirror, interrupts: Interrupts, held: Holdings) -> None:
        self.paused_seconds = spec.timeouts.paused_seconds
        self.mirror = mirror
        self.interrupts = interrupts
        self.held = held
        self.message: str | None = None  # the `pause` signal's reason, shown while Paused(Manual)
        self.resume_requested = False
        self.pending_input: str | None = None
        self.credential_refreshes = 0  # rotations of this run's credential seen so far

    # --- what the signals say -----------------------------------------------------------------------------

    def requested(self, reason: str | None) -> None:
        """`pause`: interrupt what the run is doing, unless it is held by a manual pause already."""
        self.message = reason
        status = self.mirror.status
        held = status.phase == Phase.PAUSED and status.pause_reason == PauseReason.MANUAL
        if self.interrupts.pending is None and not held:
            self.interrupts.pending = Interrupt.PAUSE
        self.resume_requested = False

    def resumed(self) -> None:
        if self.interrupts.pending == Interrupt.PAUSE:
            self.interrupts.pending = None  # the pause had not taken effect yet
        self.resume_requested = True

    # --- waiting ------------------------------------------------------------------------------------------

    async def hold_or_raise(
        self, interrupted: Interrupted, next_phase: Phase | None = Phase.CLAIMING
    ) -> None:
        """A pause interrupt holds the run (Paused(Manual)); any other goes on up."""
        if interrupted.kind != Interrupt.PAUSE:
            raise interrupted
        await self.manual(next_phase)

    async def manual(self, next_phase: Phase | None = Phase.CLAIMING) -> None:
        """Paused(Manual) until `resume`, or Failed after timeouts.pausedSeconds; then `next_phase` (None: the
        caller goes back to the pause it was in). The claim is held through it."""
        self.resume_requested = False
        message = self.message or "paused by request"
        self.mirror.move(
            Phase.PAUSED, pause_reason=PauseReason.MANUAL, reason=PauseReason.MANUAL, message=message
        )
        await self.held.renew_for(later(self.paused_seconds))
        await self._wait_signal(
            lambda: self.resume_requested, RunSignal.RESUME, frozenset({Interrupt.CANCEL})
        )
        self.resume_requested = False
        if next_phase is not None:
            self.mirror.move(next_phase, reason="Resumed", message="resumed by request")

    async def for_input(self, task: TaskPause) -> str:
        self.pending_input = None
        await self._until(
            lambda: self.pending_input is not None,
            PauseReason.INPUT_REQUIRED,
            task.message or "the agent needs input",
            RunSignal.INPUT,
        )
        text, self.pending_input = self.pending_input or "", None
        return text

    async def for_credential(self, task: TaskPause, refreshes_before_call: int, model: str) -> None:
        """Paused(CredentialExpired) until the credential rotates. A rotation that arrived while the refused
        call was still under way counts: the run goes on at once instead of waiting for another."""
        await self._until(
            lambda: self.credential_refreshes > refreshes_before_call,
            PauseReason.CREDENTIAL_EXPIRED,
            task.message or f"credential of {model} was refused",
            RunSignal.CREDENTIAL_REFRESHED,
        )

    async def _until(
        self, arrived: Callable[[], bool], reason: PauseReason, message: str, signal: RunSignal
    ) -> None:
        """Paused(`reason`) until `arrived`. A manual pause meanwhile holds the run; after `resume` it waits
        again, unless what it waited for came meanwhile."""
        while not arrived():
            self.mirror.move(Phase.PAUSED, pause_reason=reason, reason=reason, message=message)
            try:
                await self._wait_signal(arrived, signal, CANCEL_OR_PAUSE)
            except Interrupted as interrupted:
                await self.hold_or_raise(interrupted, next_phase=None)

    async def _wait_signal(
        self, arrived: Callable[[], bool], signal: RunSignal, kinds: frozenset[Interrupt]
    ) -> None:
        limit = self.paused_seconds
        wait = workflow.wait_condition(arrived, timeout=limit, timeout_summary=f"wait for {signal}")
        try:
            await self.interrupts.interruptible(wait, kinds)
        except TimeoutError as err:
            raise RunFailed(
                f"{self.mirror.status.pause_reason}Timeout",
                f"no `{signal}` signal within timeouts.pausedSeconds ({limit}s)",
            ) from err
