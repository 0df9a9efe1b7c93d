"""Work items, the coordination record: an item (an id unique in its namespace, a title, a body, a state, labels)
and its entries in order (created, comments, state changes, artifacts, and each Run's ending as the orchestrator\nrecords it), each saying who wrote it.

People write as themselves. An agent writes for a Run's attempt under the fence of the Run's claim on the item:
the check and the write are one statement (`_fenced_insert`), so a holder fenced off or taken over writes nothing.
Every write takes the item's row first (its `last_seq`): writers of one item take turns and entries stay dense.
"""

import re
from typing import Any

import sqlalchemy as sa

from store.base import StoreBase
from store.connection import as_utc, unavailable
from store.events import read_after_cursors
from store.records import (
    ITEM_STATES,
    ITEM_TRANSITIONS,
    Author,
    Holder,
    InvalidItemWrite,
    ItemEvent,
    ItemExists,
    ItemNotFound,
    StaleFence,
    WorkItem,
    work_item_key,
)
from store.schema import work_item_events, work_items

MAX_ID = 253  # a Run's workItemRef names an item by its id
# An id is one path segment of the APIs' URLs: no slash, no space (a Run's longer or freer refs stay opaque keys).
ITEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:#@+-]*")
MAX_TITLE = 512
MAX_TEXT = 64 * 1024  # an item's body, a comment
MAX_LABELS, MAX_LABEL = 32, 63
MAX_PAGE = 500
ORCHESTRATOR = "system:ksquad"  # the author of the entries ksquad itself writes (a Run's ending)
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class WorkItems(StoreBase):
    @unavailable
    async def create_item(
        self,
        namespace: str,
        item_id: str,
        *,
        title: str,
        created_by: str,
        body: str = "",
        labels: tuple[str, ...] = (),
    ) -> WorkItem:
        """A new item, open, its first entry `created`. ItemExists when the namespace has one of that id."""
        check_text("id", item_id, MAX_ID, single_line=True, required=True)
        if not ITEM_ID.fullmatch(item_id):
            raise InvalidItemWrite(
                "id", f"{item_id!r}: letters, digits and . _ : # @ + - only, a letter or digit first"
            )
        check_text("title", title, MAX_TITLE, single_line=True, required=True)
        check_text("body", body, MAX_TEXT)
        check_labels(labels)
        now = self.clock()
        async with self.engine.begin() as c:
            exists = sa.select(work_items.c.item_id).where(
                work_items.c.namespace == namespace, work_items.c.item_id == item_id
            )
            if (await c.execute(exists)).first() is not None:
                raise ItemExists(f"work item {item_id} exists in namespace {namespace}")
            await c.execute(
                sa.insert(work_items).values(
                    namespace=namespace,
                    item_id=item_id,
                    title=title,
                    body=body,
                    state="open",
                    labels=sorted(set(labels)),
                    created_by=created_by,
                    created_at=now,
                    updated_at=now,
                    last_seq=1,
                )
            )
            await c.execute(
                sa.insert(work_item_events).values(
                    work_item_ref=work_item_key(namespace, item_id),
                    seq=1,
                    kind="created",
                    body=title,
                    data={"state": "open"},
                    author=created_by,
                    at=now,
                )
            )
        return await self.item(namespace, item_id)

    @unavailable
    async def item(self, namespace: str, item_id: str) -> WorkItem:
        """The item; ItemNotFound when the namespace has none of that id."""
        found = await self.find_item(namespace, item_id)
        if found is None:
            raise ItemNotFound(f"no work item {item_id} in namespace {namespace}")
        return found

    @unavailable
    async def find_item(self, namespace: str, item_id: str) -> WorkItem | None:
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(work_items).where(
                        work_items.c.namespace == namespace, work_items.c.item_id == item_id
                    )
                )
            ).first()
        return _item(row) if row else None

    @unavailable
    async def items(
        self, namespace: str, *, state: str | None = None, after: str = "", limit: int = 100
    ) -> list[WorkItem]:
        """The namespace's items by id, the first `limit` past `after` (a page), of one state if given."""
        query = sa.select(work_items).where(work_items.c.namespace == namespace, work_items.c.item_id > after)
        if state is not None:
            query = query.where(work_items.c.state == state)
        async with self.engine.connect() as c:
            rows = await c.execute(query.order_by(work_items.c.item_id).limit(max(1, min(limit, MAX_PAGE))))
            return [_item(r) for r in rows]

    async def comment(
        self,
        namespace: str,
        item_id: str,
        body: str,
        author: Author,
        holder: Holder | None = None,
        fence: int | None = None,
    ) -> ItemEvent:
        """A comment on the item: a person's (no holder), or an agent's under its Run's fence."""
        check_text("body", body, MAX_TEXT, required=True)
        return await self._write(namespace, item_id, "comment", body, None, author, holder, fence)

    async def set_item_state(
        self,
        namespace: str,
        item_id: str,
        state: str,
        author: Author,
        holder: Holder | None = None,
        fence: int | None = None,
        note: str = "",
    ) -> ItemEvent:
        """Move the item to `state` if its present state allows it (ITEM_TRANSITIONS), with an optional note."""
        if state not in ITEM_STATES:
            raise InvalidItemWrite("state", f"{state!r} is not one of {', '.join(ITEM_STATES)}")
        check_text("note", note, MAX_TEXT)
        return await self._write(namespace, item_id, "state", note, {"state": state}, author, holder, fence)

    async def add_item_artifact(
        self,
        namespace: str,
        item_id: str,
        artifact: dict[str, Any],
        author: Author,
        holder: Holder,
        fence: int,
    ) -> ItemEvent:
        """An artifact a Run's attempt published for the item (its name, media type, size, where to read it)."""
        return await self._write(namespace, item_id, "artifact", "", artifact, author, holder, fence)

    @unavailable
    async def record_ending(
        self, namespace: str, item_id: str, run: Holder, attempt: int, phase: str, reason: str, message: str
    ) -> ItemEvent | None:
        """The orchestrator's entry that the Run ended (`ended`: its phase, reason and message), once per Run (by
        uid): None when it is there already or the item does not exist. Written unfenced: the claim is released by
        then, and the entry is the orchestrator's, not an attempt's."""
        key = work_item_key(namespace, item_id)
        async with self.engine.connect() as c:
            there = (
                await c.execute(
                    sa.select(work_item_events.c.seq).where(
                        work_item_events.c.work_item_ref == key,
                        work_item_events.c.kind == "ended",
                        work_item_events.c.run_uid == run.uid,
                    )
                )
            ).first()
        if there is not None:
            return None
        author = Author(user=ORCHESTRATOR, run=run.run, run_uid=run.uid, attempt=attempt or None)
        data = {"phase": phase, "reason": reason, "triggeredBy": run.triggered_by}
        try:
            return await self._write(
                namespace, item_id, "ended", message[:MAX_TEXT], data, author, None, None
            )
        except ItemNotFound:
            return None

    @unavailable
    async def _write(
        self,
        namespace: str,
        item_id: str,
        kind: str,
        body: str,
        data: dict[str, Any] | None,
        author: Author,
        holder: Holder | None,
        fence: int | None,
    ) -> ItemEvent:
        key = work_item_key(namespace, item_id)
        async with self.engine.begin() as c:
            # Take the item's row (and its next number) first: one writer of the item at a time.
            row = (
                await c.execute(
                    sa.update(work_items)
                    .where(work_items.c.namespace == namespace, work_items.c.item_id == item_id)
                    .values(last_seq=work_items.c.last_seq + 1, updated_at=self.clock())
                    .returning(work_items.c.last_seq, work_items.c.state)
                )
            ).first()
            if row is None:
                raise ItemNotFound(f"no work item {item_id} in namespace {namespace}")
            if kind == "state":
                wanted = (data or {})["state"]
                if wanted not in ITEM_TRANSITIONS[row.state]:
                    raise InvalidItemWrite(
                        "state",
                        f"{item_id} is {row.state}: it can go to {', '.join(sorted(ITEM_TRANSITIONS[row.state]))}",
                    )
            values = {
                "work_item_ref": key,
                "seq": row.last_seq,
                "kind": kind,
                "body": body,
                "data": data,
                "author": author.user,
                "run": author.run,
                "run_uid": author.run_uid,
                "attempt": author.attempt,
                "fence": fence,
                "at": self.clock(),
            }
            if holder is None:
                await c.execute(sa.insert(work_item_events).values(**values))
            elif fence is None:
                raise StaleFence(f"{key}: an agent writes under its claim's fence")
            else:
                await self._fenced_insert(c, work_item_events, values, holder, fence, key)
            if kind == "state":
                await c.execute(
                    sa.update(work_items)
                    .where(work_items.c.namespace == namespace, work_items.c.item_id == item_id)
                    .values(state=(data or {})["state"])
                )
            return ItemEvent(
                seq=int(row.last_seq),
                kind=kind,
                body=body,
                data=data,
                author=author,
                fence=fence,
                at=values["at"],
            )

    @unavailable
    async def item_events(
        self,
        namespace: str,
        item_id: str,
        after: int = 0,
        limit: int = 500,
        before: int | None = None,
        newest: bool = False,
    ) -> list[ItemEvent]:
        """The item's entries after `after` (and before `before`), in order: the first `limit` of them, or with
        `newest` the last (what a reader wants first; a stream resumes from its last seq). At most MAX_PAGE."""
        seq = work_item_events.c.seq
        where = [work_item_events.c.work_item_ref == work_item_key(namespace, item_id), seq > after]
        if before is not None:
            where.append(seq < before)
        async with self.engine.connect() as c:
            rows = list(
                await c.execute(
                    sa.select(work_item_events)
                    .where(*where)
                    .order_by(seq.desc() if newest else seq)
                    .limit(max(1, min(limit, MAX_PAGE)))
                )
            )
            if newest:
                rows.reverse()
            return [_entry(r) for r in rows]

    @unavailable
    async def entries_of_items(
        self, cursors: dict[str, int], limit: int = 2000
    ) -> list[tuple[str, ItemEvent]]:
        """(item key, entry) for each item's entries after its cursor (keys: work_item_key), by item then in
        order, at most `limit`: one query for every item stream a process has open (api.streams.Feed)."""
        return await read_after_cursors(self.engine, work_item_events.c.work_item_ref, cursors, limit, _entry)


