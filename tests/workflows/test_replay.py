"""Recorded histories of the lifecycle scenarios `tests/workflows/record_histories.py` drives (SCENARIOS) still
replay against today's workflow code.

A change that alters the commands a workflow issues breaks these replays unless it is guarded by a patch
(workflows.patches); the histories are recorded by `python -m tests.workflows.record_histories`.
"""

import base64
import json
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from temporal_client.chains import Chains
from temporal_client.seal import Sealer
from tests.workflows import record_histories
from tests.workflows.record_histories import SIGNAL_KEY_FILE
from worker.registry import RUN_WORKFLOWS, WORKFLOW_RUNNER
from worker.seals import SealCheck
from workflows.patches import CURRENT

HISTORIES = Path(__file__).with_name("histories")
SCENARIOS = sorted(f"{p.parent.name}/{p.name}" for p in HISTORIES.glob("v*/*") if p.is_dir())
# The last recording whose Runs asked each patch and upserted each change on its own.
BEFORE_ONE_PATCH = "v4"
LATEST = max((p.name for p in HISTORIES.glob("v*")), key=lambda v: int(v[1:]))


def test_every_scenario_the_recorder_knows_is_recorded_by_the_latest_version() -> None:
    latest = {s.split("/")[1] for s in SCENARIOS if s.startswith(f"{LATEST}/")}
    missing = set(record_histories.SCENARIOS) - latest
    assert len(record_histories.SCENARIOS) >= 15
    assert not missing, f"run `python -m tests.workflows.record_histories` for {sorted(missing)}"


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_recorded_histories_replay(scenario: str) -> None:
    files = sorted((HISTORIES / scenario).glob("*.json"))
    assert any(f.name.startswith("ksquad-system__") for f in files), "each scenario holds at least one run"
    key_file = HISTORIES / scenario / SIGNAL_KEY_FILE
    # Histories recorded since signals carry proofs are replayed as the worker runs them: the proofs checked with
    # the recording's key (activities do not run in a replay, so no chain is ever looked up).
    interceptors = (
        [SealCheck(Sealer(bytes.fromhex(key_file.read_text().strip())), cast(Chains, None))]
        if key_file.exists()
        else []
    )
    replayer = Replayer(
        workflows=list(RUN_WORKFLOWS),
        data_converter=pydantic_data_converter,
        workflow_runner=WORKFLOW_RUNNER,
        interceptors=interceptors,
    )
    for file in files:
        workflow_id = file.stem.replace("__", "/")
        history = WorkflowHistory.from_json(workflow_id, file.read_text())
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{scenario}/{file.name}: {result.replay_failure}"


def _run_histories(version: str) -> list[tuple[str, list[dict[str, Any]]]]:
    return [
        (f"{file.parent.name}/{file.name}", json.loads(file.read_text())["events"])
        for file in sorted(HISTORIES.glob(f"{version}/*/ksquad-system__*.json"))
    ]


def patches_asked(events: list[dict[str, Any]]) -> list[str]:
    asked = []
    for event in events:
        marker = event.get("markerRecordedEventAttributes", {})
        if marker.get("markerName") == "core_patch":
            data = marker["details"]["patch-data"]["payloads"][0]["data"]
            asked.append(json.loads(base64.b64decode(data))["id"])
    return asked


def search_attribute_upserts_by_task(events: list[dict[str, Any]]) -> list[int]:
    """Upserts of ksquad's own attributes (not the SDK's TemporalChangeVersion) each workflow task made."""
    counts = [0]
    for event in events:
        if event["eventType"] == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED":
            counts.append(0)
        elif event["eventType"] == "EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            fields = event["upsertWorkflowSearchAttributesEventAttributes"]["searchAttributes"][
                "indexedFields"
            ]
            counts[-1] += set(fields) != {"TemporalChangeVersion"}
    return counts


def test_a_current_run_asks_one_patch_and_upserts_its_search_attributes_once_a_workflow_task() -> None:
    """What the latest recording's code issues (the replays above prove today's code issues the same): the one
    marker of workflows.patches.CURRENT, and one upsert for all the changes of a workflow task. The recording
    before that scheme asked each patch (two events each) and upserted each change."""
    current = _run_histories(LATEST)
    assert current
    for name, events in current:
        assert patches_asked(events) == [CURRENT], name
        assert max(search_attribute_upserts_by_task(events)) <= 1, name
    before = _run_histories(BEFORE_ONE_PATCH)
    assert any(len(patches_asked(events)) > 1 for _, events in before)
    assert any(max(search_attribute_upserts_by_task(events)) > 1 for _, events in before)
