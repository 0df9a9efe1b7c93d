"""The reach of one warrant (worker.seals.within_reach): whoever schedules an activity under a Run (a workflow task
answered by someone else's poller, with the codec) reaches that Run's own gates and credentials, as resolved, and
no further: not another tenant's credential (to pause its Runs until 2099), not another Team's gate (to change
its limit), not a ramp that is not the Run's."""

import secrets
from datetime import UTC, datetime, timedelta

import pytest

from temporal_client.seal import Sealer
from testbed.warrants import plain_warrant
from tests.temporal_client.test_seal import sealed
from worker.seals import within_reach
from workflows.activity_types import EntitySignal
from workflows.entity_types import (
    CredentialLimit,
    CredentialSubscription,
    ResumePlaceRequest,
    SlotRequest,
    credential_workflow_id,
    gate_workflow_id,
)
from workflows.envelope import NotInWarrant, Warrant

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
SOON = NOW + timedelta(minutes=10)


@pytest.fixture
def warrant() -> Warrant:
    return sealed(Sealer(secrets.token_bytes(32)))


def gate(scope: str, **request: object) -> EntitySignal:
    slot = {"run_id": "team-a/r", "limit": 2, "tenant": "payments", "weight": 2, **request}
    return EntitySignal(
        warrant=plain_warrant(),
        workflow="ConcurrencyGate",
        workflow_id=gate_workflow_id(scope),
        signal="acquire",
        arg=SlotRequest.model_validate(slot).model_dump(mode="json"),
    )


def credential(key: str, signal: str, until: datetime = SOON) -> EntitySignal:
    arg = CredentialLimit(run_id="team-a/r", until=until) if signal == "limited" else None
    return EntitySignal(
        warrant=plain_warrant(),
        workflow="CredentialThrottle",
        workflow_id=credential_workflow_id(key),
        signal=signal,
        arg=(arg or CredentialSubscription(run_id="team-a/r")).model_dump(mode="json"),
    )


def test_a_runs_own_gates_credentials_and_ramps_are_within_reach(warrant: Warrant) -> None:
    within_reach(gate("team/team-a/payments"), warrant, NOW)
    within_reach(gate("ns/team-a", limit=5), warrant, NOW)
    for key in ("team-a/key", "team-a/small-key", "team-a/pool-key", "team-a/b-key"):  # every model's
        within_reach(credential(key, "subscribe"), warrant, NOW)
        within_reach(credential(key, "limited"), warrant, NOW)
        within_reach(ResumePlaceRequest(key=key, until=SOON), warrant, NOW)


@pytest.mark.parametrize(
    ("what", "request_"),
    [
        ("another Team's gate", gate("team/team-b/payments")),
        ("its own gate, with a limit it was not resolved", gate("team/team-a/payments", limit=50)),
        ("its own gate, as another Team", gate("team/team-a/payments", tenant="big", weight=100)),
        ("another tenant's credential", credential("team-b/their-key", "limited")),
        (
            "its own credential, until 2099",
            credential("team-a/key", "limited", datetime(2099, 1, 1, tzinfo=UTC)),
        ),
        ("another tenant's ramp", ResumePlaceRequest(key="team-b/their-key", until=SOON)),
        (
            "its own ramp, until 2099",
            ResumePlaceRequest(key="team-a/key", until=datetime(2099, 1, 1, tzinfo=UTC)),
        ),
    ],
)
def test_past_the_warrant_nothing_is_sent(warrant: Warrant, what: str, request_: object) -> None:
    with pytest.raises(NotInWarrant):
        within_reach(request_, warrant, NOW)  # type: ignore[arg-type]
