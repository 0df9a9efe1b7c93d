"""The ExecutionContract: everything a sandbox needs to run one attempt of a Run, and nothing secret.

Secrets are referenced (Secret name and key), never copied: a cold sandbox gets them through `secretKeyRef`,
a warm one reads them from its own mounted credential. The contract travels in each attempt's first A2A message
(never in a Job's or Pod's spec: those land in etcd and the audit log), so its shape is versioned. An agent run
by hand may also read it from `KSQUAD_EXECUTION_CONTRACT`.
"""

import re
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from workflows.model import KsquadModel
from workflows.spec import Placement, SandboxPolicy

CONTRACT_API_VERSION: Literal["ksquad.io/contract-v1"] = "ksquad.io/contract-v1"


class CredentialRef(KsquadModel):
    secret_name: str
    key: str = "apiKey"
    # The environment variable a cold sandbox holds the value in (through a secretKeyRef); derived when empty.
    env: str = ""
    # Where the Secret's owner allows its value to be sent (its annotation `ksquad.io/allowed-hosts`): hosts,
    # host:port or CIDRs. The bridge refuses a route to any other host; the agent refuses to send it elsewhere.
    allowed_hosts: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _env_name(self) -> "CredentialRef":
        if not self.env:
            self.env = "KSQUAD_CREDENTIAL_" + re.sub(
                r"[^A-Z0-9]", "_", f"{self.secret_name}_{self.key}".upper()
            )
        return self

    def throttle_key(self, namespace: str) -> str:
        """Throttling is per credential: `<namespace>/<secret>`."""
        return f"{namespace}/{self.secret_name}"


class ModelRef(KsquadModel):
    name: str
    url: str | None = None  # OpenAI-compatible base URL; None: the sandbox's default
    provider: str | None = None
    endpoint_ref: str | None = None
    credential: CredentialRef | None = None
    resume_per_second: float | None = None  # the ramp after a rate limit (ModelEndpoint.resumePerSecond)

    def throttle_key(self, namespace: str) -> str:
        if self.credential is not None:
            return self.credential.throttle_key(namespace)
        # No credential: limits still apply per endpoint, so throttle per endpoint (or model) instead.
        return f"{namespace}/-{self.url or self.name}"


class MCPServerRef(KsquadModel):
    name: str
    url: str
    transport: Literal["streamable-http", "sse", "stdio"] = "streamable-http"


class ToolSpec(KsquadModel):
    name: str  # the Tool object's name
    tool_name: str  # the tool's name on its MCP server
    description: str = ""
    mcp_server: MCPServerRef | None = None


class SkillRequirements(KsquadModel):
    toolchains: list[str] = Field(default_factory=list)
    sidecars: list[str] = Field(default_factory=list)


class SkillSpec(KsquadModel):
    name: str
    description: str = ""
    instructions: str = ""
    tool_refs: list[str] = Field(default_factory=list)
    requires: SkillRequirements = Field(default_factory=SkillRequirements)


PRIVATE_JWK_MEMBERS = frozenset(
    {"d", "p", "q", "dp", "dq", "qi", "oth", "k"}
)  # RFC 7518: private or symmetric
B64Url = Annotated[str, StringConstraints(min_length=1, max_length=2048, pattern=r"^[A-Za-z0-9_-]+$")]


