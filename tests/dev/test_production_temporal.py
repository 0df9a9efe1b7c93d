"""The Run lifecycle on Temporal as users run it: the production server (frontend, history, matching and worker
services, built from the Go module proxy) on PostgreSQL for persistence and SQL visibility, its search attributes
registered with the operator CLI as docs/operating.md says, with ksquad's embedded stack (worker, store, local
sandboxes running the reference agent, the scripted model) connected to it instead of the dev server: a run
succeeds, a run pauses on a 429 and resumes by its timer (whose summary says when), one paused by hand shows why in
its current details and `temporal workflow cancel` cancels it there, and `temporal workflow list -q
"KsquadPhase=..."` finds them by phase (Running, Paused, Succeeded, Cancelled)."""

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata

from dev.binaries import find_binary
from dev.stack import DevStack, dev_stack
from testbed.embedded import stack_options, wait_terminal
from testbed.postgres import PostgresServer
from testbed.temporal_server import TemporalServer, temporal_server
from workflows.signals import RunSignal

NS = "bench"
API = "ksquad.io/v1alpha1"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "quick": [{"text": "done on the production server"}],
    "limited": [{"error": 429, "retry_after": "3"}, {"text": "after the limit"}],
    "slow": [{"delay": 600, "text": "never"}],
}


@pytest.fixture(scope="module")
async def production_temporal(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[TemporalServer]:
    async with temporal_server(postgres, tmp_path_factory.mktemp("temporal-server")) as server:
        yield server


@pytest.fixture
async def dev(production_temporal: TemporalServer, tmp_path: Path) -> AsyncIterator[DevStack]:
    options = replace(
        stack_options(tmp_path / ".ksquad", SCRIPT), temporal_address=production_temporal.target
    )
    async with dev_stack(options) as stack:
        yield stack


def docs() -> list[dict[str, Any]]:
    agents = [
        {
            "apiVersion": API,
            "kind": "Agent",
            "metadata": {"name": f"{model}-agent", "namespace": NS},
            "spec": {"modelEndpointRef": "local", "model": model},
        }
        for model in SCRIPT
    ]
    runs = [
        {
            "apiVersion": API,
            "kind": "Run",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"agents": [f"{model}-agent"]},
        }
        for name, model in (("succeeds", "quick"), ("pauses", "limited"), ("cancelled", "slow"))
    ]
    return agents + runs


def temporal(server: TemporalServer, *args: str) -> str:
    done = subprocess.run(
        [str(find_binary("temporal")), *args, "--address", server.target, "-o", "jsonl"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


async def status(dev: DevStack, name: str) -> dict[str, Any]:
    return (await dev.runs.get(NS, name)).status or {}


async def until(dev: DevStack, name: str, phase: str, within: float = 60) -> dict[str, Any]:
    for _ in range(int(within / 0.2)):
        if (current := await status(dev, name)).get("phase") == phase:
            return current
        await asyncio.sleep(0.2)
    raise AssertionError(f"{name} not {phase} within {within}s: {await status(dev, name)}")


async def test_the_run_lifecycle_on_the_production_server(
    production_temporal: TemporalServer, dev: DevStack
) -> None:
    await dev.runs.apply(docs())
    paused = await until(dev, "pauses", "Paused")
    assert paused["pauseReason"] == "RateLimited" and paused["resumeAt"]
    await until(dev, "cancelled", "Running")

    # Visibility on PostgreSQL finds runs by ksquad's search attributes, as the README's queries do.
    async def listed(query: str) -> set[str]:
        out = await asyncio.to_thread(temporal, production_temporal, "workflow", "list", "-q", query)
        return {json.loads(line)["execution"]["workflowId"] for line in out.splitlines() if line.strip()}

    for _ in range(300):  # visibility is written asynchronously
        found = await listed(f"KsquadPhase='Running' AND KsquadNamespace='{NS}'")
        if f"{NS}/cancelled" in found:
            break
        await asyncio.sleep(0.2)
    assert f"{NS}/cancelled" in found, found

    # Paused by hand, as an operator sees it: listed by phase, its current details say why (the Temporal UI shows
    # them on the workflow's page), and Temporal's cancel still ends it from there.
    await dev.runs.signal(NS, "cancelled", RunSignal.PAUSE, "looking at it")
    await until(dev, "cancelled", "Paused")
    for _ in range(300):
        if f"{NS}/cancelled" in (found := await listed(f"KsquadPhase='Paused' AND KsquadNamespace='{NS}'")):
            break
        await asyncio.sleep(0.2)
    assert f"{NS}/cancelled" in found, found
    metadata = await dev.client.get_workflow_handle(f"{NS}/cancelled").query(
        "__temporal_workflow_metadata", result_type=WorkflowMetadata
    )
    assert metadata.current_details == "**Paused**: looking at it", metadata.current_details

    said = await asyncio.to_thread(
        temporal, production_temporal, "workflow", "cancel", "-w", f"{NS}/cancelled"
    )
    final = await wait_terminal(dev, ["succeeds", "pauses", "cancelled"], within=120)
    if final.get("cancelled") != "Cancelled":  # what the workflow did with the request, for the failure
        handle = dev.client.get_workflow_handle(f"{NS}/cancelled")
        history = await handle.fetch_history()
        described = await handle.describe()
        events = [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events]
        pending = [a.activity_type.name for a in described.raw_description.pending_activities]
        raise AssertionError(
            f"{final}; the cancelled run's history: {events}; pending: {pending}; the CLI said {said!r}"
        )
    assert final == {"succeeds": "Succeeded", "pauses": "Succeeded", "cancelled": "Cancelled"}, final
    resumed = await status(dev, "pauses")
    assert (resumed["attempt"], resumed["message"]) == (2, "after the limit"), (
        "resumed by its timer: a new attempt, as in the demo"
    )
    # The timer it waited on says when it would resume, in the history the UI shows.
    history = await dev.client.get_workflow_handle(f"{NS}/pauses").fetch_history()
    summaries = [
        await dev.client.data_converter.decode([e.user_metadata.summary])
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED and e.user_metadata.HasField("summary")
    ]
    assert any(str(s[0]).startswith("rate limited: resume at ") for s in summaries), summaries
    # Its agent calls carry its namespace as their fairness key, which this server (matching.enableFairness, as
    # testbed/temporal_server.py configures it) dispatches round.
    keys = {
        e.activity_task_scheduled_event_attributes.priority.fairness_key
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "invoke_agent"
    }
    assert keys == {NS}, keys
    for _ in range(50):
        done = await listed(f"KsquadPhase='Succeeded' AND KsquadNamespace='{NS}'")
        if {f"{NS}/succeeds", f"{NS}/pauses"} <= done:
            break
        await asyncio.sleep(0.2)
    assert {f"{NS}/succeeds", f"{NS}/pauses"} <= done, done
    assert f"{NS}/cancelled" in await listed(f"KsquadPhase='Cancelled' AND KsquadNamespace='{NS}'")
