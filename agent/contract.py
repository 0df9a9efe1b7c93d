"""The agent's view of the ExecutionContract (`apiVersion: ksquad.io/contract-v1`).

The agent is a separate image that speaks only A2A, so it does not import ksquad's workflow types: it reads
the fields it needs and ignores the rest, which lets the orchestrator add fields without breaking deployed
agents. tests/agent/test_contract.py checks that it reads what the orchestrator writes.
"""

import json
import os
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

CONTRACT_ENV = "KSQUAD_EXECUTION_CONTRACT"
SUPPORTED_API_VERSIONS = ("ksquad.io/contract-v1",)
# Kubernetes' own rules: a Secret's name is a DNS subdomain, a key is [-._a-zA-Z0-9]+ and neither `.` nor `..`.
# Both become parts of a file path (agent.credentials), so anything else is refused.
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")


def secret_name_problem(name: str) -> str | None:
    if len(name) > 253 or not _SECRET_NAME.match(name):
        return f"credential Secret name {name!r} is not a Secret name (a DNS subdomain)"
    return None


def secret_key_problem(key: str) -> str | None:
    if len(key) > 253 or not _SECRET_KEY.match(key) or key.startswith(".."):
        return f"credential key {key!r} is not a plain file name ([-._a-zA-Z0-9], no `/`, no `..`)"
    return None


class _Read(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="ignore"
    )


class Credential(_Read):
    secret_name: str
    key: str = "apiKey"
    env: str = ""  # where a cold sandbox gets the value
    allowed_hosts: list[str] = Field(default_factory=list)  # where its value may go (agent.credentials)

    @field_validator("secret_name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        problem = secret_name_problem(name)
        if problem:
            raise ValueError(problem)
        return name

    @field_validator("key")
    @classmethod
    def _plain_key(cls, key: str) -> str:
        problem = secret_key_problem(key)
        if problem:
            raise ValueError(problem)
        return key


class Model(_Read):
    name: str
    url: str | None = None
    credential: Credential | None = None


class MCPServer(_Read):
    name: str
    url: str
    transport: str = "streamable-http"


class Tool(_Read):
    name: str
    tool_name: str
    description: str = ""
    mcp_server: MCPServer | None = None


class Skill(_Read):
    name: str
    description: str = ""
    instructions: str = ""


class Agent(_Read):
    name: str
    system_prompt: str = ""
    tools: list[Tool] = Field(default_factory=list)
    allowed_tools: list[str] = Field(default_factory=list)
    skills: list[Skill] = Field(default_factory=list)
    fallback_model: Model | None = None
    project_fallback_model: Model | None = None


class Run(_Read):
    namespace: str
    name: str
    uid: str
    attempt: int
    fence: int
    work_item_ref: str | None = None


class WorkItemAccess(_Read):
    """Where this attempt reaches its Run's work item (the items API of docs/agent-contract.md) and the token that
    lets it read and write that item alone, while its claim's fence is current. Never logged."""

    url: (
        str  # the API's base URL: GET {url}/items/{namespace}/{id}, .../entries, POST .../comments, .../state
    )
    namespace: str
    id: str
    token: str = Field(repr=False)
    # PEM: the one CA to trust for `url` (the chart's, for ksquad-api's listener for sandboxes); none: the image's
    # own trust store (and plain http only as the operator configured it, as on the embedded stack).
    ca: str | None = Field(default=None, repr=False)


class AttemptApi(_Read):
    """Where this attempt reaches ksquad itself, with the attempt's token: its checkpoints (api.attempts), asked
    before each model call, and its Team's and Project's memories (api.memory). Never logged."""

    url: str
    token: str = Field(repr=False)
    ca: str | None = Field(default=None, repr=False)  # as WorkItemAccess.ca
    memory: list[str] = Field(default_factory=list)  # its squad's memories: "teams/<name>", "projects/<name>"


class Contract(_Read):
    api_version: str
    run: Run
    inputs: dict[str, str] = Field(default_factory=dict)
    agent: Agent
    model: Model
    work_item: WorkItemAccess | None = None  # a Run whose workItemRef names an item; none for an opaque ref
    attempt_api: AttemptApi | None = None  # none: no checkpoints (an orchestrator without ksquad-api's URL)
    token_budget: int | None = None  # model tokens this task may use (the Run's budget left); none: no bound

    def offered_tools(self) -> list[Tool]:
        """The tools the model may call: only those in allowedTools (none when the list is empty)."""
        allowed = set(self.agent.allowed_tools)
        return [t for t in self.agent.tools if t.name in allowed or t.tool_name in allowed]


class ContractError(ValueError):
    pass


def parse_contract(data: Any) -> Contract:
    if isinstance(data, str | bytes):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise ContractError(f"the execution contract is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ContractError("the execution contract must be a JSON object")
    version = data.get("apiVersion")
    if version not in SUPPORTED_API_VERSIONS:
        raise ContractError(
            f"unsupported contract apiVersion {version!r}; this agent reads {SUPPORTED_API_VERSIONS}"
        )
    try:
        return Contract.model_validate(data)
    except ValueError as err:
        raise ContractError(f"invalid execution contract: {err}") from None


def contract_from_env() -> Contract | None:
    raw = os.environ.get(CONTRACT_ENV)
    return parse_contract(raw) if raw else None


def build_prompt(contract: Contract) -> list[dict[str, str]]:
    """The conversation's opening: the system prompt with each skill's instructions, then the inputs."""
    system = contract.agent.system_prompt.strip()
    for skill in contract.agent.skills:
        if skill.instructions.strip():
            system += f"\n\n## Skill: {skill.name}\n{skill.instructions.strip()}"
    task = contract.inputs.get("task", "")
    others = {k: v for k, v in contract.inputs.items() if k != "task"}
    user = task
    if others:
        user += "\n\nInputs:\n" + "\n".join(f"- {k}: {v}" for k, v in sorted(others.items()))
    messages = [{"role": "system", "content": system}] if system else []
    return [*messages, {"role": "user", "content": user.strip() or "Carry out the task."}]
