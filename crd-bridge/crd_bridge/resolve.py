"""Reference resolution: a Run's spec and the objects it names become the agents it may run on.

Rules (DESIGN.md "Resources"):
- eligible agents are `spec.agents` in order, or the Team's agents when that list is empty;
- run-level overrides beat the Agent's defaults: the model name is Run.model, else Agent.model, else the
  ModelEndpoint's model; the endpoint is Run.modelEndpointRef, else Agent.modelEndpointRef;
- the model's credential is the Agent's own (`credentialSecretRef`), else the ModelEndpoint's: referenced,
  never read;
- every tool the agent would use (its tools and its skills' toolRefs) must be in its allowedTools;
- references resolve only inside the Run's namespace (a namespace is a tenant);
- a missing object is named ("Agent payments/dev-1"); the run waits for it. An object that can never work
  (an invalid spec, a tool outside allowedTools) makes the Run invalid, with the reason.

The same function serves the bridge (objects from the API server) and the embedded default (objects from
the applied files): only `Lookup` differs.
"""

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from crd_bridge.resources import (
    AgentSpec,
    MCPServerSpec,
    ModelEndpointSpec,
    ProjectSpec,
    SecretKeyRef,
    SkillSpec,
    TeamSpec,
    ToolResourceSpec,
)
from workflows.contract import (
    ConcurrencyScope,
    CredentialRef,
    MCPServerRef,
    ModelRef,
    Resolution,
    ResolvedAgent,
    SkillRequirements,
    ToolSpec,
)
from workflows.contract import SkillSpec as ContractSkill
from workflows.model import field_problems
from workflows.spec import RunSpec

# (kind, name) -> the object's spec as a dict, or None when it does not exist (in the Run's namespace)
Lookup = Callable[[str, str], Awaitable[dict[str, Any] | None]]
M = TypeVar("M", bound=BaseModel)

KINDS: dict[str, type[BaseModel]] = {
    "Agent": AgentSpec, "ModelEndpoint": ModelEndpointSpec, "Tool": ToolResourceSpec, "MCPServer": MCPServerSpec,
    "Skill": SkillSpec, "Team": TeamSpec, "Project": ProjectSpec,
}  # fmt: skip


class Invalid(Exception):
    pass


