"""The coordination store: claims on work items with fencing tokens, and the fenced writes of runs.

Rules (DESIGN.md "Work items and claims"):
- claiming bumps the fence atomically and succeeds only when the item is free, its lease expired, or it is
  already ours: at most one holder at any time;
- every write on behalf of a run carries its fence and is rejected (StaleFence) once the fence has moved on;
  the check and the write are one statement, and the check takes a share lock on the claim, so a fence bump
  waits for writes in flight and every write that starts after it is refused;
- runs without a work item fence their writes by attempt (`begin_attempt`).

PostgreSQL in production, SQLite as the embedded default; the same code and migrations serve both. One module
per record (claims, events, artifacts, credentials and their resume ramps, work items, model usage, agents'
checkpoints, squad memory) on what they share (base); `Store` is all of them.
"""

from store.artifacts import Artifacts
from store.checkpoints import CheckpointRefused, Checkpoints, Step
from store.claims import Claims
from store.connection import async_url, sync_url, utcnow
from store.credentials import CredentialLimits
from store.events import RunEvents
from store.memory import MemoryEntry, MemoryNotFound, MemoryRefused, SquadMemory
from store.ramps import ResumeRamps
from store.records import (
    ITEM_STATES,
    Author,
    ClaimResult,
    Event,
    HistoryEntry,
    Holder,
    InvalidItemWrite,
    ItemEvent,
    ItemExists,
    ItemNotFound,
    ModelCall,
    PhaseRecord,
    StaleFence,
    StoreError,
    StoreUnavailable,
    UsageTotal,
    WorkItem,
    WorkItemHeld,
    work_item_key,
)
from store.usage import USAGE_GROUPS, ModelUsage
from store.work_items import MAX_PAGE, WorkItems

__all__ = [
    "ITEM_STATES",
    "MAX_PAGE",
    "USAGE_GROUPS",
    "Author",
    "CheckpointRefused",
    "ClaimResult",
    "Event",
    "HistoryEntry",
    "Holder",
    "InvalidItemWrite",
    "ItemEvent",
    "ItemExists",
    "ItemNotFound",
    "MemoryEntry",
    "MemoryNotFound",
    "MemoryRefused",
    "ModelCall",
    "PhaseRecord",
    "StaleFence",
    "Step",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "UsageTotal",
    "WorkItem",
    "WorkItemHeld",
    "async_url",
    "sync_url",
    "utcnow",
    "work_item_key",
]


class Store(
    Claims,
    RunEvents,
    Artifacts,
    CredentialLimits,
    ResumeRamps,
    WorkItems,
    ModelUsage,
    Checkpoints,
    SquadMemory,
):
    """The coordination store: every record's reads and writes on one engine (`await Store.open(url)`)."""
