"""A Run's status, as the bridge writes it: the one place that does, for the workflow's snapshots (the
`mirror_status` activity), the reconciler's own decisions (taken, refused, ended while the API was away) and the
record of which execution of the Run's workflow the bridge started (crd_bridge.envelopes).

Every write is guarded twice: a snapshot whose revision is at or below the stored one is dropped (a late or retried
write never rolls the status back), and the write carries the resourceVersion it read (a concurrent writer makes it
read again). The newest version of each Run this replica has seen (the leader's watch, and its own writes) is kept,
so that a write starts from it instead of reading the Run; a stale entry costs a conflict, then a read. Each phase
change becomes an Event and, with a store, an entry of the run's event log (the cluster API's event streams), once
per revision.
"""

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from temporalio.exceptions import ApplicationError

from crd_bridge.envelopes import Execution, check_chain
from crd_bridge.events import RUN_API, EventRecorder, phase_records
from crd_bridge.metrics import APPLY_TO_STATUS_SECONDS, MIRROR_LAG_SECONDS, RUNS_BY_PHASE, STATUS_WRITES
from kube import ApiError, Kube, Unreachable, path
from store import Store, StoreError
from workflows.model import InvalidObject
from workflows.status import Phase, PhaseEvent, RunStatus, StatusSnapshot, WorkflowRef

log = logging.getLogger(__name__)


