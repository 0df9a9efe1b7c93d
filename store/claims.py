"""Claims on work items: at most one holder at a time, each claim with a lease and a fence that goes up on every
take-over, fence and release, and the history of who held what. Runs without a work item are fenced by attempt."""

from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from store.base import StoreBase
from store.connection import as_utc, unavailable
from store.records import ClaimResult, HistoryEntry, Holder, StaleFence, WorkItemHeld
from store.schema import claim_history, claims, run_fences


class Claims(StoreBase):
    @unavailable
    async def claim(
        self, work_item_ref: str, holder: Holder, lease_seconds: float, conn: AsyncConnection | None = None
    ) -> ClaimResult:
        """Take the item if it is free, expired, or already ours; the fence goes up either way."""

        async def work(c: AsyncConnection) -> ClaimResult:
            now = self.clock()
            until = now + timedelta(seconds=lease_seconds)
            # One statement: insert a new claim, or take the existing row when it is free, expired or ours.
            upsert = self._insert(claims).values(
                work_item_ref=work_item_ref,
                holder_uid=holder.uid,
                holder_run=holder.run,
                fence=1,
                lease_expires_at=until,
                triggered_by=holder.triggered_by,
                updated_at=now,
            )
            row = (
                await c.execute(
                    upsert.on_conflict_do_update(
                        index_elements=["work_item_ref"],
                        set_={
                            "previous_holder_uid": claims.c.holder_uid,
                            "holder_uid": holder.uid,
                            "holder_run": holder.run,
                            "fence": claims.c.fence + 1,
                            "lease_expires_at": until,
                            "triggered_by": holder.triggered_by,
                            "updated_at": now,
                        },
                        where=sa.or_(
                            claims.c.holder_uid.is_(None),
                            claims.c.holder_uid == holder.uid,
                            claims.c.lease_expires_at < now,
                        ),
                    ).returning(claims.c.fence, claims.c.previous_holder_uid)
                )
            ).first()
            if row is None:
                current = (
                    await c.execute(sa.select(claims).where(claims.c.work_item_ref == work_item_ref))
                ).first()
                raise WorkItemHeld(
                    work_item_ref,
                    current.holder_run if current else None,
                    as_utc(current.lease_expires_at) if current and current.lease_expires_at else None,
                )
            took_over = row.previous_holder_uid if row.previous_holder_uid not in (None, holder.uid) else None
            await self._history(
                c,
                work_item_ref,
                "took-over" if took_over else "claimed",
                holder,
                row.fence,
                now,
                previous=row.previous_holder_uid,
            )
            return ClaimResult(fence=row.fence, lease_expires_at=until, took_over_from=took_over)

        return await self._in(conn, work)

    async def _guarded_update(
        self, c: AsyncConnection, work_item_ref: str, holder: Holder, fence: int, values: dict[str, Any]
    ) -> Any:
        row = (
            await c.execute(
                sa.update(claims)
                .where(
                    claims.c.work_item_ref == work_item_ref,
                    claims.c.holder_uid == holder.uid,
                    claims.c.fence == fence,
                )
                .values(**values)
                .returning(claims.c.fence, claims.c.lease_expires_at)
            )
        ).first()
        if row is None:
            raise StaleFence(f"{work_item_ref}: fence {fence} of {holder.run} is no longer current")
        return row

    @unavailable
    async def renew(self, work_item_ref: str, holder: Holder, fence: int, lease_seconds: float) -> datetime:
        """Extend the lease of a claim we hold with `fence` (heartbeats call this)."""
        async with self.engine.begin() as c:
            now = self.clock()
            until = now + timedelta(seconds=lease_seconds)
            await self._guarded_update(
                c, work_item_ref, holder, fence, {"lease_expires_at": until, "updated_at": now}
            )
            return until

    @unavailable
    async def fence_bump(
        self, work_item_ref: str, holder: Holder, fence: int, conn: AsyncConnection | None = None
    ) -> int:
        """The fence step of fence-then-release: from now on every write with `fence` is refused."""

        async def work(c: AsyncConnection) -> int:
            now = self.clock()
            row = await self._guarded_update(
                c, work_item_ref, holder, fence, {"fence": claims.c.fence + 1, "updated_at": now}
            )
            await self._history(c, work_item_ref, "fenced", holder, row.fence, now)
            return int(row.fence)

        return await self._in(conn, work)

    @unavailable
    async def release(self, work_item_ref: str, holder: Holder, fence: int) -> None:
        """Give the item up; refused (StaleFence) when `fence` is not the current fence of this holder."""
        async with self.engine.begin() as c:
            now = self.clock()
            await self._guarded_update(
                c,
                work_item_ref,
                holder,
                fence,
                {
                    "holder_uid": None,
                    "holder_run": None,
                    "lease_expires_at": None,
                    "previous_holder_uid": holder.uid,
                    "updated_at": now,
                },
            )
            await self._history(c, work_item_ref, "released", holder, fence, now)

    async def _history(
        self,
        c: AsyncConnection,
        ref: str,
        action: str,
        holder: Holder,
        fence: int,
        now: datetime,
        previous: str | None = None,
    ) -> None:
        await c.execute(
            sa.insert(claim_history).values(
                work_item_ref=ref,
                action=action,
                holder_uid=holder.uid,
                holder_run=holder.run,
                fence=fence,
                previous_holder_uid=previous,
                triggered_by=holder.triggered_by,
                at=now,
            )
        )

    @unavailable
    async def begin_attempt(self, holder: Holder, attempt: int) -> None:
        """A run without a work item starts attempt `attempt`: writes of earlier attempts are refused."""
        async with self.engine.begin() as c:
            now = self.clock()
            stmt = self._insert(run_fences).values(
                run_uid=holder.uid, run=holder.run, fence=attempt, updated_at=now
            )
            await c.execute(
                stmt.on_conflict_do_update(
                    index_elements=["run_uid"],
                    set_={"fence": stmt.excluded.fence, "updated_at": stmt.excluded.updated_at},
                    where=run_fences.c.fence < stmt.excluded.fence,
                )
            )

    @unavailable
    async def claim_history(self, work_item_ref: str) -> list[HistoryEntry]:
        async with self.engine.connect() as c:
            rows = await c.execute(
                sa.select(claim_history)
                .where(claim_history.c.work_item_ref == work_item_ref)
                .order_by(claim_history.c.id)
            )
            return [
                HistoryEntry(
                    action=r.action,
                    holder_uid=r.holder_uid,
                    holder_run=r.holder_run,
                    fence=r.fence,
                    previous_holder_uid=r.previous_holder_uid,
                    triggered_by=r.triggered_by,
                    at=as_utc(r.at),
                )
                for r in rows
            ]

    @unavailable
    async def claim_of(self, work_item_ref: str) -> tuple[Holder, int] | None:
        """The item's holder now (its Run, uid and triggering user) and the fence, or None: nobody holds it."""
        async with self.engine.connect() as c:
            row = (await c.execute(sa.select(claims).where(claims.c.work_item_ref == work_item_ref))).first()
        if row is None or row.holder_uid is None:
            return None
        return Holder(uid=row.holder_uid, run=row.holder_run, triggered_by=row.triggered_by), int(row.fence)

    @unavailable
    async def holder_of(self, work_item_ref: str) -> tuple[str | None, int]:
        """(holder uid or None, current fence)."""
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(claims.c.holder_uid, claims.c.fence).where(
                        claims.c.work_item_ref == work_item_ref
                    )
                )
            ).first()
            return (row.holder_uid, int(row.fence)) if row else (None, 0)
