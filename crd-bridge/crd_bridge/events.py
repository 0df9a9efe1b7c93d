"""Kubernetes Events on Runs, one per phase change, aggregated like client-go's recorder: the same reason and
message on the same Run bump one Event's count instead of adding another.

Events are readable by whoever may read the namespace's Events (the built-in `view` role among them), a wider
set than who may read the Run: they carry no text of the agent's (its answer, its question, its failure) or the
provider's, only the phase, the reason and ksquad's own words. The Run's status has the rest."""

import hashlib
import logging
from datetime import UTC, datetime

from kube import ApiError, Kube, path
from store import PhaseRecord
from workflows.activity_types import AgentError
from workflows.status import Phase, PhaseEvent, StatusSnapshot

log = logging.getLogger(__name__)
RUN_API = "ksquad.io/v1alpha1"
# The newest revision counted: a retried snapshot is not counted twice.
REVISION_ANNOTATION = "ksquad.io/revision"


def phase_records(snapshot: StatusSnapshot) -> list[PhaseRecord]:
    """The snapshot's phase changes as the run's event log keeps them (what `ksquad runs watch` shows)."""
    status = snapshot.status
    return [
        PhaseRecord(
            revision=e.revision,
            message=f"{e.phase}"
            + (f" ({e.reason})" if e.reason else "")
            + (f": {e.message}" if e.message else ""),
            data={
                "phase": e.phase.value,
                "reason": e.reason,
                "message": e.message,
                "revision": e.revision,
                "attempt": status.attempt,
                "at": e.at.isoformat(),
                "resumeAt": status.resume_at.isoformat()
                if status.resume_at and e.phase == Phase.PAUSED
                else None,
            },
            attempt=status.attempt,
        )
        for e in snapshot.events
    ]


# Whose message is the agent's or the provider's words: an answer, a question, a failure it reported. A rate
# limit's message is ksquad's own (the credential and when it resumes).
AGENT_WORDS = frozenset(
    {"Succeeded", "InputRequired", "Resumed", "RetryBackoff", *(e.value for e in AgentError)}
    - {"RateLimited"}
)


def event_message(event: PhaseEvent) -> str:
    """What an Event may say of a phase change: its message when it is ksquad's own, else where to read it."""
    if event.reason in AGENT_WORDS or event.phase in (Phase.SUCCEEDED, Phase.RUNNING):
        return f"{event.reason or event.phase.value} (the message is in the Run's status)"
    return event.message or event.reason or event.phase.value


def _micro_time(at: datetime) -> str:
    """eventTime's precision: the Events of one second keep their order (firstTimestamp has whole seconds)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    def __init__(self, kube: Kube, instance: str) -> None:
        self.kube = kube
        self.instance = instance

    async def record(self, namespace: str, run: str, uid: str, event: PhaseEvent) -> None:
        reason = event.reason or event.phase.value
        message = f"{event.phase.value}: {event_message(event)}"[:1024]
        digest = hashlib.sha256(f"{uid}|{reason}|{message}".encode()).hexdigest()[:16]
        name = f"{run[:200]}.{digest}"
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {REVISION_ANNOTATION: str(event.revision)},
            },
            "involvedObject": {
                "apiVersion": RUN_API,
                "kind": "Run",
                "name": run,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if event.phase == Phase.FAILED else "Normal",
            "source": {"component": "ksquad-bridge"},
            "reportingComponent": "ksquad.io/bridge",
            "reportingInstance": self.instance,
            "action": event.phase.value,  # an Event with an eventTime names its action
            # eventTime, not first/lastTimestamp: kubectl sorts by lastTimestamp when there is one, and it has
            # whole seconds, so the Events of one second came out of order
            "eventTime": _micro_time(event.at),
            "count": 1,
        }
        url = path("v1", "events", namespace)
        try:
            await self.kube.create(url, body)
            return
        except ApiError as err:
            if err.status != 409:
                log.warning("event on %s/%s: %s", namespace, run, err)
                return
        existing = await self.kube.get(path("v1", "events", namespace, name))
        counted = int(existing["metadata"].get("annotations", {}).get(REVISION_ANNOTATION, "0"))
        if event.revision <= counted:
            return
        await self.kube.patch(
            path("v1", "events", namespace, name),
            {
                "metadata": {
                    "resourceVersion": existing["metadata"]["resourceVersion"],
                    "annotations": {REVISION_ANNOTATION: str(event.revision)},
                },
                "count": int(existing.get("count") or 1) + 1,
                "series": {
                    "count": int(existing.get("count") or 1) + 1,
                    "lastObservedTime": _micro_time(event.at),
                },
            },
        )

    async def refusal(
        self, namespace: str, run: str, uid: str, workflow_id: str, run_id: str, why: Exception
    ) -> None:
        """A Warning Event on the Run: a copy of its workflow was refused (one per copy: its run id names it)."""
        digest = hashlib.sha256(f"{uid}|copy|{workflow_id}|{run_id}".encode()).hexdigest()[:16]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{run[:200]}.{digest}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": RUN_API,
                "kind": "Run",
                "name": run,
                "namespace": namespace,
                "uid": uid,
            },
            "reason": "CopyRefused",
            "message": str(why)[:1024],
            "type": "Warning",
            "source": {"component": "ksquad-bridge"},
            "reportingComponent": "ksquad.io/bridge",
            "reportingInstance": self.instance,
            "action": "Refused",
            "eventTime": _micro_time(datetime.now(UTC)),
            "count": 1,
        }
        try:
            await self.kube.create(path("v1", "events", namespace), body)
        except ApiError as err:
            if err.status != 409:  # the same copy, refused again: its Event is there
                log.warning("event on %s/%s: %s", namespace, run, err)
