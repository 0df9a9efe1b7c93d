"""What runs and the entity workflows (`workflows.entities`) send each other: signal names, workflow ids and
the pydantic payloads and states. Pure data, imported once per worker process (see worker.registry)."""

from datetime import datetime

from pydantic import Field

from workflows.envelope import Warrant
from workflows.model import KsquadModel
from workflows.signals import RunSignal

# Signals the entities send to runs (handled by RunWorkflow).
CREDENTIAL_THROTTLED = RunSignal.CREDENTIAL_THROTTLED
SLOT_GRANTED = RunSignal.SLOT_GRANTED
SLOT_QUEUED = RunSignal.SLOT_QUEUED


def credential_workflow_id(key: str) -> str:
    return f"credential/{key}"


def credential_announcer_id(key: str) -> str:
    return f"credential-limit/{key}"


def gate_workflow_id(scope: str) -> str:
    return f"gate/{scope}"


# On a CredentialThrottle workflow: until when its credential is limited.
THROTTLED_UNTIL_MEMO = "throttledUntil"


# Paused runs leave a rate limit at most this many per second per credential, unless the ModelEndpoint says
# otherwise (resumePerSecond): a provider that just answered 429 does not get every paused run back at once.
DEFAULT_RESUME_PER_SECOND = 10.0


class ThrottleNotice(KsquadModel):
    """To runs: the credential `key` is throttled until `until`, after `strikes` limits in a row."""

    key: str
    until: datetime
    strikes: int


class CredentialSubscription(KsquadModel):
    run_id: str
    # The limit the subscriber already knows of (read from the throttle's memo before subscribing), if any.
    known_until: datetime | None = None


class CredentialLimit(KsquadModel):
    run_id: str
    until: datetime


class ResumePlaceRequest(KsquadModel):
    """A place in the ramp after `key`'s limit ending at `until`: places are `1 / resume_per_second` apart."""

    key: str
    until: datetime
    resume_per_second: float = Field(default=DEFAULT_RESUME_PER_SECOND, gt=0)
    # The run and its share (store.ramps): its turn is fair across tenants. None: a run paused before fair ramps
    # (an upgrade mid-pause) takes the next place in pause order.
    run_id: str | None = None
    tenant: str = ""
    weight: float = Field(default=1.0, ge=1, le=100)
    # The run's warrant: who asks (its workflow) and its share are the warrant's, not the fields above. None:
    # asked before warrants.
    warrant: Warrant | None = None


# The server refuses signals past 10,000 per execution (history.maximumSignalsPerExecution): an entity that
# thousands of runs signal continues as new well before that.
MAX_SIGNALS_PER_RUN = 2000


class CredentialState(KsquadModel):
    key: str
    throttled_until: datetime | None = None
    strikes: int = 0
    subscribers: list[str] = Field(default_factory=list)
    signals_per_run: int = Field(default=MAX_SIGNALS_PER_RUN, ge=1)  # continue as new after this many
    to_notify: list[str] = Field(default_factory=list)  # notices not yet sent when it continued as new


class AnnouncerState(KsquadModel):
    key: str
    signals_per_run: int = Field(default=MAX_SIGNALS_PER_RUN, ge=1)  # continue as new after this many
    reporters: list[CredentialLimit] = Field(
        default_factory=list
    )  # limits not announced yet at continue-as-new


class LimitAnnouncement(KsquadModel):
    """Tell the runs subscribed to `key` in the store of its limit (the store's, the latest). The runs that
    reported a limit at least as late already know of it and are left out."""

    key: str
    reporters: list[CredentialLimit] = Field(default_factory=list)


MAX_ASKS = 1_000_000  # requests of one run to one gate: each needs a pause and a resume


class SlotRequest(KsquadModel):
    run_id: str
    limit: int = Field(ge=1)
    tenant: str = ""  # the run's Team (workflows.contract.FairShare): slots go round the Teams that wait
    weight: float = Field(default=1.0, ge=1, le=100)
    # Which of the run's requests to this gate it is (1, 2...): a run paused while queued withdraws its place and
    # asks again after `resume`, and only a request newer than the last withdrawn one is taken.
    asked: int = Field(default=1, ge=1, le=MAX_ASKS)


class SlotRelease(KsquadModel):
    run_id: str
    asked: int = Field(
        default=1, ge=1, le=MAX_ASKS
    )  # the request (SlotRequest.asked) whose slot or place it gives up


class SlotNotice(KsquadModel):
    """To runs: a slot of `scope` is theirs (granted), or they wait at `position` (queued)."""

    scope: str
    position: int = 0
    # The execution of the run it is for (its first run id, as the run's request proved it): a notice for an
    # earlier Run of the same name changes nothing. None from gates before proofs.
    chain: str | None = None


class GateState(KsquadModel):
    scope: str
    limit: int = 1
    # Runs by key: "<workflow id>@<first run id>" (which execution of the Run, as its request proved it), or the
    # workflow id alone for requests from before proofs.
    holders: list[str] = Field(default_factory=list)
    waiting: list[str] = Field(default_factory=list)  # in arrival order
    # Weighted fair queueing across tenants: each waiting run's virtual finish (its tenant's last, or the gate's
    # virtual clock, plus 1/weight); the smallest is admitted next, the later arrival on a tie. A run
    # without one (queued before fair admission) counts as 0: first.
    finish: dict[str, float] = Field(default_factory=dict)
    tenant_finish: dict[str, float] = Field(default_factory=dict)
    virtual: float = 0.0  # the finish of the run admitted last
    signals_per_run: int = Field(default=MAX_SIGNALS_PER_RUN, ge=1)  # continue as new after this many
    # The runs that released their slot lately (keys, oldest first): a copy of one's earlier request is refused.
    released: list[str] = Field(default_factory=list)
    # Of those, the ones that had asked more than once: the last request they withdrew (absent: their first).
    released_asks: dict[str, int] = Field(default_factory=dict)


# How many released runs a gate remembers (a copy of an older request is found by the liveness check instead).
REMEMBERED_RELEASES = 1000


def run_key(run_id: str, chain: str | None) -> str:
    """A run as a gate keeps it: its workflow id, and which execution of it."""
    return f"{run_id}@{chain}" if chain else run_id


def key_run(key: str) -> tuple[str, str | None]:
    """(workflow id, first run id or None) of a gate's key."""
    run_id, _, chain = key.partition("@")
    return run_id, chain or None
