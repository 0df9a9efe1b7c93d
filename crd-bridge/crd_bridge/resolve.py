"""Reference resolution: a Run's spec and the objects it names become the agents it may run on.

Rules (DESIGN.md "Resources"):
- eligible agents are `spec.agents` in order, or the Team's agents when that list is empty;
- run-level overrides beat the Agent's defaults: the model name is Run.model, else Agent.model, else the
  ModelEndpoint's model; the endpoint is Run.modelEndpointRef, else Agent.modelEndpointRef;
- the model's credential is the Agent's own (`credentialSecretRef`), else the ModelEndpoint's: referenced,
  never read;
- every tool the agent would use (its tools and its skills' toolRefs) must be in its allowedTools;
- references resolve only inside the Run's namespace (a namespace is a tenant);
- a credential is a Secret labelled `ksquad.io/credential=true` (only its labels and annotations are read);
  another Secret makes the Run invalid, naming the label;
- a credential goes only where its Secret's owner sent it: the annotation `ksquad.io/allowed-hosts` lists the
  hosts (host, host:port or CIDR) its value may be sent to; a model URL elsewhere makes the Run invalid, naming
  the host and the annotation. The hosts travel with the credential's reference, so the agent refuses too;
- what the chart allows (AllowLists): sandbox images, runtime classes, hosts or CIDRs of Agent endpoints;
- a missing object is named ("Agent payments/dev-1"); the run waits for it. An object that can never work
  (an invalid spec, a tool outside allowedTools, something the chart does not allow) makes the Run invalid, with
  the reason.

The same function serves the bridge (objects from the API server) and the embedded default (objects from
the applied files): only `Lookup` differs.
"""

import ipaddress
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ValidationError

from crd_bridge.resources import (
    AgentSpec,
    FallbackModel,
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
    FairShare,
    MCPServerRef,
    ModelRef,
    Resolution,
    ResolvedAgent,
    SkillRequirements,
    ToolSpec,
)
from workflows.contract import SkillSpec as ContractSkill
from workflows.model import InvalidObject, field_problems
from workflows.spec import Placement, RunSpec, parse_run_spec

# (kind, name) -> the object's spec as a dict, or None when it does not exist (in the Run's namespace); for kind
# "Secret", {"labels": {...}, "annotations": {...}}: nothing else of a Secret is ever read
Lookup = Callable[[str, str], Awaitable[dict[str, Any] | None]]
CREDENTIAL_LABEL = "ksquad.io/credential"
ALLOWED_HOSTS_ANNOTATION = "ksquad.io/allowed-hosts"
DEFAULT_PORTS = {"http": 80, "https": 443}


