"""The Run resource's spec (group ksquad.io, version v1alpha1).

The same model validates `kubectl apply` (the CRD schema is generated from it), `ksquad run -f` and the
workflow's input (`workflows.run.state.RunInput`), so an invalid Run is rejected with the same message, naming
the field, wherever it enters.
"""

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from workflows.model import InvalidObject, KsquadModel, field_problems

API_VERSION = "ksquad.io/v1alpha1"

# A Kubernetes object name (DNS-1123 subdomain).
K8sName = Annotated[
    str,
    StringConstraints(
        max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ),
]
# A Run's name labels its sandboxes (label values are at most 63 characters): the CRD says so too.
RunName = Annotated[
    str,
    StringConstraints(
        max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
    ),
]
# Inputs travel in the workflow's history and the sandbox's environment: keep them well under Temporal's
# 2 MB payload limit, and say so clearly instead of failing deep inside Temporal.
MAX_INPUTS_BYTES = 256 * 1024
MAX_INPUT_KEYS = 64


class SandboxPolicy(KsquadModel):
    """Where the Run's agent runs: the sandbox's runtime and whether it may come from a warm pool."""

    runtime_class: Literal["gvisor", "kata", "runc"] = "gvisor"
    """The sandbox runtime (a RuntimeClass the chart maps): gvisor (default), kata, or runc (no sandboxing
    runtime; only where the chart's sandbox.allowedRuntimeClasses allows it)."""
    class_: Literal["interactive", "batch"] = Field(default="interactive", alias="class")
    """interactive: a warm pod from a pool when one is free (claim latency, not boot time), else a cold Job;
    batch: always a cold Job."""
    pool: K8sName | None = None
    """The warm pool to take a pod from (chart value pools[].name); empty: any pool of the runtime class."""