def run_path(namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    return path(RUN_API, "runs", namespace, name, subresource)


def status_body(snapshot: StatusSnapshot) -> dict[str, Any]:
    """The status as the CRD stores it (camelCase; None clears a field under a merge patch)."""
    body: dict[str, Any] = snapshot.status.model_dump(mode="json", by_alias=True)
    return body


def recorded_chain(status: dict[str, Any] | None) -> str | None:
    """The execution of the Run's workflow the bridge started (crd_bridge.envelopes), if recorded yet, from the
    Run's status (as the API server or the embedded store keeps it)."""
    chain = ((status or {}).get("workflow") or {}).get("firstRunId")
    return str(chain) if chain else None


@dataclass(frozen=True)
class SeenRun:
    """What a status write needs of a Run: which Run it is, its version, the revision its status has, and the
    execution of its workflow the bridge started (crd_bridge.envelopes)."""

    uid: str
    resource_version: str
    revision: int
    phase: str | None = None
    chain: str | None = None


class RunStatusWriter:
    def __init__(self, kube: Kube, instance: str, store: Store | None = None) -> None:
        self.kube = kube
        # Where phase changes are logged for the event streams of the cluster API (None: Events only).
        self.store = store
        self.events = EventRecorder(kube, instance)
        self.seen: dict[tuple[str, str], SeenRun] = {}
        self.watching = False  # the leader's watch feeds `seen` with every Run
        self.arrived: dict[str, float] = {}  # uid -> when a Run without status was first seen
        RUNS_BY_PHASE.phases = self._phases

    def _phases(self) -> list[str] | None:
        return [s.phase or "" for s in self.seen.values()] if self.watching else None

    def saw(self, run: dict[str, Any], deleted: bool = False) -> None:
        """The newest version of a Run, from the watch or a write's answer."""
        key = (run["metadata"]["namespace"], run["metadata"]["name"])
        if deleted:
            gone = self.seen.pop(key, None)
            if gone is not None:
                self.arrived.pop(gone.uid, None)
            return
        seen = self.seen[key] = _seen(run)
        if seen.phase is None:
            self.arrived.setdefault(seen.uid, time.monotonic())
        elif (since := self.arrived.pop(seen.uid, None)) is not None:
            APPLY_TO_STATUS_SECONDS.observe(time.monotonic() - since)

    # --- the workflow's snapshots -------------------------------------------------------------------------

    async def mirror(self, snapshot: StatusSnapshot, chain: str | None = None) -> None:
        """Write the snapshot and its events; with `chain`, only onto a Run whose workflow is that execution (or
        has none recorded yet: then it is recorded)."""
        try:
            written = await self.write(snapshot, chain)
        except Unreachable as err:  # retried by Temporal; the run goes on meanwhile
            STATUS_WRITES.labels("failed").inc()
            raise ApplicationError(str(err), type="KubernetesUnreachable") from None
        except ApplicationError:
            STATUS_WRITES.labels("failed").inc()
            raise
        if written:
            changed = snapshot.status.last_transition_time
            if changed is not None:
                MIRROR_LAG_SECONDS.observe(max(0.0, (datetime.now(UTC) - changed).total_seconds()))
            for event in snapshot.events:
                await self.events.record(snapshot.namespace, snapshot.name, snapshot.uid, event)
        if self.store is not None and snapshot.events:
            try:
                await self.store.append_phase_events(
                    snapshot.uid, f"{snapshot.namespace}/{snapshot.name}", phase_records(snapshot)
                )
            except StoreError as err:  # the mirror sends these events again with its next status
                raise ApplicationError(str(err), type="StoreUnavailable") from None

    async def write(self, snapshot: StatusSnapshot, chain: str | None = None) -> bool:
        """Write the snapshot unless the Run has a newer one, or is gone, or is another Run of that name. With
        `chain`, the Run's recorded execution must be that one (raises Copied)."""
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
            if chain is not None:
                check_chain(f"{snapshot.namespace}/{snapshot.name}", seen.chain, chain, Execution.current())
            if snapshot.status.revision <= seen.revision:
                STATUS_WRITES.labels("stale").inc()
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
                STATUS_WRITES.labels("written").inc()
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

    # --- the bridge's own -----------------------------------------------------------------------------------

    async def record_execution(self, run: dict[str, Any], workflow_id: str, chain: str) -> bool:
        """Record on a Run with none yet which execution of its workflow the bridge started, over the version
        read: False if the Run changed meanwhile (read it again)."""
        meta = run["metadata"]
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": {"workflow": {"id": workflow_id, "firstRunId": chain}},
        }
        try:
            self.saw(await self.kube.patch(run_path(meta["namespace"], meta["name"], "status"), body))
            return True
        except ApiError as err:
            if err.status != 409:
                raise ApplicationError(
                    f"recording {meta['namespace']}/{meta['name']}'s execution: {err}", type="KubernetesError"
                ) from None
            return False

    async def taken(self, run: dict[str, Any], workflow: WorkflowRef) -> None:
        """Show at once that the Run was taken: Pending, with its workflow, at revision 0, so that the workflow's
        own first status (revision 1) replaces it. Written only over the version just seen without a status;
        if anything changed meanwhile, the workflow's status is on its way and this one is not needed."""
        meta = run["metadata"]
        status = RunStatus(
            phase=Phase.PENDING,
            reason="WorkflowStarted",
            message=f"workflow {workflow.id} started",
            workflow=workflow,
            observed_generation=meta.get("generation"),
        )
        snapshot = StatusSnapshot(
            namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], status=status
        )
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status_body(snapshot)}
        try:
            self.saw(await self.kube.patch(run_path(meta["namespace"], meta["name"], "status"), body))
        except ApiError as err:
            if err.status not in (404, 409):
                log.warning("acknowledging %s/%s: %s", meta["namespace"], meta["name"], err)

    async def refused(self, run: dict[str, Any], err: InvalidObject) -> None:
        """A spec the API server let through but the workflow cannot take: Failed at once, with the fields."""
        meta = run["metadata"]
        status = RunStatus(
            phase=Phase.FAILED,
            reason="InvalidSpec",
            message=str(err),
            revision=1,
            observed_generation=meta.get("generation"),
        )
        await self.write(
            StatusSnapshot(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"], status=status)
        )

    async def ended(self, run: dict[str, Any], status: RunStatus) -> None:
        """The final status of a workflow that ended while its last status could not reach the Run."""
        meta = run["metadata"]
        snapshot = StatusSnapshot(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            status=status,
            events=[
                PhaseEvent(
                    revision=status.revision,
                    phase=status.phase,
                    reason=status.reason,
                    message=status.message,
                    at=datetime.now(UTC),
                )
            ],
        )
        await self.mirror(snapshot)


def _seen(run: dict[str, Any]) -> SeenRun:
    meta = run["metadata"]
    status = run.get("status") or {}
    return SeenRun(
        meta["uid"],
        meta["resourceVersion"],
        int(status.get("revision") or 0),
        status.get("phase"),
        recorded_chain(status),
    )
