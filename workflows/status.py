"""The Run's status: what `kubectl get run -o yaml` shows and what the workflow's `state` query returns."""

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from workflows.model import KsquadModel


class Phase(StrEnum):
    PENDING = "Pending"
    QUEUED = "Queued"
    CLAIMING = "Claiming"
    RUNNING = "Running"
    PAUSED = "Paused"
    CANCELLING = "Cancelling"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)


class PauseReason(StrEnum):
    RATE_LIMITED = "RateLimited"
    CREDENTIAL_EXPIRED = "CredentialExpired"
    INPUT_REQUIRED = "InputRequired"
    MANUAL = "Manual"


class ConditionType(StrEnum):
    REFERENCES_RESOLVED = "ReferencesResolved"
    ADMITTED = "Admitted"  # holds its concurrency slots
    WORK_ITEM_CLAIMED = "WorkItemClaimed"
    SANDBOX_READY = "SandboxReady"
    PAUSED = "Paused"
    # As a Job's: Complete=True when the run Succeeded, Failed=True when it Failed or was Cancelled (reason
    # Cancelled), so `kubectl wait --for=condition=Complete` never returns on a failure.
    COMPLETE = "Complete"
    FAILED = "Failed"


class Condition(KsquadModel):
    """The standard metav1.Condition shape."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: datetime
    observed_generation: int | None = None


class SandboxStatus(KsquadModel):
    name: str
    kind: Literal["warm", "cold", "local", "external"]


class WorkItemStatus(KsquadModel):
    ref: str
    fence: int


class WorkflowRef(KsquadModel):
    id: str
    run_id: str | None = None


class Artifact(KsquadModel):
    name: str
    uri: str | None = None
    media_type: str | None = None
    size: int | None = None


class RunStatus(KsquadModel):
    phase: Phase = Phase.PENDING
    reason: str | None = None
    message: str | None = None
    attempt: int = 0  # dispatches so far: each Claiming starts a new attempt (sandbox, messageId)
    retries: int = 0  # failed attempts counted against retryPolicy.maxRetries
    resume_at: datetime | None = None
    last_transition_time: datetime | None = None  # when the workflow last changed this status
    pause_reason: PauseReason | None = None
    agent: str | None = None
    model: str | None = None
    sandbox: SandboxStatus | None = None
    work_item: WorkItemStatus | None = None
    workflow: WorkflowRef | None = None
    triggered_by: str | None = None
    outputs: dict[str, str] = Field(default_factory=dict)
    artifacts: list[Artifact] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    observed_generation: int | None = None
    revision: int = 0  # bumped on every change; the bridge drops writes with a lower revision

    def condition(self, kind: ConditionType) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)


class PhaseEvent(KsquadModel):
    """One state change, for the Run's Kubernetes Events: coalescing may skip a status, never its event."""

    revision: int
    phase: Phase
    reason: str | None = None
    message: str | None = None
    at: datetime


MAX_EVENTS_PER_SNAPSHOT = 20


class StatusSnapshot(KsquadModel):
    """What the workflow sends to the bridge's `mirror_status` activity: the latest status, and every change
    since the previous snapshot (the last MAX_EVENTS_PER_SNAPSHOT of them; `events_dropped` counts the rest)."""

    namespace: str
    name: str
    uid: str
    status: RunStatus
    events: list[PhaseEvent] = Field(default_factory=list)
    events_dropped: int = 0
