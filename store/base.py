"""What every record of the store shares: the engine (PostgreSQL, or SQLite embedded), its migrations and
transactions, and the fenced insert each record's writes on behalf of a run go through."""

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Self, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from store import migrations
from store.connection import async_url, unavailable, utcnow
from store.records import Holder, StaleFence
from store.schema import claims, run_fences, run_sequences

MIGRATION_LOCK = 0x6B737164  # "ksqd": the advisory lock key of schema migrations
CONNECT_TIMEOUT_SECONDS = 10
STATEMENT_TIMEOUT_MS = 30_000

T = TypeVar("T")


class StoreBase:
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
    async def open(cls, url: str, migrate: bool = True, **kwargs: Any) -> Self:
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


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
