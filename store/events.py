"""Each run's ordered event log (the agent's progress, fenced, and the bridge's phase changes), numbered densely
per run: the cursor of every run's event stream. The same numbering serves named counters (next_in_line)."""

from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from store.base import StoreBase
from store.connection import as_utc, unavailable
from store.records import Event, Holder, PhaseRecord
from store.schema import run_events, run_sequences

R = TypeVar("R")


class RunEvents(StoreBase):
    @unavailable
    async def append_event(
        self,
        holder: Holder,
        fence: int,
        attempt: int,
        kind: str,
        message: str = "",
        data: Any = None,
        work_item_ref: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> int:
        """Append to the run's ordered event log; returns its sequence number (the streaming cursor)."""

        async def work(c: AsyncConnection) -> int:
            seq = await self.next_seq(c, holder.uid)
            await self._fenced_insert(
                c,
                run_events,
                {
                    "run_uid": holder.uid,
                    "run": holder.run,
                    "seq": seq,
                    "work_item_ref": work_item_ref,
                    "fence": fence,
                    "attempt": attempt,
                    "kind": kind,
                    "message": message,
                    "data": data,
                    "triggered_by": holder.triggered_by,
                    "at": self.clock(),
                },
                holder,
                fence,
                work_item_ref,
            )
            return int(seq)

        return await self._in(conn, work)

    @unavailable
    async def append_phase_events(self, run_uid: str, run: str, events: list[PhaseRecord]) -> int:
        """Append the phase changes of a run's status to its log (the stream that carries the agent's progress
        too), each revision once: a snapshot sent again, or by another bridge replica, adds nothing. Returns how
        many were new."""
        async with self.transaction() as c:
            # Hold the run's sequence row first: two writers of one run take turns from here on.
            hold = self._insert(run_sequences).values(run_uid=run_uid, last_seq=0)
            await c.execute(
                hold.on_conflict_do_update(
                    index_elements=["run_uid"], set_={"last_seq": run_sequences.c.last_seq}
                )
            )
            recorded = (
                await c.execute(
                    sa.select(sa.func.max(run_events.c.revision)).where(run_events.c.run_uid == run_uid)
                )
            ).scalar_one()
            fresh = [e for e in sorted(events, key=lambda e: e.revision) if e.revision > (recorded or 0)]
            await self.insert_phase_events(c, run_uid, run, fresh)
            return len(fresh)

    async def insert_phase_events(
        self, c: AsyncConnection, run_uid: str, run: str, events: list[PhaseRecord]
    ) -> None:
        """Phase changes into the run's log, numbered after what is there (unfenced: status, not work): one
        sequence bump and one insert for them all."""
        if not events:
            return
        bump = self._insert(run_sequences).values(run_uid=run_uid, last_seq=len(events))
        last = (
            await c.execute(
                bump.on_conflict_do_update(
                    index_elements=["run_uid"], set_={"last_seq": run_sequences.c.last_seq + len(events)}
                ).returning(run_sequences.c.last_seq)
            )
        ).scalar_one()
        first, now = int(last) - len(events) + 1, self.clock()
        await c.execute(
            sa.insert(run_events),
            [
                {
                    "run_uid": run_uid,
                    "run": run,
                    "seq": first + i,
                    "fence": 0,
                    "attempt": event.attempt,
                    "kind": "phase",
                    "message": event.message,
                    "data": event.data,
                    "revision": event.revision,
                    "at": now,
                }
                for i, event in enumerate(events)
            ],
        )

    @unavailable
    async def append_notice(self, run_uid: str, run: str, kind: str, message: str, data: Any = None) -> int:
        """A notice of ksquad's own into the run's log (unfenced: a copy of the Run refused, say); its number."""
        async with self.transaction() as c:
            bump = self._insert(run_sequences).values(run_uid=run_uid, last_seq=1)
            seq = (
                await c.execute(
                    bump.on_conflict_do_update(
                        index_elements=["run_uid"], set_={"last_seq": run_sequences.c.last_seq + 1}
                    ).returning(run_sequences.c.last_seq)
                )
            ).scalar_one()
            row = {"run_uid": run_uid, "run": run, "seq": seq, "fence": 0, "attempt": 0, "kind": kind}
            await c.execute(
                sa.insert(run_events), [{**row, "message": message, "data": data, "at": self.clock()}]
            )
            return int(seq)

    @unavailable
    async def events(
        self, run_uid: str, after: int = 0, limit: int = 500, kind: str | None = None, newest: bool = False
    ) -> list[Event]:
        """The run's events after sequence number `after`, in order (resume a stream from its last seq): the
        first `limit` of them, or the last `limit` when `newest`; of one `kind` when it is given."""
        where = [run_events.c.run_uid == run_uid, run_events.c.seq > after]
        if kind is not None:
            where.append(run_events.c.kind == kind)
        order = run_events.c.seq.desc() if newest else run_events.c.seq
        async with self.engine.connect() as c:
            rows = list(await c.execute(sa.select(run_events).where(*where).order_by(order).limit(limit)))
            if newest:
                rows.reverse()
            return [_event(r) for r in rows]

    @unavailable
    async def events_of_runs(self, cursors: dict[str, int], limit: int = 2000) -> list[tuple[str, Event]]:
        """(run uid, event) for each run's events after its cursor, by run then in order, at most `limit`: one
        query for every stream a process has open (api.streams.Feed), not one each."""
        return await read_after_cursors(self.engine, run_events.c.run_uid, cursors, limit, _event)

    @unavailable
    async def triggered_by_of(self, run_uid: str) -> str | None:
        """Who started the Run, as its agent's progress events record it (None before its first)."""
        async with self.engine.connect() as c:
            return (
                await c.execute(
                    sa.select(run_events.c.triggered_by)
                    .where(run_events.c.run_uid == run_uid, run_events.c.triggered_by.is_not(None))
                    .limit(1)
                )
            ).scalar()

    @unavailable
    async def next_in_line(self, name: str) -> int:
        """1, 2, 3... for each call with the same `name` (at most 128 characters), across every process: a
        named counter kept in run_sequences beside the runs' event numbers."""
        async with self.engine.begin() as c:
            return await self.next_seq(c, name)


async def read_after_cursors(
    engine: AsyncEngine, key: sa.Column[Any], cursors: dict[str, int], limit: int, record: Callable[[Any], R]
) -> list[tuple[str, R]]:
    """(key, record) of the rows of `key`'s table after each key's cursor (its `seq`), by key then seq, at most
    `limit`. Read in parts of 100 keys: an OR of more terms would pass SQLite's expression depth (1,000)."""
    table, pairs = key.table, sorted(cursors.items())
    found: list[tuple[str, R]] = []
    async with engine.connect() as c:
        for i in range(0, len(pairs), 100):
            after = sa.or_(*(sa.and_(key == k, table.c.seq > v) for k, v in pairs[i : i + 100]))
            query = sa.select(table).where(after).order_by(key, table.c.seq).limit(limit - len(found))
            found += [(getattr(r, key.name), record(r)) for r in await c.execute(query)]
            if len(found) >= limit:
                break
    return found


def _event(r: Any) -> Event:
    return Event(
        seq=r.seq,
        kind=r.kind,
        message=r.message,
        data=r.data,
        fence=r.fence,
        attempt=r.attempt,
        triggered_by=r.triggered_by,
        at=as_utc(r.at),
    )
