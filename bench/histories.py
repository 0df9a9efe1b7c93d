"""What a workflow's history costs Temporal: its events by kind, its size, and its actions as Temporal Cloud bills
them (https://docs.temporal.io/cloud/actions), counted from the history:

- the workflow started: 1;
- each activity attempt: 1 (its ActivityTaskStarted event carries the attempt it completed on; earlier attempts
  leave no event of their own);
- local activities: 1 for each workflow task that ran any (their markers between two completed workflow tasks);
- each timer started, signal received, search attribute upsert, signal sent to another workflow, child workflow
  started, update accepted: 1; except the upsert of `TemporalChangeVersion` alone that the SDK makes with each
  `workflow.patched` marker, which is exempt.

Heartbeats are billed too but leave no event; queries are not in a history. Both are outside these counts (an
agent call heartbeats about once a second while it runs)."""

from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

LOCAL_ACTIVITY_MARKER = "core_local_activity"  # the marker a local activity leaves in the history
CHANGE_VERSION = "TemporalChangeVersion"  # the search attribute of workflow.patched's markers (no action)
ONE_ACTION = {
    "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED",
    "EVENT_TYPE_TIMER_STARTED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED",
    "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES",
    "EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED",
    "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED",
    "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED",
}


async def shape_of(handle: WorkflowHandle[Any, Any]) -> dict[str, Any]:
    """The workflow's history: events by kind (a marker by its name), and the totals bench reports."""
    counts: dict[str, int] = {}
    size = actions = 0
    local_in_this_task = False
    async for event in handle.fetch_history_events():
        name = EventType.Name(event.event_type)
        size += event.ByteSize()
        if name == "EVENT_TYPE_MARKER_RECORDED":
            name = event.marker_recorded_event_attributes.marker_name  # a local activity, a patch
            if name == LOCAL_ACTIVITY_MARKER and not local_in_this_task:
                actions += 1
                local_in_this_task = True
        elif name == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED":
            local_in_this_task = False
        elif name == "EVENT_TYPE_ACTIVITY_TASK_STARTED":
            actions += max(1, event.activity_task_started_event_attributes.attempt)
        elif name == "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            if set(fields) == {CHANGE_VERSION}:
                name = f"{name} ({CHANGE_VERSION})"
        actions += name in ONE_ACTION
        counts[name] = counts.get(name, 0) + 1
    return {
        "activities": counts.get("EVENT_TYPE_ACTIVITY_TASK_SCHEDULED", 0),
        "local_activities": counts.get(LOCAL_ACTIVITY_MARKER, 0),
        "workflow_tasks": counts.get("EVENT_TYPE_WORKFLOW_TASK_COMPLETED", 0),
        "history_events": sum(counts.values()),
        "history_bytes": size,
        "actions": actions,
        "events": dict(sorted(counts.items())),
    }


async def timeline_of(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Where a workflow's time went, by its history's clock: each workflow task and activity (from scheduled to
    completed, failed or timed out) as `what +start_ms took_ms`, the start measured from the workflow's start."""
    started: float | None = None
    opened: dict[int, tuple[str, float]] = {}  # scheduled event id -> (what, when)
    steps: list[str] = []
    async for event in handle.fetch_history_events():
        at = event.event_time.ToMilliseconds()
        started = at if started is None else started
        if event.HasField("activity_task_scheduled_event_attributes"):
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            opened[event.event_id] = (name, at)
        elif event.HasField("workflow_task_scheduled_event_attributes"):
            opened[event.event_id] = ("workflow task", at)
        else:
            for field in (
                "activity_task_completed_event_attributes",
                "activity_task_failed_event_attributes",
                "activity_task_timed_out_event_attributes",
                "workflow_task_completed_event_attributes",
            ):
                if event.HasField(field):
                    what, since = opened.pop(getattr(event, field).scheduled_event_id)
                    steps.append(f"{what} +{since - started:.0f} took {at - since:.0f}")
    return steps
