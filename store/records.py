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