def _entry(r: Any) -> ItemEvent:
    return ItemEvent(
        seq=int(r.seq),
        kind=r.kind,
        body=r.body,
        data=r.data,
        author=Author(user=r.author, run=r.run, run_uid=r.run_uid, attempt=r.attempt),
        fence=r.fence,
        at=as_utc(r.at),
    )


def check_text(field: str, value: str, limit: int, single_line: bool = False, required: bool = False) -> None:
    if required and not value.strip():
        raise InvalidItemWrite(field, "must not be empty")
    if len(value) > limit:
        raise InvalidItemWrite(field, f"{len(value)} characters, more than the {limit} allowed")
    if single_line and CONTROL.search(value):
        raise InvalidItemWrite(field, "must be one line without control characters")


def check_labels(labels: tuple[str, ...]) -> None:
    if len(labels) > MAX_LABELS:
        raise InvalidItemWrite("labels", f"{len(labels)} labels, more than the {MAX_LABELS} allowed")
    for label in labels:
        check_text("labels", label, MAX_LABEL, single_line=True, required=True)


def _item(row: Any) -> WorkItem:
    return WorkItem(
        namespace=row.namespace,
        item_id=row.item_id,
        title=row.title,
        body=row.body,
        state=row.state,
        labels=tuple(row.labels or ()),
        created_by=row.created_by,
        created_at=as_utc(row.created_at),
        updated_at=as_utc(row.updated_at),
        last_seq=int(row.last_seq),
    )
