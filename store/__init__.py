"""The coordination store: claims on work items with fencing tokens, and the fenced writes of runs.

Rules (DESIGN.md "Work items and claims"):
- claiming bumps the fence atomically and succeeds only when the item is free, its lease expired, or it is
  already ours: at most one holder at any time;
- every write on behalf of a run carries its fence and is rejected (StaleFence) once the fence has moved on;
  the check and the write are one statement, and the check takes a share lock on the claim, so a fence bump
  waits for writes in flight and every write that starts after it is refused;
- runs without a work item fence their writes by attempt (`begin_attempt`).

PostgreSQL in production, SQLite as the embedded default; the same code and migrations serve both.
"""

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from store import migrations
from store.connection import as_utc, async_url, sync_url, unavailable, utcnow
from store.records import (
    ClaimResult,
    Event,
    HistoryEntry,
    Holder,
    PhaseRecord,
    StaleFence,
    StoreError,
    StoreUnavailable,
    WorkItemHeld,
)
from store.schema import (
    artifacts,
    claim_history,
    claims,
    credential_limits,
    credential_subscribers,
    run_events,
    run_fences,
    run_sequences,
)

MIGRATION_LOCK = 0x6B737164  # "ksqd": the advisory lock key of schema migrations

__all__ = [
    "ClaimResult",
    "Event",
    "HistoryEntry",
    "Holder",
    "PhaseRecord",
    "StaleFence",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "WorkItemHeld",
    "async_url",
    "sync_url",
    "utcnow",
]

T = TypeVar("T")


CONNECT_TIMEOUT_SECONDS = 10
STATEMENT_TIMEOUT_MS = 30_000


