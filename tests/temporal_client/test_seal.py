"""The envelope and the warrant (workflows.envelope, temporal_client.seal): a Run is trusted or refused as one
thing. A forged value in any field of the start input or the resolution (every leaf of either, walked here, not
listed) breaks the seal; a sealed envelope under another workflow id is a copy; a warrant is bound to the one
execution it was made for; and a contract is built from the warrant alone, on a route the bridge resolved."""

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from temporal_client.seal import Copied, Sealer, Unsealed
from workflows.contract import (
    ConcurrencyScope,
    CredentialRef,
    FairShare,
    MCPServerRef,
    ModelRef,
    Resolution,
    ResolvedAgent,
    ToolSpec,
)
from workflows.envelope import NotInWarrant, RouteChoice, RunEnvelope, Warrant
from workflows.spec import Placement, parse_run_spec


def model(name: str, secret: str = "key") -> ModelRef:
    return ModelRef(
        name=name,
        url="https://api.example/v1",
        credential=CredentialRef(secret_name=secret, allowed_hosts=["api.example"]),
    )


def envelope() -> RunEnvelope:
    spec = parse_run_spec(
        {
            "agents": ["dev", "backup"],
            "teamRef": "payments",
            "workItemRef": "PAY-9",
            "inputs": {"task": "fix it", "branch": "main"},
            "tokenBudget": 5000,
            "retryPolicy": {"maxRetries": 3},
        }
    )
    return RunEnvelope(
        namespace="team-a", name="r", uid="uid-r", generation=2, triggered_by="alice@example.com", spec=spec
    )


def resolution() -> Resolution:
    agent = ResolvedAgent(
        name="dev",
        model=model("m"),
        fallback_model=model("small", "small-key"),
        project_fallback_model=model("pool", "pool-key"),
        system_prompt="You fix flaky tests.",
        image="agent:1",
        tools=[
            ToolSpec(name="notes", tool_name="add_note", mcp_server=MCPServerRef(name="kb", url="http://kb/"))
        ],
        allowed_tools=["notes"],
        credential=CredentialRef(secret_name="dev-key"),
        placement=Placement(service_account_name="gpu-runner", node_selector={"pool": "gpu"}),
    )
    return Resolution(
        outcome="resolved",
        agents=[agent, ResolvedAgent(name="backup", model=model("b", "b-key"))],
        scopes=[
            ConcurrencyScope(key="ns/team-a", limit=5),
            ConcurrencyScope(key="team/team-a/payments", limit=2),
        ],
        token_budget=10000,
        share=FairShare(tenant="payments", weight=2),
    )


def sealed(sealer: Sealer, chain: str = "run-1") -> Warrant:
    env = sealer.seal_envelope(envelope())
    return Warrant(envelope=env, resolution=sealer.seal_warrant(env, chain, resolution()))


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path, value


def forged(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if value is None:
        return "forged"
    return f"{value}-forged"


def with_leaf(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(data) if isinstance(data, dict) else list(data)
    copy[path[0]] = with_leaf(data[path[0]], path[1:], value)
    return copy


def test_a_warrant_holds_and_a_forged_value_in_any_field_of_it_is_refused() -> None:
    sealer = Sealer(secrets.token_bytes(32))
    warrant = sealed(sealer)
    assert sealer.check_warrant(warrant, "team-a/r") == "run-1"
    data = warrant.model_dump(mode="json")
    tried = 0
    for path, value in leaves(data):
        if path[-1] in ("seal", "envelopeSeal") or path[:2] == ("resolution", "chain"):
            continue  # the seals themselves, and the chain (bound, tried below)
        try:
            candidate = Warrant.model_validate(with_leaf(data, path, forged(value)))
        except ValueError:
            continue  # the forged value is not even a valid field: nothing to sign
        tried += 1
        with pytest.raises(Unsealed):
            sealer.check_warrant(candidate, "team-a/r")
    assert tried > 60, "every field of the envelope and the resolution was tried"
    # a forged chain, or a chain of another key's warrant, or a resolution moved to another envelope
    for candidate in (
        warrant.model_copy(update={"resolution": warrant.resolution.model_copy(update={"chain": "run-2"})}),
        warrant.model_copy(update={"resolution": sealed(Sealer(secrets.token_bytes(32))).resolution}),
        Warrant(
            envelope=sealer.seal_envelope(envelope().model_copy(update={"uid": "uid-2"})),
            resolution=warrant.resolution,
        ),
    ):
        with pytest.raises(Unsealed):
            sealer.check_warrant(candidate, "team-a/r")


def test_a_sealed_envelope_under_another_workflow_id_is_a_copy() -> None:
    sealer = Sealer(secrets.token_bytes(32))
    warrant = sealed(sealer)
    sealer.check_envelope(warrant.envelope, "team-a/r")
    with pytest.raises(Copied, match="a copy"):
        sealer.check_envelope(warrant.envelope, "attacker/r")
    with pytest.raises(Copied):
        sealer.check_warrant(warrant, "team-a/other")
    with pytest.raises(Unsealed, match="missing"):
        sealer.check_envelope(envelope(), "team-a/r")


def test_a_carry_is_not_part_of_the_envelope() -> None:
    """A RunInput is its envelope and a carry; the carry is the workflow's own, sealed by no one."""
    from workflows.run.state import RunCarry, RunInput
    from workflows.status import RunStatus

    sealer = Sealer(secrets.token_bytes(32))
    run_input = sealer.seal_envelope(RunInput(**envelope().model_dump()))
    carried = run_input.model_copy(update={"carry": RunCarry(status=RunStatus(revision=99))})
    sealer.check_envelope(carried, "team-a/r")
    assert carried.envelope() == run_input.envelope()


def test_a_contract_is_built_from_the_warrant_on_a_resolved_route_only() -> None:
    warrant = sealed(Sealer(secrets.token_bytes(32)))
    contract = warrant.contract(RouteChoice(agent_index=0, model="project"), attempt=2, fence=7)
    assert (contract.model.name, contract.agent.name) == ("pool", "dev")
    assert (contract.run.triggered_by, contract.run.work_item_ref) == ("alice@example.com", "PAY-9")
    assert contract.inputs == {"task": "fix it", "branch": "main"}
    assert (contract.run.attempt, contract.run.fence) == (2, 7)
    with pytest.raises(NotInWarrant):
        warrant.contract(RouteChoice(agent_index=2), attempt=1, fence=1)
    with pytest.raises(NotInWarrant, match="no fallback model"):
        warrant.contract(RouteChoice(agent_index=1, model="fallback"), attempt=1, fence=1)
