"""Admission: a slot of every concurrency scope (namespace, Team, Project) a run counts against, each from its
gate workflow. The gate answers by signal: granted, or queued at a position."""

from temporalio import workflow

from workflows.contract import ConcurrencyScope, FairShare
from workflows.entity_types import SlotNotice, SlotRelease, SlotRequest, gate_workflow_id
from workflows.run.interrupts import CANCEL_OR_PAUSE, Interrupted, Interrupts
from workflows.run.mirror import StatusMirror
from workflows.run.options import WarrantOf, entity_signal, later
from workflows.run.outcomes import RunFailed
from workflows.status import ConditionType, Phase


class Gates:
    def __init__(
        self,
        slots: list[str],
        asks: dict[str, int],
        run_id: str,
        queued_seconds: int,
        mirror: StatusMirror,
        interrupts: Interrupts,
        warrant: WarrantOf,
    ) -> None:
        self.warrant = warrant
        self.slots = slots  # scopes whose slot the run holds (carried over continue-as-new)
        self.asks = asks  # scope -> how many times the run asked its gate (SlotRequest.asked; carried too)
        self.queued: dict[str, int] = {}  # scope -> position, while waiting for its slot
        self.run_id = run_id
        self.queued_seconds = queued_seconds
        self.mirror = mirror
        self.interrupts = interrupts

    def granted(self, notice: SlotNotice) -> None:
        if notice.scope not in self.slots:
            self.slots.append(notice.scope)
        self.queued.pop(notice.scope, None)

    def queued_at(self, notice: SlotNotice) -> None:
        if notice.scope not in self.slots:
            self.queued[notice.scope] = notice.position

    async def request(self, scope: ConcurrencyScope, share: FairShare) -> None:
        """Ask the scope's gate for a slot and wait for it (Queued while others hold them all; the slots go round
        the Teams that wait, by `share`). A cancel or a pause withdraws the request and raises Interrupted: after
        a pause the run asks again, at the back of its Team."""
        self.asks[scope.key] = self.asks.get(scope.key, 0) + 1
        request = SlotRequest(
            run_id=self.run_id, limit=scope.limit, asked=self.asks[scope.key], **share.model_dump()
        )
        await entity_signal(
            self.warrant(), "ConcurrencyGate", gate_workflow_id(scope.key), "acquire", request
        )
        deadline = later(self.queued_seconds)
        # A request after a withdrawal (resumed while Queued) shows its new place once, though the run is Queued
        # already ("resumed by request"). A first request shows the first place it is told while not yet Queued,
        # as it always did: histories of runs started before must replay as they ran.
        asked_again, shown = self.asks[scope.key] > 1, False

        def to_show() -> bool:
            return scope.key in self.queued and (
                self.mirror.status.phase != Phase.QUEUED or (asked_again and not shown)
            )

        def granted_or_queued() -> bool:
            return scope.key in self.slots or to_show()

        while scope.key not in self.slots:
            if to_show():
                self.mirror.condition(ConditionType.ADMITTED, False, "Queued", scope.key)
                position = self.queued[scope.key]
                message = f"{scope.key} is full ({scope.limit}); position {position}"
                self.mirror.move(Phase.QUEUED, reason="ConcurrencyLimit", message=message)
                shown = True
            remaining = (deadline - workflow.now()).total_seconds()
            if remaining <= 0:
                await self.withdraw(scope.key)
                raise RunFailed("QueueTimeout", f"no slot of {scope.key} within timeouts.queuedSeconds")
            wait = workflow.wait_condition(
                granted_or_queued, timeout=remaining, timeout_summary=f"wait for a slot of {scope.key}"
            )
            try:
                await self.interrupts.interruptible(wait, CANCEL_OR_PAUSE)
            except TimeoutError:
                continue
            except Interrupted:
                await self.withdraw(scope.key)
                raise
        self.mirror.condition(ConditionType.ADMITTED, True, "SlotsHeld", ", ".join(self.slots))

    async def withdraw(self, scope: str) -> None:
        self.queued.pop(scope, None)
        release = SlotRelease(run_id=self.run_id, asked=self.asks.get(scope, 1))
        await entity_signal(self.warrant(), "ConcurrencyGate", gate_workflow_id(scope), "release", release)
        if scope in self.slots:
            self.slots.remove(scope)

    async def withdraw_queued(self) -> None:
        for scope in list(self.queued):
            await self.withdraw(scope)

    async def release_all(self) -> None:
        for scope in list(self.slots):
            await self.withdraw(scope)
