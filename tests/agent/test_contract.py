"""The agent reads the contract the orchestrator writes, offers only allowed tools, and builds its prompt."""

import pytest

from agent.contract import ContractError, build_prompt, parse_contract
from workflows.contract import (
    CredentialRef,
    ExecutionContract,
    MCPServerRef,
    ModelRef,
    ResolvedAgent,
    RunIdentity,
    SkillSpec,
    ToolSpec,
)


def orchestrator_contract() -> ExecutionContract:
    tools = [
        ToolSpec(
            name="notes",
            tool_name="add_note",
            mcp_server=MCPServerRef(name="kb", url="http://127.0.0.1:1/mcp"),
        ),
        ToolSpec(
            name="shell",
            tool_name="run_shell",
            mcp_server=MCPServerRef(name="box", url="http://127.0.0.1:2/mcp"),
        ),
    ]
    agent = ResolvedAgent(
        name="dev-1",
        model=ModelRef(name="gpt-x", url="http://127.0.0.1:3/v1", credential=CredentialRef(secret_name="k")),
        system_prompt="You fix flaky tests.",
        tools=tools,
        allowed_tools=["notes"],
        skills=[SkillSpec(name="pytest", instructions="Run the tests three times.")],
    )
    return ExecutionContract(
        run=RunIdentity(namespace="ns", name="r", uid="uid-1", attempt=2, fence=7, work_item_ref="wi-1"),
        inputs={"task": "Stabilize the flaky payment-retry test.", "repo": "payments"},
        agent=agent,
        model=agent.model,
    )


def test_the_agent_reads_what_the_orchestrator_writes() -> None:
    contract = parse_contract(orchestrator_contract().model_dump_json())
    assert (contract.run.uid, contract.run.attempt, contract.run.fence) == ("uid-1", 2, 7)
    assert contract.model.name == "gpt-x"
    assert contract.model.credential is not None
    assert contract.model.credential.secret_name == "k"


def test_only_allowed_tools_are_offered() -> None:
    contract = parse_contract(orchestrator_contract().model_dump(mode="json"))
    assert [t.tool_name for t in contract.offered_tools()] == ["add_note"]


def test_prompt_has_system_prompt_skill_instructions_and_inputs() -> None:
    system, user = build_prompt(parse_contract(orchestrator_contract().model_dump(mode="json")))
    assert system["content"].startswith("You fix flaky tests.")
    assert "## Skill: pytest\nRun the tests three times." in system["content"]
    assert user["content"] == "Stabilize the flaky payment-retry test.\n\nInputs:\n- repo: payments"


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("{not json", "not JSON"),
        ("[]", "JSON object"),
        ('{"apiVersion": "ksquad.io/contract-v9"}', "unsupported"),
        ('{"apiVersion": "ksquad.io/contract-v1"}', "invalid execution contract"),
    ],
)
def test_bad_contracts_are_refused_with_a_reason(raw: str, words: str) -> None:
    with pytest.raises(ContractError, match=words):
        parse_contract(raw)
