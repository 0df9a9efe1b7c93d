"""What runs and the entity workflows (`workflows.entities`) send each other: signal names, workflow ids and
the pydantic payloads and states. Pure data, imported once per worker process (see worker.registry)."""

from datetime import datetime

from pydantic import Field

from workflows.model import KsquadModel

# Signals the entities send to runs (handled by RunWorkflow).
CREDENTIAL_THROTTLED = "credential_throttled"
SLOT_GRANTED = "slot_granted"
SLOT_QUEUED = "slot_queued"


def credential_workflow_id(key: str) -> str:
    return f"credential/{key}"


def gate_workflow_id(scope: str) -> str:
    return f"gate/{scope}"


THROTTLED_UNTIL_MEMO = (
    "throttledUntil"  # on a CredentialThrottle workflow: until when its credential is limited
)


class ThrottleNotice(KsquadModel):
    """To runs: the credential `key` is throttled until `until`, after `strikes` limits in a row."""

    key: str
    until: datetime
    strikes: int


class CredentialSubscription(KsquadModel):
    run_id: str


class CredentialLimit(KsquadModel):
    run_id: str
    until: datetime


# The server refuses signals past 10,000 per execution (history.maximumSignalsPerExecution): an entity that
# thousands of runs signal continues as new well before that.
MAX_SIGNALS_PER_RUN = 2000


class CredentialState(KsquadModel):
    key: str
    throttled_until: datetime | None = None
    strikes: int = 0
    subscribers: list[str] = Field(default_factory=list)
    signals_per_run: int = Field(default=MAX_SIGNALS_PER_RUN, ge=1)  # continue as new after this many


class SlotRequest(KsquadModel):
    run_id: str
    limit: int = Field(ge=1)


class SlotRelease(KsquadModel):
    run_id: str


class SlotNotice(KsquadModel):
    """To runs: a slot of `scope` is theirs (granted), or they wait at `position` (queued)."""

    scope: str
    position: int = 0


class GateState(KsquadModel):
    scope: str
    limit: int = 1
    holders: list[str] = Field(default_factory=list)
    waiting: list[str] = Field(default_factory=list)  # first in, first out
    signals_per_run: int = Field(default=MAX_SIGNALS_PER_RUN, ge=1)  # continue as new after this many
