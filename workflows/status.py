"""The Run's status: what `kubectl get run -o yaml` shows and what the workflow's `state` query returns."""

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field

from workflows.model import KsquadModel


class Phase(StrEnum):
    PENDING = "Pending"
    QUEUED = "Queued"
    CLAIMING = "Claiming"
    RUNNING = "Running"
    PAUSED = "Paused"
    # False when the Run cannot say its agent stopped: CancelUnconfirmed (a cancelled call's agent did not confirm
    # within the wait that its task stopped) or SandboxNotGone (its sandbox was not confirmed gone at teardown);
    # True (SandboxGone) once the sandbox of an agent that did not confirm was deleted and seen gone.
    AGENT_STOPPED = "AgentStopped"
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


def not_waiting_for_input(status: Mapping[str, Any] | None) -> str | None:
    """Why a Run with this status (as stored: the Run's `.status`) takes no answer now, or None when it is
    paused for input. The workflow drops an answer it was not waiting for (workflows/run/pauses.py), so the
    CLI and the APIs refuse it up front with this."""
    status = status or {}
    phase, reason = status.get("phase") or Phase.PENDING, status.get("pauseReason")
    if (phase, reason) == (Phase.PAUSED, PauseReason.INPUT_REQUIRED):
        return None
    return f"it is {phase} ({reason})" if reason else f"it is {phase}"


class ConditionType(StrEnum):
    REFERENCES_RESOLVED = "ReferencesResolved"
    ADMITTED = "Admitted"  # holds its concurrency slots
    WORK_ITEM_CLAIMED = "WorkItemClaimed"
    SANDBOX_READY = "SandboxReady"
    PAUSED = "Paused"
    # False when the Run cannot say its agent stopped: CancelUnconfirmed (a cancelled call's agent did not confirm
    # within the wait that its task stopped) or SandboxNotGone (its sandbox was not confirmed gone at teardown);
    # True (SandboxGone) once the sandbox of an agent that did not confirm was deleted and seen gone.
    AGENT_STOPPED = "AgentStopped"
    # As a Job's: Complete=True when the run Succeeded, Failed=True when it Failed or was Cancelled (reason
    # Cancelled), so `kubectl wait --for=condition=Complete` never returns on a failure.
    COMPLETE = "Complete"
    FAILED = "Failed"


class Condition(KsquadModel):
    """The standard metav1.Condition shape."""

    type: str
    """ReferencesResolved, Admitted, WorkItemClaimed, SandboxReady, Paused, AgentStopped, Complete or Failed."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    reason: str
    """Why, in one word."""
    message: str = ""
    """Why, in words."""
    last_transition_time: datetime
    """When the status last changed."""
    observed_generation: int | None = None
    """The Run's generation it was set for."""


class SandboxStatus(KsquadModel):
    """The sandbox an attempt's agent runs in."""

    name: str
    """The pod (warm), Job (cold), SandboxClaim/Sandbox (claimed), local process or Agent (external)."""
    kind: Literal["warm", "cold", "claimed", "local", "external"]
    """warm: claimed from a pool; cold: a Job; claimed: through an agent-sandbox SandboxClaim; local: the embedded
    default; external: an Agent's endpoint."""


class WorkItemStatus(KsquadModel):
    """The work item the Run claims."""

    ref: str
    """spec.workItemRef."""
    fence: int
    """The fencing token of the Run's claim: writes with an older one are refused."""
    item: bool = False
    """True when the ref names a work item of the namespace (`ksquad items get`), which the agent is given to read
    and write; false when it names none and is a lock key alone (at most one Run at a time holds it)."""


class WorkflowRef(KsquadModel):
    """The Run's Temporal workflow."""

    id: str
    """Its workflow id: <namespace>/<name>."""
    run_id: str | None = None
    """Its run id (a new one after continue-as-new)."""
    first_run_id: str | None = None
    """The execution the bridge started for this Run: the first run id of its workflow chain. Set once; the
    bridge acts for no other execution (a copy of the Run's start input is refused)."""


class Artifact(KsquadModel):
    """Something the agent produced."""

    name: str
    """Its name (as the agent gave it, else artifact-<n>)."""
    uri: str | None = None
    """Where it is kept (ksquad://runs/<uid>/artifacts/<name>: the worker's database)."""
    media_type: str | None = None
    """text/plain or application/json."""
    size: int | None = None
    """Bytes."""


class UsageStatus(KsquadModel):
    """Model calls and their tokens, as the Run's agents reported them (each call once)."""

    calls: int = 0
    """Model calls answered."""
    input_tokens: int = 0
    """Tokens sent to the models (prompts)."""
    output_tokens: int = 0
    """Tokens the models answered with."""

    def plus(self, other: "UsageStatus") -> "UsageStatus":
        return UsageStatus(
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
        )


class RunStatus(KsquadModel):
    """What the Run's workflow says of it, mirrored here by the bridge (newest revision wins)."""

    phase: Phase = Phase.PENDING
    """Pending, Queued, Claiming, Running, Paused, Cancelling, then Succeeded, Failed or Cancelled."""
    reason: str | None = None
    """Why the Run is in its phase, in one word (RateLimited, RetryBackoff, AgentFailed, QueueTimeout...)."""
    message: str | None = None
    """What it waits for, or how it ended: the agent's answer once Succeeded."""
    attempt: int = 0
    """Dispatches so far: each Claiming starts a new attempt (a new sandbox and message)."""
    retries: int = 0
    """Failed attempts counted against retryPolicy.maxRetries."""
    resume_at: datetime | None = None
    """When a Paused (RateLimited) or backing-off Run goes on by itself."""
    last_transition_time: datetime | None = None
    """When the workflow last changed this status."""
    pause_reason: PauseReason | None = None
    """While Paused: RateLimited, CredentialExpired, InputRequired or Manual."""
    agent: str | None = None
    """The Agent of the current or last attempt."""
    model: str | None = None
    """The model it calls (the fallback model once switched)."""
    sandbox: SandboxStatus | None = None
    """The sandbox the agent runs in, while it is held."""
    work_item: WorkItemStatus | None = None
    """The claimed work item and its fence."""
    workflow: WorkflowRef | None = None
    """The Temporal workflow (`temporal workflow describe -w <namespace>/<name>`)."""
    triggered_by: str | None = None
    """Who created the Run (stamped at admission)."""
    outputs: dict[str, str] = Field(default_factory=dict)
    """The agent's outputs, shortened (the ConfigMap <name>-outputs has them whole)."""
    artifacts: list[Artifact] = Field(default_factory=list)
    """The agent's artifacts (`ksquad runs artifacts NAME [ARTIFACT]` reads their content)."""
    usage: UsageStatus | None = None
    """Model calls and tokens over every attempt so far, as the agents reported them (`ksquad usage` sums them by
    credential, namespace, person or model). Unset until an agent reports any."""
    conditions: list[Condition] = Field(default_factory=list)
    """ReferencesResolved, Admitted, WorkItemClaimed, SandboxReady, Paused, and Complete or Failed at the end."""
    observed_generation: int | None = None
    """The generation of the spec the workflow runs."""
    revision: int = 0
    """Bumped on every change; the bridge drops writes with a lower revision."""

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
