"""What the store hands back and raises: the holder of a claim, a claim's result, events, history, errors."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def work_item_key(namespace: str, ref: str) -> str:
    """A work item's key in the store: its namespace and its ref. A ref is unique in its namespace only, so the
    same ref in two namespaces is two items: a tenant can neither hold another's item nor learn who holds it."""
    return f"{namespace}/{ref}"


class StoreError(Exception):
    pass


class StaleFence(StoreError):
    """The write's fence is not the current one: another holder (or a later attempt) owns the item now."""


class WorkItemHeld(StoreError):
    """Another run holds the work item and its lease has not expired."""

    def __init__(self, work_item_ref: str, holder_run: str | None, lease_expires_at: datetime | None) -> None:
        until = f" until {lease_expires_at.isoformat()}" if lease_expires_at else ""
        super().__init__(f"{work_item_ref} is held by {holder_run}{until}")
        self.holder_run = holder_run
        self.lease_expires_at = lease_expires_at


class StoreUnavailable(StoreError):
    """The database cannot be reached or failed: retry later; nothing was written."""


class ItemNotFound(StoreError):
    """No work item of that id in that namespace."""


class ItemExists(StoreError):
    """A work item of that id exists in that namespace already."""


class InvalidItemWrite(StoreError):
    """A write to a work item the record refuses (too long, an unknown state, a change its state does not allow);
    `field` names what was wrong. Nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Holder:
    """Who writes: a run, by its uid (a recreated Run with the same name is another holder)."""

    uid: str
    run: str  # "<namespace>/<name>"
    triggered_by: str | None = None


@dataclass(frozen=True)
class ClaimResult:
    fence: int
    lease_expires_at: datetime
    took_over_from: str | None  # the uid of an expired holder this claim replaced


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    message: str
    data: Any
    fence: int
    attempt: int
    triggered_by: str | None
    at: datetime


@dataclass(frozen=True)
class PhaseRecord:
    """A phase change of a run's status, as its event log keeps it."""

    revision: int
    message: str
    data: dict[str, Any]
    attempt: int = 0


@dataclass(frozen=True)
class HistoryEntry:
    action: str
    holder_uid: str
    holder_run: str
    fence: int
    previous_holder_uid: str | None
    triggered_by: str | None
    at: datetime


# A work item's states, and the changes each allows (done items reopen; nothing changes to where it is).
ITEM_STATES = ("open", "in-progress", "blocked", "done")
ITEM_TRANSITIONS = {
    "open": {"in-progress", "blocked", "done"},
    "in-progress": {"open", "blocked", "done"},
    "blocked": {"open", "in-progress", "done"},
    "done": {"open"},
}


@dataclass(frozen=True)
class Author:
    """Who wrote to a work item: a person (`user` alone), or an agent working attempt `attempt` of a Run (`run`,
    `run_uid`) for the person who started it (`user`, the Run's triggered-by)."""

    user: str | None
    run: str | None = None  # "<namespace>/<name>"
    run_uid: str | None = None
    attempt: int | None = None


@dataclass(frozen=True)
class WorkItem:
    namespace: str
    item_id: str
    title: str
    body: str
    state: str
    labels: tuple[str, ...]
    created_by: str
    created_at: datetime
    updated_at: datetime
    last_seq: int  # of its events: the cursor a stream of the item resumes from


@dataclass(frozen=True)
class ItemEvent:
    """One entry of a work item's record, in order: created, comment, state, artifact."""

    seq: int
    kind: str
    body: str
    data: Any
    author: Author
    fence: int | None  # the claim's fence an agent wrote under; None for a person
    at: datetime


@dataclass(frozen=True)
class ModelCall:
    """One model call of a run's attempt and what it cost, charged to `credential` and `triggered_by`."""

    namespace: str
    run: str  # "<namespace>/<name>"
    run_uid: str
    attempt: int
    call_id: str  # the agent's number for the call, unique in its attempt's task
    model: str
    credential: str  # "<namespace>/<secret>", or "" when the model uses none
    triggered_by: str
    input_tokens: int
    output_tokens: int
    latency_ms: int


@dataclass(frozen=True)
class UsageTotal:
    """Calls and tokens summed over a group of model calls (`key`: what they share, by the grouping asked)."""

    key: str
    calls: int
    input_tokens: int
    output_tokens: int