def host_allowed(url: str, allowed: Iterable[str]) -> bool:
    """Whether `url` goes to one of `allowed`: a host name or address (any port), host:port, or a CIDR."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return False
    try:
        port = parts.port or DEFAULT_PORTS.get(parts.scheme)
    except ValueError:  # a port out of range
        return False
    for entry in (e.strip().lower() for e in allowed):
        if "/" in entry:
            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
        elif entry in (host, f"{host}:{port}", f"[{host}]", f"[{host}]:{port}"):
            return True
    return False


def allowed_hosts(annotations: dict[str, str] | None) -> list[str]:
    return [h.strip() for h in (annotations or {}).get(ALLOWED_HOSTS_ANNOTATION, "").split(",") if h.strip()]


M = TypeVar("M", bound=BaseModel)

KINDS: dict[str, type[BaseModel]] = {
    "Agent": AgentSpec,
    "ModelEndpoint": ModelEndpointSpec,
    "Tool": ToolResourceSpec,
    "MCPServer": MCPServerSpec,
    "Skill": SkillSpec,
    "Team": TeamSpec,
    "Project": ProjectSpec,
}


class Invalid(Exception):
    pass


@dataclass(frozen=True)
class AllowLists:
    """What Runs and Agents may ask for (the chart's values; None: anything)."""

    # Agent.spec.image (chart value sandbox.allowedImages)
    images: frozenset[str] | None = None
    # Run.spec.sandboxPolicy.runtimeClass (sandbox.allowedRuntimeClasses)
    runtime_classes: frozenset[str] | None = None
    # Agent.spec.endpoint: hosts, host:port or CIDRs (agents.allowedEndpoints)
    endpoints: frozenset[str] | None = None
    # placement.serviceAccountName (sandbox.allowedServiceAccounts) and priorityClassName
    # (sandbox.allowedPriorityClasses); None: anything
    service_accounts: frozenset[str] | None = None
    priority_classes: frozenset[str] | None = None
    # placement.tolerations[].key (sandbox.allowedTolerations); a key-less toleration never, with a list
    toleration_keys: frozenset[str] | None = None

    def endpoint_allowed(self, url: str) -> bool:
        return self.endpoints is None or host_allowed(url, self.endpoints)


ANYTHING = AllowLists()


class Resolver:
    def __init__(
        self, namespace: str, lookup: Lookup, namespace_limit: int | None = None, allow: AllowLists = ANYTHING
    ) -> None:
        self.namespace = namespace
        self.lookup = lookup
        self.namespace_limit = namespace_limit
        self.allow = allow
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
        runtime_class = spec.sandbox_policy.runtime_class
        if self.allow.runtime_classes is not None and runtime_class not in self.allow.runtime_classes:
            raise Invalid(
                f"spec.sandboxPolicy.runtimeClass {runtime_class} is not allowed here (chart value "
                f"sandbox.allowedRuntimeClasses: {', '.join(sorted(self.allow.runtime_classes))})"
            )
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
            scopes.append(
                ConcurrencyScope(
                    key=f"project/{self.namespace}/{spec.project_ref}", limit=project.max_concurrent_runs
                )
            )
        names = spec.agents or (team.agents if team else [])
        if not names and team is not None:
            raise Invalid(f"the Run names no agents and Team {self.namespace}/{spec.team_ref} has none")
        agents = []
        for name in names:
            agent = await self._agent(name, spec, project)
            if agent is not None:
                agents.append(agent)
        return Resolution(
            outcome="resolved",
            agents=agents,
            scopes=scopes,
            token_budget=team.token_budget if team else None,
            share=FairShare(tenant=f"team/{spec.team_ref}", weight=team.weight) if team else FairShare(),
        )

    async def _agent(
        self, name: str, spec: RunSpec, project: ProjectSpec | None = None
    ) -> ResolvedAgent | None:
        agent = await self.get("Agent", name, AgentSpec)
        if agent is None:
            return None
        if agent.image and self.allow.images is not None and agent.image not in self.allow.images:
            raise Invalid(
                f"Agent {self.namespace}/{name}: image {agent.image} is not allowed here (chart value "
                f"sandbox.allowedImages: {', '.join(sorted(self.allow.images))})"
            )
        if agent.endpoint and not self.allow.endpoint_allowed(str(agent.endpoint)):
            raise Invalid(
                f"Agent {self.namespace}/{name}: endpoint {agent.endpoint} is not allowed here (chart "
                f"value agents.allowedEndpoints: {', '.join(sorted(self.allow.endpoints or [])) or 'none'})"
            )
        endpoint_ref = spec.model_endpoint_ref or agent.model_endpoint_ref
        endpoint = await self.get("ModelEndpoint", endpoint_ref, ModelEndpointSpec) if endpoint_ref else None
        if endpoint_ref is None and agent.endpoint is None:
            raise Invalid(f"Agent {self.namespace}/{name} has no modelEndpointRef (and the Run names none)")
        if endpoint_ref is not None and endpoint is None:
            return None  # named as missing and waited for: its model may come with it
        model_name = spec.model or agent.model or (endpoint.model if endpoint else None)
        if model_name is None and agent.endpoint is None:
            raise Invalid(
                f"no model for Agent {self.namespace}/{name}: set spec.model on the Run, the Agent or "
                f"ModelEndpoint {self.namespace}/{endpoint_ref}"
            )
        model = _model(model_name or "default", endpoint_ref, endpoint, agent.credential_secret_ref)
        fallback, project_fallback = None, None
        if agent.fallback_model is not None:
            fallback = await self._fallback(agent.fallback_model, endpoint_ref, endpoint, agent)
        if project is not None and project.fallback_model is not None:
            project_fallback = await self._fallback(project.fallback_model, endpoint_ref, endpoint, agent)
        skills = []
        for skill_name in agent.skill_refs:
            skill = await self.get("Skill", skill_name, SkillSpec)
            if skill is not None:
                skills.append(
                    ContractSkill(
                        name=skill_name,
                        description=skill.description,
                        instructions=skill.instructions,
                        tool_refs=skill.tool_refs,
                        requires=SkillRequirements(**skill.requires.model_dump()),
                    )
                )
        wanted = list(dict.fromkeys([*agent.tools, *(t for s in skills for t in s.tool_refs)]))
        outside = [t for t in wanted if t not in agent.allowed_tools]
        if outside:
            raise Invalid(
                f"Agent {self.namespace}/{name} uses tool(s) {', '.join(outside)} outside its allowedTools "
                f"({', '.join(agent.allowed_tools) or 'none'})"
            )
        tools = []
        for tool_name in wanted:
            tool = await self.get("Tool", tool_name, ToolResourceSpec)
            if tool is None:
                continue
            server = await self.get("MCPServer", tool.mcp_server_ref, MCPServerSpec)
            if server is not None:
                tools.append(
                    ToolSpec(
                        name=tool_name,
                        tool_name=tool.tool_name,
                        description=tool.description,
                        mcp_server=MCPServerRef(
                            name=tool.mcp_server_ref, url=server.url, transport=server.transport
                        ),
                    )
                )
        credential = _credential(agent.credential_secret_ref)
        hosts: dict[str, list[str]] = {}
        for secret in sorted(
            {
                c.secret_name
                for c in (
                    model.credential,
                    fallback and fallback.credential,
                    project_fallback and project_fallback.credential,
                    credential,
                )
                if c
            }
        ):
            found = await self._credential_secret(secret)
            if found is not None:
                hosts[secret] = found
        for ref, endpoint_name in (
            (model, endpoint_ref),
            (fallback, fallback.endpoint_ref if fallback else None),
            (project_fallback, project_fallback.endpoint_ref if project_fallback else None),
        ):
            if ref is not None and ref.credential is not None and ref.credential.secret_name in hosts:
                self._check_destination(ref, endpoint_name or "", hosts[ref.credential.secret_name])
        for ref_credential in (
            model.credential,
            fallback.credential if fallback else None,
            project_fallback.credential if project_fallback else None,
            credential,
        ):
            if ref_credential is not None:
                ref_credential.allowed_hosts = hosts.get(ref_credential.secret_name, [])
        placement = self._placement(name, agent, spec)
        return ResolvedAgent(
            name=name,
            model=model,
            fallback_model=fallback,
            project_fallback_model=project_fallback,
            system_prompt=agent.system_prompt,
            image=agent.image,
            endpoint=agent.endpoint,
            card_keys=agent.card_keys,
            contract_in=agent.contract_in,
            tools=tools,
            allowed_tools=agent.allowed_tools,
            skills=skills,
            credential=credential,
            sandbox_policy=spec.sandbox_policy,
            placement=placement,
        )

    def _placement(self, name: str, agent: AgentSpec, spec: RunSpec) -> Placement | None:
        """The Agent's placement with the Run's over it; a ServiceAccount or priority class the chart does not
        allow makes the Run invalid (admission refuses the same, when the chart installs its policies)."""
        placement = spec.placement.over(agent.placement) if spec.placement else agent.placement
        if placement is None or placement.is_empty():
            return None
        for value, allowed, field, chart in (
            (
                placement.service_account_name,
                self.allow.service_accounts,
                "serviceAccountName",
                "sandbox.allowedServiceAccounts",
            ),
            (
                placement.priority_class_name,
                self.allow.priority_classes,
                "priorityClassName",
                "sandbox.allowedPriorityClasses",
            ),
        ):
            if value is not None and allowed is not None and value not in allowed:
                raise Invalid(
                    f"placement.{field} {value} (Agent {self.namespace}/{name}, or the Run over it) is not "
                    f"allowed here (chart value {chart}: {', '.join(sorted(allowed)) or 'none'})"
                )
        keys = self.allow.toleration_keys
        refused = [
            t.key or "(no key: every taint)"
            for t in placement.tolerations
            if keys is not None and t.key not in keys
        ]
        if refused:
            raise Invalid(
                f"placement.tolerations {', '.join(refused)} (Agent {self.namespace}/{name}, or the Run over it) "
                f"not allowed here (chart value sandbox.allowedTolerations: {', '.join(sorted(keys or [])) or 'none'})"
            )
        return placement

    async def _fallback(
        self,
        fallback: FallbackModel,
        endpoint_ref: str | None,
        endpoint: ModelEndpointSpec | None,
        agent: AgentSpec,
    ) -> ModelRef:
        """A fallback model (the Agent's or the Project's) on its ModelEndpoint, the agent's own by default."""
        ref = fallback.model_endpoint_ref or endpoint_ref
        if ref != endpoint_ref:
            endpoint = await self.get("ModelEndpoint", ref or "", ModelEndpointSpec)
        return _model(fallback.model, ref, endpoint, agent.credential_secret_ref)

    async def _credential_secret(self, name: str) -> list[str] | None:
        """Only a Secret labelled as a credential may reach a sandbox: a Run author could otherwise have any
        Secret of the namespace mounted into an agent of theirs. Returns the hosts its owner allows (None: the
        Secret is missing, and named so)."""
        secret = await self.lookup("Secret", name)
        if secret is None:
            label = f"Secret {self.namespace}/{name}"
            if label not in self.missing:
                self.missing.append(label)
            return None
        if (secret.get("labels") or {}).get(CREDENTIAL_LABEL) != "true":
            raise Invalid(
                f"Secret {self.namespace}/{name} is not labelled {CREDENTIAL_LABEL}=true: only labelled "
                f"Secrets may be credentials (kubectl label secret {name} {CREDENTIAL_LABEL}=true)"
            )
        return allowed_hosts(secret.get("annotations"))

    def _check_destination(self, model: ModelRef, endpoint_ref: str, hosts: list[str]) -> None:
        """The label says the Secret may be used; its owner's annotation says where its value may go: a Run
        author who makes a ModelEndpoint at their own server must not get the team's key."""
        assert model.credential is not None
        if model.url is None or host_allowed(model.url, hosts):
            return  # no URL: the agent's own endpoint holds the credential, ksquad sends it nowhere
        secret = f"Secret {self.namespace}/{model.credential.secret_name}"
        host = urlsplit(model.url).netloc
        if not hosts:
            raise Invalid(
                f"{secret} names no host its value may be sent to, and ModelEndpoint {self.namespace}/"
                f"{endpoint_ref} would send it to {host}: its owner lists the hosts in the annotation "
                f"{ALLOWED_HOSTS_ANNOTATION} (kubectl annotate secret {model.credential.secret_name} "
                f"{ALLOWED_HOSTS_ANNOTATION}={host})"
            )
        raise Invalid(
            f"{secret} may be sent only to {', '.join(hosts)} (its annotation {ALLOWED_HOSTS_ANNOTATION}), not "
            f"to {host} (ModelEndpoint {self.namespace}/{endpoint_ref}): adding {host} is its owner's decision"
        )


def not_this_run(namespace: str, name: str, uid: str) -> Resolution:
    """The answer for a workflow whose Run the bridge cannot find with that uid: whoever can start workflows on
    the Temporal namespace could otherwise have any spec resolved in any namespace."""
    return Resolution(
        outcome="invalid",
        error=(
            f"there is no Run {namespace}/{name} with uid {uid}: the bridge resolves only the Runs it reads "
            "from the cluster, with the spec stored there (this workflow was not started for one)"
        ),
    )


def stored_spec(spec: Any) -> RunSpec | Resolution:
    """The Run's spec as stored (the API server validated it; an invalid one can never run)."""
    try:
        return parse_run_spec(spec)
    except InvalidObject as err:
        return Resolution(outcome="invalid", error=f"the stored Run is invalid: {'; '.join(err.problems)}")


def _credential(ref: SecretKeyRef | None) -> CredentialRef | None:
    return CredentialRef(secret_name=ref.name, key=ref.key) if ref else None


def _model(
    name: str,
    endpoint_ref: str | None,
    endpoint: ModelEndpointSpec | None,
    agent_credential: SecretKeyRef | None,
) -> ModelRef:
    credential = _credential(agent_credential) or _credential(
        endpoint.credential_secret_ref if endpoint else None
    )
    return ModelRef(
        name=name,
        url=endpoint.url if endpoint else None,
        provider=endpoint.provider if endpoint else None,
        endpoint_ref=endpoint_ref,
        credential=credential,
        resume_per_second=endpoint.resume_per_second if endpoint else None,
    )


async def resolve(
    namespace: str,
    spec: RunSpec,
    lookup: Lookup,
    namespace_limit: int | None = None,
    allow: AllowLists = AllowLists(),
) -> Resolution:
    return await Resolver(namespace, lookup, namespace_limit, allow).resolve(spec)
