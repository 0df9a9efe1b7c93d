"""The embedded default's object store: the ksquad.io objects applied with `ksquad run -f`, kept in the
coordination store's database the way the API server keeps them in etcd (no cluster needed).

- `apply` creates an object or updates its spec (the generation goes up when the spec changes);
- a Run's status is written by the embedded bridge only when it belongs to the same Run (uid) and is newer
  (revision) than the stored one, in one statement; its phase changes are appended to the run's event log
  in the same transaction, so `ksquad runs watch` sees phases and agent progress in one ordered stream.
"""

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa

from store import Store
from store.connection import as_utc, unavailable
from store.records import PhaseRecord
from store.schema import objects

API_VERSION = "ksquad.io/v1alpha1"
Applied = Literal["created", "configured", "unchanged"]


@dataclass(frozen=True)
class StoredObject:
    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    spec: dict[str, Any]
    status: dict[str, Any] | None
    created_at: datetime

    def manifest(self) -> dict[str, Any]:
        """The object as the API server would return it."""
        obj: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "generation": self.generation,
                "creationTimestamp": self.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "spec": self.spec,
        }
        if self.status is not None:
            obj["status"] = self.status
        return obj


def _stored(row: Any) -> StoredObject:
    return StoredObject(
        row.kind,
        row.namespace,
        row.name,
        row.uid,
        int(row.generation),
        row.spec,
        row.status,
        as_utc(row.created_at),
    )


class ObjectStore:
    def __init__(self, store: Store) -> None:
        self.store = store

    @unavailable
    async def apply(
        self, kind: str, namespace: str, name: str, spec: dict[str, Any]
    ) -> tuple[StoredObject, Applied]:
        async with self.store.transaction() as c:
            key = (objects.c.kind == kind) & (objects.c.namespace == namespace) & (objects.c.name == name)
            row = (await c.execute(sa.select(objects).where(key))).first()
            now = self.store.clock()
            if row is None:
                values = {
                    "kind": kind,
                    "namespace": namespace,
                    "name": name,
                    "uid": str(uuid.uuid4()),
                    "generation": 1,
                    "spec": spec,
                    "created_at": now,
                    "updated_at": now,
                }
                await c.execute(sa.insert(objects).values(**values))
                action: Applied = "created"
            elif row.spec == spec:
                return _stored(row), "unchanged"
            else:
                await c.execute(
                    sa.update(objects)
                    .where(key)
                    .values(spec=spec, generation=objects.c.generation + 1, updated_at=now)
                )
                action = "configured"
            stored = (await c.execute(sa.select(objects).where(key))).one()
            return _stored(stored), action

    @unavailable
    async def get(self, kind: str, namespace: str, name: str) -> StoredObject | None:
        async with self.store.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(objects).where(
                        objects.c.kind == kind, objects.c.namespace == namespace, objects.c.name == name
                    )
                )
            ).first()
            return _stored(row) if row else None

    @unavailable
    async def of_kind(self, kind: str, namespace: str | None = None) -> list[StoredObject]:
        query = sa.select(objects).where(objects.c.kind == kind)
        if namespace is not None:
            query = query.where(objects.c.namespace == namespace)
        async with self.store.engine.connect() as c:
            rows = await c.execute(query.order_by(objects.c.namespace, objects.c.created_at, objects.c.name))
            return [_stored(r) for r in rows]

    @unavailable
    async def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        query = sa.delete(objects).where(
            objects.c.kind == kind, objects.c.namespace == namespace, objects.c.name == name
        )
        if uid is not None:
            query = query.where(objects.c.uid == uid)
        async with self.store.transaction() as c:
            return bool((await c.execute(query)).rowcount)

    @unavailable
    async def record_run_chain(self, namespace: str, name: str, uid: str, chain: str) -> str | None:
        """Record which execution of the Run's workflow is its own (`status.workflow.firstRunId`), unless one is
        recorded already, and show the Run Pending when it has no phase yet (as the bridge acknowledges a Run it
        started on a cluster: the workflow's first status comes with its next change); returns the execution
        recorded (None: no such Run)."""
        key = (objects.c.kind == "Run") & (objects.c.namespace == namespace) & (objects.c.name == name)
        while True:
            async with self.store.transaction() as c:
                row = (await c.execute(sa.select(objects).where(key, objects.c.uid == uid))).first()
                if row is None:
                    return None
                status = dict(row.status or {})
                workflow = dict(status.get("workflow") or {})
                if workflow.get("firstRunId"):
                    return str(workflow["firstRunId"])
                status["workflow"] = {**workflow, "id": f"{namespace}/{name}", "firstRunId": chain}
                if not status.get("phase"):
                    status.update(phase="Pending", reason="WorkflowStarted", message="workflow started")
                # Only over the status just read: a status written meanwhile (every write raises the revision) is
                # never replaced by this older one; read again, and record on top of it.
                written = await c.execute(
                    sa.update(objects)
                    .where(key, objects.c.uid == uid, objects.c.revision == row.revision)
                    .values(status=status)
                )
                if written.rowcount:
                    return chain

    @unavailable
    async def write_run_status(
        self,
        namespace: str,
        name: str,
        uid: str,
        revision: int,
        status: dict[str, Any],
        events: list[PhaseRecord],
        chain: str | None = None,
    ) -> bool:
        """Store the status unless the Run has a newer one or is another Run (or gone), or (with `chain`) records
        another execution of its workflow as its own; then append its phase `events` to the run's log. True when
        written."""
        recorded = objects.c.status["workflow"]["firstRunId"].as_string()
        own_execution = [sa.or_(recorded.is_(None), recorded == chain)] if chain is not None else []
        async with self.store.transaction() as c:
            written = await c.execute(
                sa.update(objects)
                .where(
                    objects.c.kind == "Run",
                    objects.c.namespace == namespace,
                    objects.c.name == name,
                    objects.c.uid == uid,
                    objects.c.revision < revision,
                    *own_execution,
                )
                .values(status=status, revision=revision, updated_at=self.store.clock())
            )
            if not written.rowcount:
                return False
            await self.store.insert_phase_events(c, uid, f"{namespace}/{name}", events)
            return True