LabelValue = Annotated[
    str, StringConstraints(max_length=63, pattern=r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
]
# A label key or resource name: an optional DNS prefix and a name (nvidia.com/gpu, kubernetes.io/arch).
QualifiedName = Annotated[
    str,
    StringConstraints(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    ),
]
Quantity = Annotated[
    str, StringConstraints(max_length=64, pattern=r"^[0-9.]+([eE][-+]?[0-9]+|[numkMGTPE]i?)?$")
]


class Toleration(KsquadModel):
    """A taint the sandbox pod tolerates (the pod's spec.tolerations[])."""

    key: QualifiedName | None = None
    """The taint's key, one of the chart's sandbox.allowedTolerations (required where the chart sets that list)."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Equal: the taint's value must be `value`; Exists: any value."""
    value: LabelValue | None = None
    """The taint's value, with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """The taint effect tolerated; empty: every effect."""
    toleration_seconds: int | None = Field(default=None, ge=0, le=86400)
    """With effect NoExecute: how long the pod stays once the taint appears; empty: for good."""


class SandboxResources(KsquadModel):
    """The agent container's requests and limits, over the chart's (sandbox.resources), key by key: cpu,
    memory, or an extended resource such as nvidia.com/gpu."""

    requests: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=16)
    """What the scheduler reserves on the node (cpu: "2", memory: 8Gi)."""
    limits: dict[QualifiedName, Quantity] = Field(default_factory=dict, max_length=16)
    """The most the container may use; an extended resource (nvidia.com/gpu: "1") is asked for here."""


# Why an affinity is node affinity only: pod affinity places a sandbox by other pods, and through a namespaceSelector
# by pods of other namespaces (a tenant learns where another's run, or lands beside them).
AFFINITY = (
    "only nodeAffinity is allowed: podAffinity and podAntiAffinity place a sandbox by other pods, other tenants' "
    "among them (a namespaceSelector reaches any namespace)"
)


class Placement(KsquadModel):
    """Where the sandbox runs and as whom: set on the Agent, overridden per field by the Run. The ServiceAccount
    and priority class only from the chart's allow-lists (sandbox.allowedServiceAccounts,
    sandbox.allowedPriorityClasses); the pod still gets no ServiceAccount token."""

    service_account_name: K8sName | None = None
    """The sandbox pod's ServiceAccount (for image pull secrets or a workload identity), from
    sandbox.allowedServiceAccounts; empty: the chart's sandbox.serviceAccount."""
    node_selector: dict[QualifiedName, LabelValue] = Field(default_factory=dict, max_length=16)
    """Node labels the sandbox's node must have, besides the chart's."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=16)
    """Taints the sandbox pod tolerates (a node pool of the team's own, a GPU pool)."""
    affinity: dict[str, Any] | None = Field(
        default=None,
        # The CRD keeps the object as written (a Pod's affinity, unstructured) and refuses the two other kinds by
        # name (CEL sees only declared fields of an unstructured object); the model refuses any key but nodeAffinity.
        json_schema_extra={
            "properties": {
                kind: {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity")
            },
            "x-kubernetes-preserve-unknown-fields": True,
            "x-kubernetes-validations": [
                {"rule": "!has(self.podAffinity) && !has(self.podAntiAffinity)", "message": AFFINITY}
            ],
        },
    )
    """The pod's node affinity (nodeAffinity, as in a Pod's spec). Pod affinity and anti-affinity are refused."""
    resources: SandboxResources | None = None
    """The agent container's requests and limits over the chart's (GPUs as extended resources)."""
    priority_class_name: K8sName | None = None
    """The pod's PriorityClass, from sandbox.allowedPriorityClasses."""

    @field_validator("affinity")
    @classmethod
    def _node_affinity_only(cls, affinity: dict[str, Any] | None) -> dict[str, Any] | None:
        if affinity and set(affinity) - {"nodeAffinity"}:
            raise ValueError(f"{', '.join(sorted(set(affinity) - {'nodeAffinity'}))}: {AFFINITY}")
        return affinity

    def over(self, base: "Placement | None") -> "Placement":
        """This placement's fields that are set, over `base`'s (a Run's over its Agent's)."""
        if base is None:
            return self
        mine = {k: getattr(self, k) for k in self.model_fields_set if getattr(self, k) not in (None, {}, [])}
        return base.model_copy(update=mine)

    def is_empty(self) -> bool:
        return self == Placement()


class RetryPolicy(KsquadModel):
    """How a failed attempt is retried: fence the claim, delete the sandbox, back off, try again."""

    max_retries: int = Field(default=2, ge=0, le=20)
    """Retries after the first attempt (0-20); past them the Run is Failed with the last attempt's reason."""
    backoff_seconds: int = Field(default=10, ge=1, le=3600)
    """The first retry's backoff; it doubles with each retry (equal jitter: half of it fixed, half random)."""
    max_backoff_seconds: int = Field(default=300, ge=1, le=86400)
    """The cap of the doubling backoff; not below backoffSeconds."""

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> "RetryPolicy":
        if self.max_backoff_seconds < self.backoff_seconds:
            raise ValueError(
                f"maxBackoffSeconds ({self.max_backoff_seconds}) must not be below backoffSeconds "
                f"({self.backoff_seconds})"
            )
        return self


class Timeouts(KsquadModel):
    """Bounds on each phase: while a worker runs the Run, nothing stays Pending on its references, Queued,
    Claiming, Running or Paused forever (a retry's backoff is bounded by retryPolicy)."""

    claim_seconds: int = Field(default=300, ge=1, le=7 * 86400)
    """Pending while references are missing, and each Claiming (the work item, then the sandbox)."""
    run_seconds: int = Field(default=3600, ge=1, le=7 * 86400)
    """Each attempt's Running (time paused for input or a credential does not count)."""
    paused_seconds: int = Field(default=86400, ge=1, le=30 * 86400)
    """Each pause that waits for a signal: CredentialExpired, InputRequired, Manual."""
    queued_seconds: int = Field(default=86400, ge=1, le=30 * 86400)
    """Queued, waiting for a concurrency slot of the namespace, Team or Project."""
    rate_limited_seconds: int = Field(default=86400, ge=1, le=30 * 86400)
    """Paused(RateLimited) over all of the Run's pauses (each is capped at an hour): a credential that keeps
    answering 429 ends the Run Failed (RateLimitedTimeout) instead of keeping it alive."""


class RunSpec(KsquadModel):
    """One unit of agent work: who runs it, on what, with which inputs, and its bounds. It cannot change once
    the Run exists."""

    team_ref: K8sName | None = None
    """A Team of this namespace: its agents when spec.agents is empty, and its concurrency limit."""
    project_ref: K8sName | None = None
    """A Project of this namespace: its concurrency limit."""
    agents: list[K8sName] = Field(default_factory=list, max_length=32)
    """Eligible Agents in preference order: the first is primary, the rest re-route candidates after rate
    limits. Empty: the Team's agents."""
    work_item_ref: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = None
    """An opaque reference (an issue, a ticket) the Run claims, unique in the Run's namespace (the same ref in
    another namespace is another item): at most one Run holds it at a time, with a fence that refuses the writes
    of an earlier holder."""
    inputs: dict[str, str] = Field(default_factory=dict, max_length=MAX_INPUT_KEYS)
    """The task's inputs, given to the agent in its first A2A message (never in a Job's spec): at most 64 keys
    and 256 KiB in all."""
    model: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = None
    """The model name, over the Agent's and the ModelEndpoint's."""
    model_endpoint_ref: K8sName | None = None
    """A ModelEndpoint of this namespace, over the Agent's."""
    sandbox_policy: SandboxPolicy = Field(default_factory=SandboxPolicy)
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    timeouts: Timeouts = Field(default_factory=Timeouts)
    placement: Placement | None = None
    """Where the sandbox runs, over the Agent's placement field by field (docs/operating.md, "Placement")."""
    token_budget: int | None = Field(default=None, ge=1, le=10**12)
    """The most model tokens (input and output) the Run's agents may use over all its attempts. A call that
    takes the Run past it is the last (its usage is counted, the agent's task cancelled), and so is a call that
    uses it up with more to do: the Run ends Failed (TokenBudgetSpent), without another attempt. Empty: the
    Team's tokenBudget, else no budget."""

    @field_validator("inputs")
    @classmethod
    def _inputs_fit(cls, inputs: dict[str, str]) -> dict[str, str]:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in inputs.items())
        if size > MAX_INPUTS_BYTES:
            raise ValueError(f"inputs are {size} bytes in total, more than the {MAX_INPUTS_BYTES} allowed")
        return inputs

    @model_validator(mode="after")
    def _someone_to_run(self) -> "RunSpec":
        if not self.agents and not self.team_ref:
            raise ValueError("name at least one agent in `agents`, or a `teamRef` whose agents run it")
        return self


def parse_run_spec(data: Any, where: str = "spec") -> RunSpec:
    """Validate a Run's spec; raises InvalidObject whose problems name each bad field (`spec.timeouts...`)."""
    try:
        return RunSpec.model_validate(data if data is not None else {})
    except ValidationError as err:
        raise InvalidObject("Run", field_problems(err, where)) from None


class ObjectMeta(KsquadModel):
    # Labels, annotations, uid... pass through.
    model_config = KsquadModel.model_config | ConfigDict(extra="allow")
    name: K8sName
    namespace: K8sName = "default"


class RunMeta(ObjectMeta):
    name: RunName


class RunManifest(KsquadModel):
    """A whole Run manifest, as `kubectl apply -f` and `ksquad run -f` take it."""

    model_config = KsquadModel.model_config | ConfigDict(extra="allow")  # status and the like are ignored
    api_version: Literal["ksquad.io/v1alpha1"]
    kind: Literal["Run"]
    metadata: RunMeta
    spec: RunSpec


def parse_run_manifest(data: Any) -> RunManifest:
    try:
        return RunManifest.model_validate(data)
    except ValidationError as err:
        raise InvalidObject("Run", field_problems(err)) from None


def run_workflow_id(namespace: str, name: str) -> str:
    """Readable in the Temporal UI and CLI: `temporal workflow cancel -w <namespace>/<name>`."""
    return f"{namespace}/{name}"
