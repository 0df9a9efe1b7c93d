"""An agent's durable progress: each attempt's completed steps (a model turn, a tool call begun, its result), written
by its agent through ksquad-api under the attempt's fence, read back by a retry's agent so that it goes on after
the last step instead of asking the model again (agent.journal, api.attempts).

A write is fenced like every write on behalf of a run (the claim's fence, or the attempt's for a Run without a
work item): an attempt fenced off writes nothing, and its agent learns so before its next model call. The Run's
steps are bounded (MAX_STEP_BYTES each, MAX_RUN_BYTES in all) and deleted when the Run ends (`forget_checkpoints`).
"""

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from store.base import StoreBase
from store.connection import as_utc, unavailable
from store.records import Holder, StaleFence, StoreError
from store.schema import agent_checkpoints

STEP_KINDS = ("turn", "tool-started", "tool")
MAX_STEP_BYTES = 256 * 1024  # a model turn or a tool's result, in clear
MAX_RUN_BYTES = 8 * 1024 * 1024  # every step of every attempt of a Run
MAX_STEPS_A_WRITE = 64


class CheckpointRefused(StoreError):
    """Steps the record will not take (too large, past the Run's bound, an unknown kind); nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Step:
    """One step as the agent recorded it: `payload` is opaque to the store (sealed by the API); `size` its clear
    length."""

    step: int
    kind: str
    payload: bytes
    size: int
    attempt: int = 0
    at: datetime | None = None


class Checkpoints(StoreBase):
    @unavailable
    async def add_checkpoints(
        self, holder: Holder, attempt: int, fence: int, work_item_ref: str | None, steps: list[Step]
    ) -> None:
        """Record `steps` for the attempt, all or none, while `fence` is current (StaleFence otherwise: an empty
        list only asks that). `work_item_ref` is the claim's key (store.work_item_key), None for a Run fenced by
        attempt."""
        if len(steps) > MAX_STEPS_A_WRITE:
            raise CheckpointRefused(
                "steps", f"{len(steps)} steps in one write, more than {MAX_STEPS_A_WRITE}"
            )
        for step in steps:
            if step.kind not in STEP_KINDS:
                raise CheckpointRefused("kind", f"{step.kind!r} is not one of {', '.join(STEP_KINDS)}")
            if step.size > MAX_STEP_BYTES:
                raise CheckpointRefused(
                    "data", f"{step.size} bytes, more than the {MAX_STEP_BYTES} a step may hold"
                )
        if not steps:
            if not await self.fence_is_current(holder, fence, work_item_ref):
                raise StaleFence(
                    f"{work_item_ref or holder.run}: fence {fence} is no longer current; nothing may act"
                )
            return
        async with self.engine.begin() as c:
            used = (
                await c.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(agent_checkpoints.c.size), 0)).where(
                        agent_checkpoints.c.run_uid == holder.uid
                    )
                )
            ).scalar_one()
            adding = sum(s.size for s in steps)
            if int(used) + adding > MAX_RUN_BYTES:
                raise CheckpointRefused(
                    "data",
                    f"{holder.run} has recorded {used} bytes of steps; {adding} more pass the Run's {MAX_RUN_BYTES}",
                )
            now = self.clock()
            for step in steps:
                values = {
                    "run_uid": holder.uid,
                    "run": holder.run,
                    "attempt": attempt,
                    "fence": fence,
                    "step": step.step,
                    "kind": step.kind,
                    "payload": step.payload,
                    "size": step.size,
                    "at": now,
                }
                await self._fenced_insert(c, agent_checkpoints, values, holder, fence, work_item_ref)

    @unavailable
    async def checkpoints(self, run_uid: str) -> list[Step]:
        """The Run's steps, every attempt's, in the order they were recorded."""
        async with self.engine.connect() as c:
            rows = await c.execute(
                sa.select(agent_checkpoints)
                .where(agent_checkpoints.c.run_uid == run_uid)
                .order_by(agent_checkpoints.c.id)
            )
            return [
                Step(
                    step=int(r.step),
                    kind=r.kind,
                    payload=bytes(r.payload),
                    size=int(r.size),
                    attempt=int(r.attempt),
                    at=as_utc(r.at),
                )
                for r in rows
            ]

    @unavailable
    async def fence_is_current(self, holder: Holder, fence: int, work_item_ref: str | None) -> bool:
        async with self.engine.connect() as c:
            return bool(
                (await c.execute(sa.select(self._fence_holds(holder, fence, work_item_ref)))).scalar()
            )

    @unavailable
    async def forget_checkpoints(self, run_uid: str) -> int:
        """Delete the Run's steps (it ended: no attempt will resume from them); how many there were."""
        async with self.engine.begin() as c:
            result = await c.execute(
                sa.delete(agent_checkpoints).where(agent_checkpoints.c.run_uid == run_uid)
            )
            return int(result.rowcount or 0)
