"""Recorded histories of every lifecycle scenario still replay against today's workflow code.

A change that alters the commands a workflow issues breaks these replays unless it is guarded with
`workflow.patched`; the histories are recorded by `python -m tests.workflows.record_histories`.
"""

from pathlib import Path
from typing import cast

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from temporal_client.chains import Chains
from temporal_client.seal import Sealer
from tests.workflows.record_histories import SIGNAL_KEY_FILE
from worker.registry import RUN_WORKFLOWS, WORKFLOW_RUNNER
from worker.seals import SealCheck

HISTORIES = Path(__file__).with_name("histories")
SCENARIOS = sorted(f"{p.parent.name}/{p.name}" for p in HISTORIES.glob("v*/*") if p.is_dir())
LATEST = max((p.name for p in HISTORIES.glob("v*")), key=lambda v: int(v[1:]))


def test_every_kind_of_scenario_is_recorded_by_the_latest_version() -> None:
    latest = {s.split("/")[1] for s in SCENARIOS if s.startswith(f"{LATEST}/")}
    expected = {
        "happy-path",
        "retry-then-success",
        "sandbox-death",
        "retry-after-pause",
        "fallback-model",
        "reroute",
        "shared-credential",
        "credential-expired",
        "input-required",
        "manual-pause",
        "queued",
        "cancel-running-temporal",
        "cancel-paused-signal",
    }
    assert expected <= latest


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