class Resolver:
    def __init__(self, namespace: str, lookup: Lookup, namespace_limit: int | None = None) -> None:
        self.namespace = namespace
        self.lookup = lookup
        self.namespace_limit = namespace_limit
        self.missing: list[str] = []

    async def get(self, kind: str, name: str, model: type[M]) -> M | None:
        data = await self.lookup(kind, name)
        if data is None:
            label = f"{kind} {self.namespace}/{name}"
            if label not in self.missing:
                self.missing.append(label)
            return None
        try:
            return model.model_validate(data)
        except ValidationError as err:
            problems = "; ".join(field_problems(err, "spec"))
            raise Invalid(f"{kind} {self.namespace}/{name} is invalid: {problems}") from None

    async def resolve(self, spec: RunSpec) -> Resolution:
        try:
            resolution = await self._resolve(spec)
        except Invalid as err:
            return Resolution(outcome="invalid", error=str(err))
        if self.missing:
            return Resolution(outcome="missing", missing=self.missing)
        return resolution

    async def _resolve(self, spec: RunSpec) -> Resolution:
        scopes = []
        if self.namespace_limit:
            scopes.append(ConcurrencyScope(key=f"namespace/{self.namespace}", limit=self.namespace_limit))
        team = await self.get("Team", spec.team_ref, TeamSpec) if spec.team_ref else None
        if team and team.max_concurrent_runs:
            scopes.append(
                ConcurrencyScope(key=f"team/{self.namespace}/{spec.team_ref}", limit=team.max_concurrent_runs)
            )
        project = await self.get("Project", spec.project_ref, ProjectSpec) if spec.project_ref else None
        if project and project.max_concurrent_runs:
            scopes.append(ConcurrencyScope(key=f"project/{self.namespace}/{spec.project_ref}",
                                           limit=project.max_concurrent_runs))  # fmt: skip
        names = spec.agents or (team.agents if team else [])
        if not names and team is not None:
            raise Invalid(f"the Run names no agents and Team {self.namespace}/{spec.team_ref} has none")
        agents = []
        for name in names:
            agent = await self._agent(name, spec)
            if agent is not None:
                agents.append(agent)
        return Resolution(outcome="resolved", agents=agents, scopes=scopes)

    async def _agent(self, name: str, spec: RunSpec) -> ResolvedAgent | None:
        agent = await self.get("Agent", name, AgentSpec)
        if agent is None:
            return None
        endpoint_ref = spec.model_endpoint_ref or agent.model_endpoint_ref
        endpoint = await self.get("ModelEndpoint", endpoint_ref, ModelEndpointSpec) if endpoint_ref else None
        if endpoint_ref is None and agent.endpoint is None:
            raise Invalid(f"Agent {self.namespace}/{name} has no modelEndpointRef (and the Run names none)")
        model_name = spec.model or agent.model or (endpoint.model if endpoint else None)
        if model_name is None and agent.endpoint is None:
            raise Invalid(f"no model for Agent {self.namespace}/{name}: set spec.model on the Run, the Agent or "
                          f"ModelEndpoint {self.namespace}/{endpoint_ref}")  # fmt: skip
        model = _model(model_name or "default", endpoint_ref, endpoint, agent.credential_secret_ref)
        fallback = None
        if agent.fallback_model is not None:
            fb_ref = agent.fallback_model.model_endpoint_ref or endpoint_ref
            fb_endpoint = (
                endpoint
                if fb_ref == endpoint_ref
                else await self.get("ModelEndpoint", fb_ref or "", ModelEndpointSpec)
            )
            fallback = _model(agent.fallback_model.model, fb_ref, fb_endpoint, agent.credential_secret_ref)
        skills = []
        for skill_name in agent.skill_refs:
            skill = await self.get("Skill", skill_name, SkillSpec)
            if skill is not None:
                skills.append(ContractSkill(name=skill_name, description=skill.description,
                                            instructions=skill.instructions, tool_refs=skill.tool_refs,
                                            requires=SkillRequirements(**skill.requires.model_dump())))  # fmt: skip
        wanted = list(dict.fromkeys([*agent.tools, *(t for s in skills for t in s.tool_refs)]))
        outside = [t for t in wanted if t not in agent.allowed_tools]
        if outside:
            raise Invalid(f"Agent {self.namespace}/{name} uses tool(s) {', '.join(outside)} outside its allowedTools "
                          f"({', '.join(agent.allowed_tools) or 'none'})")  # fmt: skip
        tools = []
        for tool_name in wanted:
            tool = await self.get("Tool", tool_name, ToolResourceSpec)
            if tool is None:
                continue
            server = await self.get("MCPServer", tool.mcp_server_ref, MCPServerSpec)
            if server is not None:
                tools.append(ToolSpec(name=tool_name, tool_name=tool.tool_name, description=tool.description,
                                      mcp_server=MCPServerRef(name=tool.mcp_server_ref, url=server.url,
                                                              transport=server.transport)))  # fmt: skip
        return ResolvedAgent(
            name=name, model=model, fallback_model=fallback, system_prompt=agent.system_prompt, image=agent.image,
            endpoint=agent.endpoint, tools=tools, allowed_tools=agent.allowed_tools, skills=skills,
            credential=_credential(agent.credential_secret_ref),
        )  # fmt: skip


def _credential(ref: SecretKeyRef | None) -> CredentialRef | None:
    return CredentialRef(secret_name=ref.name, key=ref.key) if ref else None


def _model(name: str, endpoint_ref: str | None, endpoint: ModelEndpointSpec | None,
           agent_credential: SecretKeyRef | None) -> ModelRef:  # fmt: skip
    credential = _credential(agent_credential) or _credential(
        endpoint.credential_secret_ref if endpoint else None
    )
    return ModelRef(name=name, url=endpoint.url if endpoint else None, provider=endpoint.provider if endpoint else None,
                    endpoint_ref=endpoint_ref, credential=credential,
                    resume_per_second=endpoint.resume_per_second if endpoint else None)  # fmt: skip


async def resolve(
    namespace: str, spec: RunSpec, lookup: Lookup, namespace_limit: int | None = None
) -> Resolution:
    return await Resolver(namespace, lookup, namespace_limit).resolve(spec)
