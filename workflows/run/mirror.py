"""The status mirror: it owns a Run's status. Every change bumps the revision, updates the search attributes (once
for all the changes of one workflow task) and is sent to the bridge (`mirror_status`) in the background,
coalesced: the latest status wins, and the phase events not yet sent go with it."""

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

from workflows import metrics
from workflows import search_attributes as sa
from workflows.activity_types import BRIDGE_TASK_QUEUE, mirror_status
from workflows.patches import Patches
from workflows.policies import set_condition, transition
from workflows.run.state import RunInput
from workflows.status import (
    MAX_EVENTS_PER_SNAPSHOT,
    ConditionType,
    PauseReason,
    Phase,
    PhaseEvent,
    RunStatus,
    StatusSnapshot,
)

# At the end (or before continuing as new), wait this long for the last status to be sent.
FLUSH_SECONDS = 60.0
# A status write that takes longer than this is given up and the latest status sent instead: one stuck write
# must not hold every later status back (the activity's own retries would resend the old snapshot).
WRITE_TIMEOUT = timedelta(seconds=5)
MAX_BACKOFF_SECONDS = 30.0
_ONE_TRY = RetryPolicy(maximum_attempts=1)
_UNSET = object()


class StatusMirror:
    def __init__(self, run: RunInput, status: RunStatus, patches: Patches) -> None:
        self.run = run
        self.status = status
        self.patches = patches
        self._task: asyncio.Task[None] | None = None
        self._upsert: asyncio.Task[None] | None = None
        self._mirrored_revision = -1
        self._unsent_events: list[PhaseEvent] = []
        self._search_attributes: dict[str, Any] = {}
        # When the current phase began (for its duration); after a continue-as-new, the last change's time.
        self._phase_since: datetime | None = status.last_transition_time

    def move(
        self,
        phase: Phase,
        *,
        reason: str,
        message: str,
        pause_reason: PauseReason | None = None,
        resume_at: datetime | None = None,
        send: bool = True,
    ) -> None:
        """Change the phase; the status is sent to the bridge now, or (`send=False`) with the next change."""
        now = workflow.now()
        left, since = self.status.phase, self._phase_since
        self.status = transition(
            self.status,
            phase,
            now,
            reason=reason,
            message=message,
            pause_reason=pause_reason,
            resume_at=resume_at,
            generation=self.run.generation,
        )
        workflow.set_current_details(f"**{phase.value}**: {message}")
        metrics.phase_changed(left, phase, reason, now - since if since is not None else None)
        if phase != left or since is None:
            self._phase_since = now
        self._unsent_events.append(
            PhaseEvent(revision=self.status.revision, phase=phase, reason=reason, message=message, at=now)
        )
        self._publish(send)

    def condition(self, kind: ConditionType, ok: bool, reason: str, message: str) -> None:
        """Set a condition; it is sent with the next phase change."""
        set_condition(self.status, kind, ok, reason, message, workflow.now(), self.run.generation)

    async def flush(self) -> None:
        """Wait (bounded) until the latest status has been sent; past the bound the bridge reconciles it."""
        if self.patches.current():
            self._upsert_search_attributes()  # before the workflow ends or continues as new, whatever is pending
        try:
            await workflow.wait_condition(
                lambda: self._mirrored_revision >= self.status.revision,
                timeout=FLUSH_SECONDS,
                timeout_summary="flush the last status",
            )
        except TimeoutError:
            workflow.logger.warning(
                "status revision %d not mirrored yet; the bridge reconciles it", self.status.revision
            )

    def _publish(self, send: bool = True) -> None:
        if self.status.revision <= self._mirrored_revision:
            return
        if not self.patches.current():
            self._upsert_search_attributes()  # histories from before: one upsert a change
        elif self._upsert is None or self._upsert.done():
            # Once the workflow task's code yields: the changes it made meanwhile (Claiming, then Running) are
            # one upsert, one history event and one action.
            self._upsert = asyncio.create_task(self._upserted())
        if send and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._send())

    async def _send(self) -> None:
        """Each write is bounded and tried once; a failed one is followed by the latest status (never a retry of
        an older snapshot), after a backoff. The bridge writes no revision over a newer one, so a write that
        finishes late does no harm."""
        backoff = 1.0
        while self._mirrored_revision < self.status.revision:
            events, self._unsent_events = self._unsent_events, []
            snapshot = StatusSnapshot(
                namespace=self.run.namespace,
                name=self.run.name,
                uid=self.run.uid,
                status=self.status.model_copy(deep=True),
                events=events[-MAX_EVENTS_PER_SNAPSHOT:],
                events_dropped=max(0, len(events) - MAX_EVENTS_PER_SNAPSHOT),
            )
            try:
                await workflow.execute_activity(
                    mirror_status,
                    snapshot,
                    task_queue=BRIDGE_TASK_QUEUE,
                    start_to_close_timeout=WRITE_TIMEOUT,
                    retry_policy=_ONE_TRY,
                    summary=f"mirror status r{snapshot.status.revision}: {snapshot.status.phase.value}",
                )
            except ActivityError as err:
                if _retryable(err):
                    self._unsent_events = events + self._unsent_events  # they go with the next try
                    await workflow.sleep(backoff, summary="mirror status: back off")
                    backoff = min(backoff * 2, MAX_BACKOFF_SECONDS)
                    continue
                workflow.logger.warning("mirroring status r%d failed: %s", snapshot.status.revision, err)
            backoff = 1.0
            self._mirrored_revision = max(self._mirrored_revision, snapshot.status.revision)

    async def _upserted(self) -> None:
        self._upsert_search_attributes()

    def _upsert_search_attributes(self) -> None:
        wanted: dict[str, Any] = {
            sa.PHASE.name: self.status.phase.value,
            sa.NAMESPACE.name: self.run.namespace,
            sa.AGENT.name: self.status.agent,
            sa.TRIGGERED_BY.name: self.run.triggered_by,
            sa.RESUME_AT.name: self.status.resume_at,
            sa.ATTEMPT.name: self.status.attempt,
        }
        keys = {k.name: k for k in sa.ALL}
        updates = []
        for name, value in wanted.items():
            if self._search_attributes.get(name, _UNSET) == value:
                continue
            self._search_attributes[name] = value
            key = keys[name]
            updates.append(key.value_unset() if value is None else key.value_set(value))
        if updates:
            workflow.upsert_search_attributes(updates)


def _retryable(err: ActivityError) -> bool:
    """A timeout or a retryable failure (the bridge or the API server unreachable): send again. A failure the
    bridge marks non-retryable will not change by resending."""
    cause = err.cause
    return not (isinstance(cause, ApplicationError) and cause.non_retryable)
