"""The ramp after a credential's limit, in a fair order: when a limit ends, the runs it paused call again
`1 / resumePerSecond` apart, and the order is weighted fair queueing across tenants (a Run's Team), not pause
order, so a Team that queued a thousand runs on a shared credential does not hold back one that queued ten.

Each run in a ramp has a virtual finish: its tenant's previous one (or the ramp's virtual clock, the latest
finish released, for a tenant that had none waiting) plus 1/weight. A run's turn is the ramp's opening plus
(runs ahead of it by finish) / resumePerSecond, recomputed when it wakes: a tenant that arrives later with a
smaller finish moves it back. On equal finishes the later arrival goes first, which only ever happens between
Teams: so a Team's k-th run waits behind at most k-1 runs of each Team of the same weight, whoever queued first.
A released run's place never moves (every newcomer's finish is past the clock, and the order is fixed by finish
and arrival), so at most one run is released per slot, whoever arrives when: the ramp's rate holds."""

from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from store.base import StoreBase
from store.connection import unavailable
from store.schema import resume_ramps, run_sequences

# Ramps whose limit ended this long ago are deleted when a new ramp starts: no run waits that long in one.
RAMP_KEPT = timedelta(days=1)
MAX_WEIGHT = 100.0


class ResumeRamps(StoreBase):
    @unavailable
    async def take_turn(
        self, ramp: str, opens: datetime, per_second: float, run_id: str, tenant: str, weight: float
    ) -> datetime | None:
        """The instant `run_id` may call again after the limit ramp `ramp` (opening at `opens`), or None: now
        (and it is released). The first call enters the run, with its tenant and weight (1 to MAX_WEIGHT); a
        repeated call (the run woke, or an activity retried) finds it where it is."""
        weight = min(max(weight, 1.0), MAX_WEIGHT)
        now = self.clock()
        t = resume_ramps.c
        async with self.engine.begin() as c:
            # Taking the ramp's sequence number locks it: its runs enter and take turns one at a time.
            seq = await self.next_seq(c, f"ramp:{ramp}")
            mine = (
                await c.execute(
                    sa.select(t.finish, t.seq, t.released).where(t.ramp == ramp, t.run_id == run_id)
                )
            ).first()
            if mine is None:
                if seq == 1:
                    await self._forget_ramps(c, now - RAMP_KEPT)
                clock = (
                    await c.execute(sa.select(sa.func.max(t.finish)).where(t.ramp == ramp, t.released))
                ).scalar()
                last = (
                    await c.execute(
                        sa.select(sa.func.max(t.finish)).where(t.ramp == ramp, t.tenant == tenant)
                    )
                ).scalar()
                finish = max(clock or 0.0, last or 0.0) + 1.0 / weight
                await c.execute(
                    resume_ramps.insert().values(
                        ramp=ramp,
                        run_id=run_id,
                        tenant=tenant,
                        finish=finish,
                        seq=seq,
                        released=False,
                        opens=opens,
                    )
                )
                released = False
            else:
                finish, seq, released = mine.finish, mine.seq, mine.released
            if released:
                return None
            ahead = (
                await c.execute(
                    sa.select(sa.func.count()).where(
                        t.ramp == ramp, sa.or_(t.finish < finish, sa.and_(t.finish == finish, t.seq > seq))
                    )
                )
            ).scalar_one()
            turn = opens + timedelta(seconds=ahead / per_second)
            if turn > now:
                return turn
            await c.execute(
                resume_ramps.update().where(t.ramp == ramp, t.run_id == run_id).values(released=True)
            )
            return None

    async def _forget_ramps(self, c: AsyncConnection, before: datetime) -> None:
        t = resume_ramps.c
        stale = sa.select(t.ramp).where(t.opens < before).distinct()
        names = [f"ramp:{r}" for r in (await c.execute(stale)).scalars()]
        if names:
            await c.execute(run_sequences.delete().where(run_sequences.c.run_uid.in_(names)))
            await c.execute(resume_ramps.delete().where(t.opens < before))
