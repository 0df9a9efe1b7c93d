"""The ksquad.io resources other than Run (whose spec and status live in `workflows`): their specs, as
pydantic models. The CRDs are generated from these (crd_bridge.crds), so the schema kubectl enforces and
the one the bridge reads are the same."""

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from workflows.model import KsquadModel
from workflows.spec import K8sName

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
TRIGGERED_BY_ANNOTATION = "ksquad.io/triggered-by"  # stamped at admission, immutable

Url = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=r"^https?://")]


class SecretKeyRef(KsquadModel):
    """A key of a Secret in the same namespace: referenced, never copied."""

    name: K8sName
    key: Annotated[str, StringConstraints(min_length=1, max_length=253)] = "apiKey"


class FallbackModel(KsquadModel):
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    model_endpoint_ref: K8sName | None = None


class AgentSpec(KsquadModel):
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    model_endpoint_ref: K8sName | None = None
    fallback_model: FallbackModel | None = None
    system_prompt: Annotated[str, StringConstraints(max_length=64 * 1024)] = ""
    tools: list[K8sName] = Field(default_factory=list, max_length=64)
    allowed_tools: list[K8sName] = Field(default_factory=list, max_length=64)
    skill_refs: list[K8sName] = Field(default_factory=list, max_length=32)
    credential_secret_ref: SecretKeyRef | None = None
    # Default: the chart's values.
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = None
    endpoint: Url | None = None  # an already-running A2A agent: no sandbox is made


class ModelEndpointSpec(KsquadModel):
    url: Url  # an OpenAI-compatible base URL
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    provider: Annotated[str, StringConstraints(max_length=64)] | None = None
    credential_secret_ref: SecretKeyRef | None = None
    # After a rate limit, paused runs on this credential resume at most this many per second (a ramp, not a
    # stampede at resumeAt). Default: workflows.entity_types.DEFAULT_RESUME_PER_SECOND.
    resume_per_second: Annotated[float, Field(gt=0, le=10000)] | None = None


class ToolResourceSpec(KsquadModel):
    mcp_server_ref: K8sName
    tool_name: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    description: Annotated[str, StringConstraints(max_length=4096)] = ""


class MCPServerSpec(KsquadModel):
    url: Url
    transport: Literal["streamable-http", "sse"] = "streamable-http"


class SkillRequirements(KsquadModel):
    toolchains: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(
        default_factory=list
    )
    sidecars: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]] = Field(
        default_factory=list
    )


class SkillSpec(KsquadModel):
    description: Annotated[str, StringConstraints(max_length=4096)] = ""
    instructions: Annotated[str, StringConstraints(max_length=64 * 1024)] = ""
    tool_refs: list[K8sName] = Field(default_factory=list)
    requires: SkillRequirements = Field(default_factory=SkillRequirements)


class TeamSpec(KsquadModel):
    agents: list[K8sName] = Field(default_factory=list, max_length=64)
    max_concurrent_runs: int | None = Field(default=None, ge=1, le=100_000)


class ProjectSpec(KsquadModel):
    max_concurrent_runs: int | None = Field(default=None, ge=1, le=100_000)
