"""Squad memory: what a Team or a Project keeps across Runs (facts, decisions, links), as rows of the store.

Agents read it at the start of a Run and write to it under their attempt's fence (a superseded attempt writes
nothing); people read, add, edit and delete entries as themselves (ksquad-api asks Kubernetes RBAC: `teams/memory`
or `projects/memory` in group ksquad.io). Every entry says who wrote it: a person, or a Run's attempt for the person
who started the Run. A scope holds at most MAX_ENTRIES; text is searched as written (case-insensitive).
"""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from store.base import StoreBase
from store.connection import as_utc, unavailable
from store.records import Author, Holder, StoreError
from store.schema import squad_memory

MEMORY_SCOPES = ("teams", "projects")
MEMORY_KINDS = ("fact", "decision", "link")
MAX_MEMORY_TEXT = 4000
MAX_MEMORY_ENTRIES = 1000  # a Team's or a Project's
MAX_MEMORY_PAGE = 1000


class MemoryRefused(StoreError):
    """A memory write the record will not take (`field` names why); nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class MemoryNotFound(StoreError):
    """No such entry in that memory."""


@dataclass(frozen=True)
class MemoryEntry:
    id: int
    namespace: str
    scope: str
    name: str
    kind: str
    text: str
    author: Author
    fence: int | None
    edited_by: str | None
    created_at: datetime
    updated_at: datetime


def check_entry(kind: str, text: str) -> None:
    if kind not in MEMORY_KINDS:
        raise MemoryRefused("kind", f"{kind!r} is not one of {', '.join(MEMORY_KINDS)}")
    if not text.strip():
        raise MemoryRefused("text", "must not be empty")
    if len(text) > MAX_MEMORY_TEXT:
        raise MemoryRefused(
            "text", f"{len(text)} characters, more than the {MAX_MEMORY_TEXT} an entry may hold"
        )


class SquadMemory(StoreBase):
    @unavailable
    async def remember(
        self,
        namespace: str,
        scope: str,
        name: str,
        kind: str,
        text: str,
        author: Author,
        holder: Holder | None = None,
        fence: int | None = None,
        work_item_ref: str | None = None,
    ) -> MemoryEntry:
        """A new entry: a person's (no holder), or an agent's while its attempt's `fence` is current (the claim of
        `work_item_ref`, or the attempt of a Run without one; StaleFence otherwise)."""
        check_entry(kind, text)
        where = self._scope(namespace, scope, name)
        now = self.clock()
        async with self.engine.begin() as c:
            count = (await c.execute(sa.select(sa.func.count()).where(*where))).scalar_one()
            if count >= MAX_MEMORY_ENTRIES:
                raise MemoryRefused(
                    "entries",
                    f"{scope}/{name} holds {count} entries, its most: delete some before adding more",
                )
            values: dict[str, Any] = {
                "namespace": namespace,
                "scope": scope,
                "name": name,
                "kind": kind,
                "text": text,
                "author": author.user,
                "run": author.run,
                "run_uid": author.run_uid,
                "attempt": author.attempt,
                "fence": fence,
                "created_at": now,
                "updated_at": now,
            }
            if holder is None:
                row = (
                    await c.execute(sa.insert(squad_memory).values(**values).returning(squad_memory.c.id))
                ).first()
            else:
                assert fence is not None, "an agent writes under its attempt's fence"
                row = await self._fenced_insert(c, squad_memory, values, holder, fence, work_item_ref)
            assert row is not None
            entry_id = int(row.id)
        return await self.memory_entry(namespace, scope, name, entry_id)

    @unavailable
    async def memory(
        self, namespace: str, scope: str, name: str, query: str = "", before: int = 0, limit: int = 100
    ) -> list[MemoryEntry]:
        """The memory's entries, newest first, those whose text holds `query` (any case), a page of `limit` before
        the entry `before` (0: from the newest)."""
        where = self._scope(namespace, scope, name)
        if query:
            where.append(sa.func.lower(squad_memory.c.text).contains(query.lower(), autoescape=True))
        if before:
            where.append(squad_memory.c.id < before)
        async with self.engine.connect() as c:
            rows = await c.execute(
                sa.select(squad_memory)
                .where(*where)
                .order_by(squad_memory.c.id.desc())
                .limit(max(1, min(limit, MAX_MEMORY_PAGE)))
            )
            return [_entry(r) for r in rows]

    @unavailable
    async def memory_entry(self, namespace: str, scope: str, name: str, entry_id: int) -> MemoryEntry:
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(squad_memory).where(
                        *self._scope(namespace, scope, name), squad_memory.c.id == entry_id
                    )
                )
            ).first()
        if row is None:
            raise MemoryNotFound(f"{scope}/{name} in namespace {namespace} has no entry {entry_id}")
        return _entry(row)

    @unavailable
    async def edit_memory(
        self, namespace: str, scope: str, name: str, entry_id: int, kind: str, text: str, editor: str
    ) -> MemoryEntry:
        """A person's edit of an entry (its author stays; `edited_by` says who changed it)."""
        check_entry(kind, text)
        async with self.engine.begin() as c:
            changed = await c.execute(
                sa.update(squad_memory)
                .where(*self._scope(namespace, scope, name), squad_memory.c.id == entry_id)
                .values(kind=kind, text=text, edited_by=editor, updated_at=self.clock())
            )
        if not changed.rowcount:
            raise MemoryNotFound(f"{scope}/{name} in namespace {namespace} has no entry {entry_id}")
        return await self.memory_entry(namespace, scope, name, entry_id)

    @unavailable
    async def forget_memory_entry(self, namespace: str, scope: str, name: str, entry_id: int) -> None:
        async with self.engine.begin() as c:
            deleted = await c.execute(
                sa.delete(squad_memory).where(
                    *self._scope(namespace, scope, name), squad_memory.c.id == entry_id
                )
            )
        if not deleted.rowcount:
            raise MemoryNotFound(f"{scope}/{name} in namespace {namespace} has no entry {entry_id}")

    @staticmethod
    def _scope(namespace: str, scope: str, name: str) -> list[Any]:
        if scope not in MEMORY_SCOPES:
            raise MemoryRefused("scope", f"{scope!r} is not one of {', '.join(MEMORY_SCOPES)}")
        return [
            squad_memory.c.namespace == namespace,
            squad_memory.c.scope == scope,
            squad_memory.c.name == name,
        ]


def _entry(r: Any) -> MemoryEntry:
    return MemoryEntry(
        id=int(r.id),
        namespace=r.namespace,
        scope=r.scope,
        name=r.name,
        kind=r.kind,
        text=r.text,
        author=Author(user=r.author, run=r.run, run_uid=r.run_uid, attempt=r.attempt),
        fence=r.fence,
        edited_by=r.edited_by,
        created_at=as_utc(r.created_at),
        updated_at=as_utc(r.updated_at),
    )