class PublicJwk(KsquadModel):
    """A public signing key (RFC 7517): EC (P-256, P-384, P-521), RSA or Ed25519. A private or symmetric member
    (`d`, `p`, `k`...) is an unknown field: refused, naming it."""

    kty: Literal["EC", "RSA", "OKP"]
    kid: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    use: Literal["sig"] | None = None
    alg: (
        Literal["ES256", "ES384", "ES512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "EdDSA"]
        | None
    ) = None
    crv: Literal["P-256", "P-384", "P-521", "Ed25519"] | None = None
    x: B64Url | None = None
    y: B64Url | None = None
    n: B64Url | None = None
    e: B64Url | None = None

    @model_validator(mode="before")
    @classmethod
    def _public(cls, data: object) -> object:
        private = sorted(set(data) & PRIVATE_JWK_MEMBERS) if isinstance(data, dict) else []
        if private:
            raise ValueError(f"holds private key members ({', '.join(private)}): give the public key alone")
        return data

    @model_validator(mode="after")
    def _complete(self) -> "PublicJwk":
        needs = {"EC": ("crv", "x", "y"), "RSA": ("n", "e"), "OKP": ("crv", "x")}[self.kty]
        missing = [f for f in needs if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.kty} key needs {', '.join(missing)}")
        return self


class CardKeys(KsquadModel):
    """The keys an agent's card must be signed with (a JWKS, A2A 1.0 section 8.4)."""

    keys: list[PublicJwk] = Field(min_length=1, max_length=16)


class ResolvedAgent(KsquadModel):
    """An Agent with every reference resolved and the Run's overrides applied."""

    name: str
    model: ModelRef
    fallback_model: ModelRef | None = None
    project_fallback_model: ModelRef | None = None  # the Run's Project's, after the agent's own fallback
    system_prompt: str = ""
    image: str | None = None
    endpoint: str | None = None  # an already-running A2A agent: no sandbox is made
    card_keys: CardKeys | None = None  # its card must be signed with one of these; None: not checked
    contract_in: Literal["dataPart", "metadata"] = "dataPart"  # where the first message carries the contract
    tools: list[ToolSpec] = Field(default_factory=list)
    allowed_tools: list[str] = Field(default_factory=list)
    skills: list[SkillSpec] = Field(default_factory=list)
    credential: CredentialRef | None = None  # the agent's own credential, mounted in its sandbox
    # Where its sandbox may run, as the bridge resolved it from the Run (within the chart's allow-lists).
    sandbox_policy: SandboxPolicy = Field(default_factory=SandboxPolicy)
    # The Agent's placement with the Run's over it (within the chart's allow-lists); None: the chart's defaults.
    placement: Placement | None = None
    # Sealed one by one before warrants (a resolution in a history of then); the warrant seals the whole
    # resolution now, and this is neither set nor read.
    seal: str | None = None

    @property
    def forces_cold(self) -> bool:
        """A Skill with requirements needs init containers or sidecars, which a warm pod cannot gain."""
        return any(s.requires.toolchains or s.requires.sidecars for s in self.skills)


class RunIdentity(KsquadModel):
    namespace: str
    name: str
    uid: str
    attempt: int
    fence: int
    triggered_by: str | None = None
    work_item_ref: str | None = None


class ExecutionContract(KsquadModel):
    api_version: Literal["ksquad.io/contract-v1"] = CONTRACT_API_VERSION
    run: RunIdentity
    inputs: dict[str, str] = Field(default_factory=dict)
    agent: ResolvedAgent
    model: ModelRef  # the model to use now (the agent's, the Run's override, or the fallback)

    def models(self) -> list[ModelRef]:
        """Every model the attempt may use: the one now, the agent's own, its fallback, the Project's fallback."""
        agent = self.agent
        found = (self.model, agent.model, agent.fallback_model, agent.project_fallback_model)
        return [m for m in found if isinstance(m, ModelRef)]

    def for_sandbox(self) -> dict[str, object]:
        """The contract as a sandbox gets it: without the triggering user's identity (runs are attributed to
        people in the orchestrator's records, never inside the sandbox)."""
        data: dict[str, object] = self.model_dump(
            mode="json", exclude={"run": {"triggered_by"}, "agent": {"seal"}}
        )
        return data


class ConcurrencyScope(KsquadModel):
    """A limit the Run counts against: the namespace, its Team or its Project."""

    key: str  # e.g. "ns/payments", "team/payments/payments-squad"
    limit: int = Field(ge=1)


class FairShare(KsquadModel):
    """Whose runs these are when several wait on one thing (a limited credential's ramp, a queue's slot): the
    Run's Team, weighted by the Team's `weight`. Runs that name no Team share one tenant, ""."""

    tenant: str = ""
    weight: float = Field(default=1.0, ge=1, le=100)


class Resolution(KsquadModel):
    outcome: Literal["resolved", "missing", "invalid"]
    # missing: the objects not found, each named ("Agent ksquad-system/dev-1"); the run waits for them
    missing: list[str] = Field(default_factory=list)
    # invalid: why the Run can never run as written (a tool outside allowedTools, say)
    error: str | None = None
    agents: list[ResolvedAgent] = Field(default_factory=list)  # eligible, in preference order
    scopes: list[ConcurrencyScope] = Field(default_factory=list)
    token_budget: int | None = None  # the Team's, for a Run that sets none
    share: FairShare = Field(default_factory=FairShare)
    # The bridge's warrant (workflows.envelope): the execution it was made for (the first run id of the Run's
    # workflow chain), the seal of the envelope it was made from, and its HMAC over all of it.
    chain: str | None = None
    envelope_seal: str | None = None
    seal: str | None = None
