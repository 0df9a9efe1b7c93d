"""The ksquad.io resources other than Run (whose spec and status live in `workflows`): their specs, as
pydantic models. The CRDs are generated from these (crd_bridge.crds), so the schema kubectl enforces and
the one the bridge reads are the same."""

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from workflows.contract import CardKeys
from workflows.model import KsquadModel
from workflows.spec import K8sName, Placement

# The plural (URL) name of each kind.
PLURALS = {
    "Run": "runs",
    "Agent": "agents",
    "ModelEndpoint": "modelendpoints",
    "Tool": "tools",
    "MCPServer": "mcpservers",
    "Skill": "skills",
    "Team": "teams",
    "Project": "projects",
}
# Annotations on a Run that the bridge acts on.
CANCEL_ANNOTATION = "ksquad.io/cancel-requested"  # the `cancel` signal, with its value as the reason
PAUSE_ANNOTATION = "ksquad.io/pause-requested"  # set: the `pause` signal; removed: `resume`
# The `input` signal's text: held until the Run waits for input (Paused, InputRequired), sent once, then removed.
INPUT_ANNOTATION = "ksquad.io/input"
TRIGGERED_BY_ANNOTATION = "ksquad.io/triggered-by"  # stamped at admission, immutable
# The creator's groups, comma-separated, stamped with it (the work item's RBAC may grant them by group).
TRIGGERED_BY_GROUPS_ANNOTATION = "ksquad.io/triggered-by-groups"

Url = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=r"^https?://")]


class SecretKeyRef(KsquadModel):
    """A key of a Secret in the same namespace, labelled ksquad.io/credential=true: referenced, never copied."""

    name: K8sName
    """The Secret's name."""
    # A Secret's data key, never a path: no "/" and no leading "." (a warm pod and an endpoint agent read it as
    # a file under the Secret's mount, where "../" would reach other files).
    key: Annotated[
        str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-_a-zA-Z0-9][-._a-zA-Z0-9]*$")
    ] = "apiKey"
    """The key within the Secret that holds the value (letters, digits, '-', '_' and '.', not first)."""


class FallbackModel(KsquadModel):
    """The model an agent switches to on a rate limit before pausing."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    """The fallback model's name."""
    model_endpoint_ref: K8sName | None = None
    """Its ModelEndpoint; empty: the agent's own."""


class AgentSpec(KsquadModel):
    """An agent a Run may run on: its model, prompt, tools and skills, and where it runs."""

    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    """The model name, over the ModelEndpoint's (a Run's spec.model wins over both)."""
    model_endpoint_ref: K8sName | None = None
    """The ModelEndpoint of this namespace it calls (a Run's spec.modelEndpointRef wins)."""
    fallback_model: FallbackModel | None = None
    """The model to switch to on a rate limit, before pausing."""
    system_prompt: Annotated[str, StringConstraints(max_length=64 * 1024)] = ""
    """The agent's instructions (given to the sandbox in the first A2A message, never in a Job's spec)."""
    tools: list[K8sName] = Field(default_factory=list, max_length=64)
    """Tools of this namespace the agent uses; each must be in allowedTools."""
    allowed_tools: list[K8sName] = Field(default_factory=list, max_length=64)
    """The only tools the agent may use: its tools' and its skills' tools outside it make a Run invalid."""
    skill_refs: list[K8sName] = Field(default_factory=list, max_length=32)
    """Skills of this namespace: instructions, tools and requirements (toolchains, sidecars) added to the agent."""
    credential_secret_ref: SecretKeyRef | None = None
    """The model's credential, over the ModelEndpoint's."""
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = None
    """The sandbox image; empty: the chart's agent image. Only images in the chart's sandbox.allowedImages."""
    endpoint: Url | None = None
    """An already-running A2A agent's URL: no sandbox is made. Only where the chart's agents.allowedEndpoints
    allows it."""
    contract_in: Literal["dataPart", "metadata"] = "dataPart"
    """Where the execution contract travels in the task's first message: a data part `ksquad.io/contract` (what the
    reference agent reads), or the message's metadata under that key, for an agent that refuses data parts (the
    task and inputs are in the message's text either way)."""
    card_keys: CardKeys | None = None
    """The public keys (a JWKS: {keys: [...]}) the agent's card must be signed with (A2A's signed Agent Cards):
    the worker verifies the card before it sends a task and refuses an unsigned or wrongly signed one."""
    placement: Placement | None = None
    """Where its sandboxes run: ServiceAccount, node selector, tolerations, affinity, resources (GPUs included),
    priority class. A Run's spec.placement overrides it field by field."""


