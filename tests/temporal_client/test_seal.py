"""The bridge's seal on a resolved agent: the worker uses a model only if it is one the bridge resolved (the agent's,
its fallback, its Project's fallback), and a resolution sealed before a field was added keeps its seal."""

import json
import secrets

import pytest

from temporal_client.seal import Sealer, Unsealed
from workflows.contract import CredentialRef, ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import Placement


def model(name: str, secret: str = "key") -> ModelRef:
    return ModelRef(name=name, url="https://api.example/v1", credential=CredentialRef(secret_name=secret))


def contract(agent: ResolvedAgent, now: ModelRef) -> ExecutionContract:
    run = RunIdentity(namespace="team-a", name="r", uid="uid-r", attempt=1, fence=1)
    return ExecutionContract(run=run, agent=agent, model=now)


def test_the_projects_fallback_is_a_resolved_model_and_a_forged_one_is_not() -> None:
    sealer = Sealer(secrets.token_bytes(32))
    agent = ResolvedAgent(name="dev", model=model("m"), project_fallback_model=model("pool", "pool-key"))
    sealed = sealer.seal_agent("team-a", "uid-r", agent)
    sealer.check_contract(contract(sealed, model("pool", "pool-key")))
    with pytest.raises(Unsealed, match="neither agent dev's model nor a fallback"):
        sealer.check_contract(contract(sealed, model("pool", "someone-elses-key")))
    forged = sealed.model_copy(update={"project_fallback_model": model("pool", "someone-elses-key")})
    with pytest.raises(Unsealed, match="its seal is wrong"):
        sealer.check_contract(contract(forged, model("pool", "someone-elses-key")))


def test_an_agent_sealed_before_the_projects_fallback_and_placement_existed_keeps_its_seal() -> None:
    """A run in flight across an upgrade carries a resolution sealed by the older bridge."""
    sealer = Sealer(secrets.token_bytes(32))
    agent = ResolvedAgent(name="dev", model=model("m"))
    older = agent.model_dump(mode="json", exclude={"seal", "project_fallback_model", "placement"})
    older_seal = sealer._mac(
        "agent-v1", "team-a", "uid-r", json.dumps(older, sort_keys=True, separators=(",", ":"))
    )
    sealer.check_contract(contract(agent.model_copy(update={"seal": older_seal}), model("m")))


def test_a_placement_is_sealed_with_its_agent_and_one_added_or_changed_is_refused() -> None:
    """A client of the Temporal frontend cannot give a sandbox a ServiceAccount or node the bridge never resolved."""
    sealer = Sealer(secrets.token_bytes(32))
    placement = Placement(service_account_name="gpu-runner", node_selector={"ksquad.io/pool": "gpu"})
    sealed = sealer.seal_agent(
        "team-a", "uid-r", ResolvedAgent(name="dev", model=model("m"), placement=placement)
    )
    sealer.check_contract(contract(sealed, model("m")))
    for forged in (
        placement.model_copy(update={"service_account_name": "ksquad-worker"}),
        placement.model_copy(update={"node_selector": {"node-role.kubernetes.io/control-plane": ""}}),
        None,
    ):
        with pytest.raises(Unsealed, match="its seal is wrong"):
            sealer.check_contract(contract(sealed.model_copy(update={"placement": forged}), model("m")))
    plain = sealer.seal_agent("team-a", "uid-r", ResolvedAgent(name="dev", model=model("m")))
    with pytest.raises(Unsealed, match="its seal is wrong"):
        sealer.check_contract(contract(plain.model_copy(update={"placement": placement}), model("m")))
