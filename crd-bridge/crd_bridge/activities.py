"""The bridge's activities, on task queue `ksquad-bridge`: they are the only code that touches ksquad.io
objects on behalf of a workflow.

- `resolve_references`: the Run's references, read from the API server in the Run's namespace.
- `mirror_status`: the workflow's status onto the Run's status subresource. Writes are guarded twice: a
  snapshot with a revision at or below the stored one is dropped (a late or retried write never rolls the
  status back), and the write carries the resourceVersion it read (a concurrent writer makes it retry).
  Each phase change becomes an Event.
"""

import logging
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from crd_bridge.events import RUN_API, EventRecorder
from crd_bridge.resolve import ANYTHING, KINDS, AllowLists, resolve
from crd_bridge.resources import PLURALS
from kube import ApiError, Kube, Unreachable, path
from workflows.activity_types import Activity, ResolveRequest
from workflows.contract import Resolution
from workflows.status import StatusSnapshot

log = logging.getLogger(__name__)


def run_path(namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    return path(RUN_API, "runs", namespace, name, subresource)


def status_body(snapshot: StatusSnapshot) -> dict[str, Any]:
    """The status as the CRD stores it (camelCase; None clears a field under a merge patch)."""
    body: dict[str, Any] = snapshot.status.model_dump(mode="json", by_alias=True)
    return body


@dataclass(frozen=True)
class SeenRun:
    """What a status write needs of a Run: which Run it is, its version, and the revision its status has."""

    uid: str
    resource_version: str
    revision: int


class BridgeActivities:
    def __init__(
        self, kube: Kube, instance: str, namespace_limit: int | None = None, allow: AllowLists = ANYTHING
    ) -> None:
        self.kube = kube
        self.events = EventRecorder(kube, instance)
        self.namespace_limit = namespace_limit
        self.allow = allow
        # The newest version of each Run this replica has seen (the leader's watch, and its own writes): a status
        # write starts from it instead of reading the Run. A stale entry costs a conflict, then a read.
        self.seen: dict[tuple[str, str], SeenRun] = {}

    def saw(self, run: dict[str, Any], deleted: bool = False) -> None:
        key = (run["metadata"]["namespace"], run["metadata"]["name"])
        if deleted:
            self.seen.pop(key, None)
        else:
            self.seen[key] = _seen(run)

    @activity.defn(name=Activity.RESOLVE_REFERENCES)
    async def resolve_references(self, req: ResolveRequest) -> Resolution:
        namespace = req.run.namespace

        async def lookup(kind: str, name: str) -> dict[str, Any] | None:
            if kind == "Secret":  # its labels only, by a metadata-only list: never its data
                found = await self.kube.list(
                    path("v1", "secrets", namespace), fields=f"metadata.name={name}", metadata_only=True
                )
                items = found.get("items") or []
                return {"labels": items[0]["metadata"].get("labels") or {}} if items else None
            assert kind in KINDS
            try:
                obj = await self.kube.get(path(RUN_API, PLURALS[kind], namespace, name))
            except ApiError as err:
                if err.status == 404:
                    return None
                raise ApplicationError(
                    f"reading {kind} {namespace}/{name}: {err}", type="KubernetesError"
                ) from None
            spec: dict[str, Any] = obj.get("spec") or {}
            return spec

        try:
            return await resolve(namespace, req.spec, lookup, self.namespace_limit, self.allow)
        except Unreachable as err:
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None

    @activity.defn(name=Activity.MIRROR_STATUS)
    async def mirror_status(self, snapshot: StatusSnapshot) -> None:
        try:
            written = await self.write_status(snapshot)
        except Unreachable as err:  # retried by Temporal; the run goes on meanwhile
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None
        if written:
            for event in snapshot.events:
                await self.events.record(snapshot.namespace, snapshot.name, snapshot.uid, event)

    async def write_status(self, snapshot: StatusSnapshot) -> bool:
        """Write the snapshot unless the Run has a newer one, or is gone, or is another Run of that name."""
        url = run_path(snapshot.namespace, snapshot.name)
        for attempt in range(10):
            seen = self.seen.get((snapshot.namespace, snapshot.name)) if attempt == 0 else None
            if seen is None or seen.uid != snapshot.uid:
                try:
                    seen = _seen(await self.kube.get(url))
                except ApiError as err:
                    if err.status == 404:
                        return False  # deleted: nothing to show the status on
                    raise
                if seen.uid != snapshot.uid:
                    return False
            if snapshot.status.revision <= seen.revision:
                log.debug(
                    "%s/%s: dropped r%d (have r%d)",
                    snapshot.namespace,
                    snapshot.name,
                    snapshot.status.revision,
                    seen.revision,
                )
                return False
            body = {"metadata": {"resourceVersion": seen.resource_version}, "status": status_body(snapshot)}
            try:
                self.saw(await self.kube.patch(run_path(snapshot.namespace, snapshot.name, "status"), body))
                return True
            except ApiError as err:
                if err.status == 409:
                    continue  # someone wrote meanwhile: read again
                if err.status == 404:
                    return False
                raise ApplicationError(
                    f"writing status of {snapshot.namespace}/{snapshot.name}: {err}", type="KubernetesError"
                ) from None
        raise ApplicationError(
            f"status of {snapshot.namespace}/{snapshot.name}: too many conflicts", type="Conflict"
        )

    def all(self) -> list[Any]:
        return [self.resolve_references, self.mirror_status]


def _seen(run: dict[str, Any]) -> SeenRun:
    meta = run["metadata"]
    return SeenRun(meta["uid"], meta["resourceVersion"], int((run.get("status") or {}).get("revision") or 0))