class ModelEndpointSpec(KsquadModel):
    """An OpenAI-compatible model API, its default model and its credential."""

    url: Url
    """The OpenAI-compatible base URL (https://api.openai.com/v1, a vLLM server...)."""
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    """The default model name, for agents that name none."""
    provider: Annotated[str, StringConstraints(max_length=64)] | None = None
    """The provider's name, for people reading it (openai, anthropic, vllm...)."""
    credential_secret_ref: SecretKeyRef | None = None
    """The API key's Secret; one credential is one rate-limit throttle, shared by every run on it."""
    resume_per_second: Annotated[float, Field(gt=0, le=10000)] | None = None
    """After a rate limit, paused runs on this credential resume at most this many per second (a ramp, not a
    stampede at resumeAt). Default 10."""


class ToolResourceSpec(KsquadModel):
    """One tool of an MCP server, as agents name it."""

    mcp_server_ref: K8sName
    """The MCPServer of this namespace that serves it."""
    tool_name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    """The tool's name on that server."""
    description: Annotated[str, StringConstraints(max_length=4096)] = ""
    """What the tool does, for the model."""


class MCPServerSpec(KsquadModel):
    """A Model Context Protocol server the sandboxes' agents call for tools."""

    url: Url
    """The server's URL."""
    transport: Literal["streamable-http", "sse"] = "streamable-http"
    """The MCP transport at that URL: `streamable-http`, or `sse`, MCP's older HTTP+SSE transport (what
    `mcp-proxy` serves a stdio server on at /sse, beside streamable HTTP at /mcp)."""


class SkillRequirements(KsquadModel):
    """What a skill needs in its sandbox (a skill with requirements always runs cold)."""

    toolchains: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(
        default_factory=list
    )
    """Toolchains the chart's sandbox.toolchains stage into /opt/ksquad/toolchains/<name> by init containers."""
    sidecars: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(
        default_factory=list
    )
    """Sidecars from the chart's sandbox.sidecars, run beside the agent."""


class SkillSpec(KsquadModel):
    """Instructions and tools an agent gains by naming the skill."""

    description: Annotated[str, StringConstraints(max_length=4096)] = ""
    """What the skill is for."""
    instructions: Annotated[str, StringConstraints(max_length=64 * 1024)] = ""
    """Added to the agent's instructions."""
    tool_refs: list[K8sName] = Field(default_factory=list)
    """Tools the skill uses; each must be in the agent's allowedTools."""
    requires: SkillRequirements = Field(default_factory=SkillRequirements)


class TeamSpec(KsquadModel):
    """Agents that work together, and how many of their runs may be past Queued at once."""

    agents: list[K8sName] = Field(default_factory=list, max_length=64)
    """The agents of a Run that names the Team and no agents, in preference order."""
    max_concurrent_runs: int | None = Field(default=None, ge=1, le=100_000)
    """Runs naming the Team past Queued at once; the others wait, in order. Empty: no limit."""
    token_budget: int | None = Field(default=None, ge=1, le=10**12)
    """The token budget of each Run naming the Team that sets none itself (the Run's spec.tokenBudget)."""
    weight: float = Field(default=1.0, ge=1, le=100)
    """The Team's share against the namespace's other Teams where their runs wait together: the ramp after a
    shared credential's rate limit, and the namespace's and a Project's queue. A Team of weight 2 gets two turns
    to a weight-1 Team's one while both have runs waiting; runs naming no Team count as one Team of weight 1."""


class ProjectSpec(KsquadModel):
    """A body of work: how many of its runs may be past Queued at once, and the model they fall back to."""

    max_concurrent_runs: int | None = Field(default=None, ge=1, le=100_000)
    """Runs naming the Project past Queued at once; the others wait, in order. Empty: no limit."""
    fallback_model: FallbackModel | None = None
    """The model a Run naming the Project switches to on a rate limit after its Agent's own fallbackModel (or
    first, for an Agent without one), when its credential is not limited too; then the run pauses as usual. Its
    modelEndpointRef empty: the agent's own ModelEndpoint."""