class Store:
    def __init__(self, url: str, clock: Callable[[], datetime] = utcnow, pool_size: int = 10) -> None:
        self.url = async_url(url)
        self.clock = clock
        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if self.url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 30}
        else:
            # Bounded: a database that stops answering fails the call (StoreUnavailable, retried by Temporal)
            # instead of holding an activity until its timeout; no statement of ours runs for seconds.
            kwargs.update(
                pool_size=pool_size,
                max_overflow=pool_size,
                pool_timeout=CONNECT_TIMEOUT_SECONDS,
                connect_args={
                    "connect_timeout": CONNECT_TIMEOUT_SECONDS,
                    "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                },
            )
        self.engine: AsyncEngine = create_async_engine(self.url, **kwargs)
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            sa.event.listen(self.engine.sync_engine, "connect", _sqlite_pragmas)

    @classmethod
    async def open(cls, url: str, migrate: bool = True, **kwargs: Any) -> "Store":
        store = cls(url, **kwargs)
        if migrate:
            await store.migrate()
        return store

    async def close(self) -> None:
        await self.engine.dispose()

    async def ping(self) -> bool:
        """Whether the database answers now (the worker's readiness)."""
        try:
            async with self.engine.connect() as conn:
                await conn.execute(sa.text("SELECT 1"))
        except (exc.SQLAlchemyError, OSError, ConnectionError):
            return False
        return True

    @unavailable
    async def migrate(self) -> None:
        """Bring the schema to the newest revision (a no-op when it is there already). On PostgreSQL the
        migration holds an advisory lock: workers and bridges starting together migrate one after another."""
        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            await conn.run_sync(migrations.upgrade)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            yield conn

    async def _in(self, conn: AsyncConnection | None, work: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        if conn is not None:
            return await work(conn)
        async with self.engine.begin() as own:
            return await work(own)

    def _insert(self, table: sa.Table) -> Any:
        return (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)

    # --- claims -------------------------------------------------------------------------------------------

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

    # --- fenced writes ------------------------------------------------------------------------------------

    def _fence_holds(self, holder: Holder, fence: int, work_item_ref: str | None) -> sa.Exists:
        """True while `fence` is current. FOR SHARE: a fence bump waits for this write, or this write for it."""
        if work_item_ref is not None:
            guard = sa.select(sa.literal(1)).where(
                claims.c.work_item_ref == work_item_ref,
                claims.c.holder_uid == holder.uid,
                claims.c.fence == fence,
            )
        else:
            guard = sa.select(sa.literal(1)).where(
                run_fences.c.run_uid == holder.uid, run_fences.c.fence == fence
            )
        if self.dialect == "postgresql":
            guard = guard.with_for_update(read=True)
        return sa.exists(guard)

    async def _fenced_insert(
        self,
        c: AsyncConnection,
        table: sa.Table,
        values: dict[str, Any],
        holder: Holder,
        fence: int,
        work_item_ref: str | None,
        replace_on: list[str] | None = None,
    ) -> Any:
        """Insert the row only while `fence` is current. With `replace_on`, a row with the same key is
        replaced (a later attempt's artifact supersedes the earlier one's)."""
        columns = list(values)
        select = sa.select(
            *[
                sa.literal(v, type_=table.c[k].type).label(k)
                if not isinstance(v, sa.ColumnElement)
                else v.label(k)
                for k, v in values.items()
            ]
        )
        select = select.where(self._fence_holds(holder, fence, work_item_ref))
        statement = self._insert(table).from_select(columns, select)
        if replace_on:
            statement = statement.on_conflict_do_update(
                index_elements=replace_on,
                set_={k: statement.excluded[k] for k in columns if k not in replace_on},
            )
        row = (await c.execute(statement.returning(table.c.id))).first()
        if row is None:
            where = work_item_ref or f"attempt fence of {holder.run}"
            raise StaleFence(f"{where}: fence {fence} is no longer current; write refused")
        return row

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

    async def next_seq(self, c: AsyncConnection, run_uid: str) -> int:
        """The run's next event number. Taking it locks the run's sequence row: writers of one run take turns.
        A refused write rolls back, number included, so sequences stay dense."""
        upsert = self._insert(run_sequences).values(run_uid=run_uid, last_seq=1)
        seq = (
            await c.execute(
                upsert.on_conflict_do_update(
                    index_elements=["run_uid"], set_={"last_seq": run_sequences.c.last_seq + 1}
                ).returning(run_sequences.c.last_seq)
            )
        ).scalar_one()
        return int(seq)

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

    # --- credential limits --------------------------------------------------------------------------------

    @unavailable
    async def record_credential_limit(self, credential: str, until: datetime) -> None:
        """One more limit on `credential` (a 429): limited until the latest `until` reported, a strike more."""
        now = self.clock()
        row = credential_limits.c
        upsert = self._insert(credential_limits).values(
            credential=credential, until=until, strikes=1, updated_at=now
        )
        async with self.engine.begin() as c:
            await c.execute(
                upsert.on_conflict_do_update(
                    index_elements=["credential"],
                    set_={
                        "until": sa.case((row.until < until, until), else_=row.until),
                        "strikes": row.strikes + 1,
                        "updated_at": now,
                    },
                )
            )

    @unavailable
    async def credential_limit(self, credential: str) -> tuple[datetime, int] | None:
        """(until, strikes) of the latest limit on `credential`, or None: never limited."""
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(credential_limits.c.until, credential_limits.c.strikes).where(
                        credential_limits.c.credential == credential
                    )
                )
            ).first()
        return (as_utc(row.until), int(row.strikes)) if row else None

    @unavailable
    async def clear_credential_strikes(self, credential: str) -> None:
        """A call on `credential` succeeded: its strikes start over, unless it is limited again meanwhile."""
        now = self.clock()
        async with self.engine.begin() as c:
            await c.execute(
                sa.update(credential_limits)
                .where(credential_limits.c.credential == credential, credential_limits.c.until <= now)
                .values(strikes=0, updated_at=now)
            )

    # --- credential subscribers ---------------------------------------------------------------------------

    @unavailable
    async def subscribe_to_credential(self, credential: str, workflow_id: str) -> None:
        """The run `workflow_id` is told of limits on `credential` from now on (again: nothing changes)."""
        row = self._insert(credential_subscribers).values(
            credential=credential, workflow_id=workflow_id, subscribed_at=self.clock()
        )
        async with self.engine.begin() as c:
            await c.execute(row.on_conflict_do_nothing(index_elements=["credential", "workflow_id"]))

    @unavailable
    async def unsubscribe_from_credential(self, credential: str, workflow_ids: Sequence[str]) -> int:
        """Forget these runs' subscriptions to `credential`; returns how many there were."""
        if not workflow_ids:
            return 0
        row = credential_subscribers.c
        async with self.engine.begin() as c:
            deleted = await c.execute(
                sa.delete(credential_subscribers).where(
                    row.credential == credential, row.workflow_id.in_(list(workflow_ids))
                )
            )
        return int(deleted.rowcount or 0)

    @unavailable
    async def credential_subscribers(
        self, credential: str, *, after: str = "", limit: int = 1000
    ) -> list[str]:
        """The workflow ids subscribed to `credential`, in order, the first `limit` past `after`."""
        row = credential_subscribers.c
        async with self.engine.connect() as c:
            result = await c.execute(
                sa.select(row.workflow_id)
                .where(row.credential == credential, row.workflow_id > after)
                .order_by(row.workflow_id)
                .limit(limit)
            )
            return [r.workflow_id for r in result]

    @unavailable
    async def next_in_line(self, name: str) -> int:
        """1, 2, 3... for each call with the same `name` (at most 128 characters), across every process: a
        named counter kept in run_sequences beside the runs' event numbers."""
        async with self.engine.begin() as c:
            return await self.next_seq(c, name)

    @unavailable
    async def put_artifact(
        self,
        holder: Holder,
        fence: int,
        name: str,
        *,
        uri: str | None = None,
        media_type: str | None = None,
        content: bytes | None = None,
        work_item_ref: str | None = None,
    ) -> int:
        async with self.engine.begin() as c:
            row = await self._fenced_insert(
                c,
                artifacts,
                {
                    "run_uid": holder.uid,
                    "run": holder.run,
                    "work_item_ref": work_item_ref,
                    "fence": fence,
                    "name": name,
                    "uri": uri,
                    "media_type": media_type,
                    "size": len(content) if content is not None else None,
                    "content": content,
                    "triggered_by": holder.triggered_by,
                    "at": self.clock(),
                },
                holder,
                fence,
                work_item_ref,
                replace_on=["run_uid", "name"],
            )
            return int(row.id)

    # --- reads --------------------------------------------------------------------------------------------

    @unavailable
    async def events(self, run_uid: str, after: int = 0, limit: int = 500) -> list[Event]:
        """The run's events after sequence number `after`, in order (resume a stream from its last seq)."""
        async with self.engine.connect() as c:
            rows = await c.execute(
                sa.select(run_events)
                .where(run_events.c.run_uid == run_uid, run_events.c.seq > after)
                .order_by(run_events.c.seq)
                .limit(limit)
            )
            return [
                Event(
                    seq=r.seq,
                    kind=r.kind,
                    message=r.message,
                    data=r.data,
                    fence=r.fence,
                    attempt=r.attempt,
                    triggered_by=r.triggered_by,
                    at=as_utc(r.at),
                )
                for r in rows
            ]

    @unavailable
    async def artifact(self, run_uid: str, name: str) -> tuple[str | None, bytes] | None:
        """An artifact's media type and content, or None when the run has no artifact of that name."""
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(artifacts.c.media_type, artifacts.c.content).where(
                        artifacts.c.run_uid == run_uid, artifacts.c.name == name
                    )
                )
            ).first()
            return (row.media_type, bytes(row.content or b"")) if row else None

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


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
