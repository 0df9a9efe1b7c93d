"""The activities the workflows call: their names, task queues, inputs, outputs, typed errors and typed stubs.

This module is the whole contract between the deterministic core and the side effects in `activities/` and
`crd_bridge/`: both sides import it, neither imports the other.
"""

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field
from temporalio import activity

from workflows.contract import ExecutionContract, Resolution
from workflows.entity_types import LimitAnnouncement, ResumePlaceRequest, ThrottleNotice
from workflows.envelope import NotInWarrant, RouteChoice, RunEnvelope, Warrant
from workflows.envelope import RunRef as RunRef  # where the activities' callers have always found it
from workflows.model import KsquadModel
from workflows.spec import RunSpec, SandboxPolicy
from workflows.status import Artifact, SandboxStatus, StatusSnapshot, UsageStatus

WORKER_TASK_QUEUE = "ksquad"
BRIDGE_TASK_QUEUE = "ksquad-bridge"
# A claim's lease; the Running activity renews it, a pause extends it to cover itself.
CLAIM_LEASE_SECONDS = 120


class Activity(StrEnum):
    # on the bridge's task queue: they touch ksquad.io objects
    RESOLVE_REFERENCES = "resolve_references"
    MIRROR_STATUS = "mirror_status"
    # on the worker's task queue
    CLAIM_WORK_ITEM = "claim_work_item"
    FENCE_WORK_ITEM = "fence_work_item"
    RENEW_CLAIM = "renew_claim"
    RELEASE_WORK_ITEM = "release_work_item"
    FENCE_ATTEMPT = "fence_attempt"  # a Run without a work item: its ended attempt may act no more
    RECORD_RUN_ENDING = "record_run_ending"  # the ending on the Run's item; the agent's checkpoints forgotten
    ACQUIRE_SANDBOX = "acquire_sandbox"
    RELEASE_SANDBOX = "release_sandbox"
    INVOKE_AGENT = "invoke_agent"
    PUBLISH_OUTPUTS = "publish_outputs"
    SIGNAL_WITH_START = "signal_with_start"  # messages to the credential and concurrency-gate workflows
    FIND_CLOSED_WORKFLOWS = "find_closed_workflows"  # a gate frees the slots of runs that were terminated
    RESERVE_RESUME_PLACE = "reserve_resume_place"  # a paused run's place in the ramp after a rate limit
    ANNOUNCE_CREDENTIAL_LIMIT = "announce_credential_limit"  # a limit, to every run subscribed in the store


# Every activity that acts takes the Run's warrant (workflows.envelope) and builds what it acts on from it: the
# worker checks the warrant against the activity's own workflow and run before it runs (worker.seals).
ACTING = frozenset(
    {
        Activity.CLAIM_WORK_ITEM,
        Activity.FENCE_WORK_ITEM,
        Activity.RENEW_CLAIM,
        Activity.RELEASE_WORK_ITEM,
        Activity.FENCE_ATTEMPT,
        Activity.RECORD_RUN_ENDING,
        Activity.ACQUIRE_SANDBOX,
        Activity.RELEASE_SANDBOX,
        Activity.INVOKE_AGENT,
        Activity.PUBLISH_OUTPUTS,
        Activity.SIGNAL_WITH_START,
        Activity.RESERVE_RESUME_PLACE,
    }
)


class Warranted(KsquadModel):
    """An acting activity's argument: the warrant, and what the workflow chose within it."""

    warrant: Warrant

    @property
    def run(self) -> RunRef:
        return self.warrant.run_ref


# --- references -------------------------------------------------------------------------------------------


class ResolveRequest(KsquadModel):
    """The Run's envelope, as the workflow was started with it (its carry aside)."""

    envelope: RunEnvelope

    @property
    def run(self) -> RunRef:
        return self.envelope.run_ref

    @property
    def spec(self) -> RunSpec:
        return self.envelope.spec


# --- claims -----------------------------------------------------------------------------------------------


class ClaimRequest(Warranted):
    attempt: int
    lease_seconds: int

    @property
    def work_item_ref(self) -> str:
        """The work item claimed: the Run's own (a Run without one claims nothing)."""
        return claimed_item(self.warrant)


class Claim(KsquadModel):
    work_item_ref: str
    fence: int
    lease_expires_at: datetime | None = None
    item: bool = False  # the ref names a work item of the namespace (else it is a lock key alone)


class ClaimUpdate(Warranted):
    """Renew, fence or release a claim held with `fence`."""

    fence: int
    lease_seconds: int = 0

    @property
    def work_item_ref(self) -> str:
        return claimed_item(self.warrant)


def claimed_item(warrant: Warrant) -> str:
    ref = warrant.envelope.spec.work_item_ref
    if ref is None:
        raise NotInWarrant(f"Run {warrant.envelope.namespace}/{warrant.envelope.name} names no work item")
    return ref


class AttemptFence(Warranted):
    """Fence off `attempt` of a Run without a work item: from now on only a later attempt's writes are taken."""

    attempt: int


class RunEnding(Warranted):
    """How the Run ended, for its work item's record (once) and to forget its agent's checkpoints. Its phase and
    reason alone: the item's readers need not be the Run's, whose answer and messages these are not."""

    attempt: int
    phase: str
    reason: str


# --- sandboxes --------------------------------------------------------------------------------------------


class SandboxRequest(Warranted):
    route: RouteChoice
    attempt: int
    fence: int
    timeout_seconds: int  # to become ready

    @property
    def contract(self) -> ExecutionContract:
        return self.warrant.contract(self.route, self.attempt, self.fence)

    @property
    def policy(self) -> SandboxPolicy:
        """Where the sandbox may run, as the bridge resolved it for the agent."""
        return self.warrant.agent(self.route).sandbox_policy

    @property
    def run_seconds(self) -> int:
        """How long the attempt may run: bounds the sandbox's life (activeDeadlineSeconds)."""
        return self.warrant.envelope.spec.timeouts.run_seconds


class Sandbox(KsquadModel):
    name: str
    kind: Literal["warm", "cold", "claimed", "local", "external"]
    endpoint: str  # the A2A base URL
    seal: str | None = None  # the worker's HMAC over the sandbox, run and attempt (temporal_client.seal)

    @property
    def status(self) -> SandboxStatus:
        return SandboxStatus(name=self.name, kind=self.kind)


class SandboxRelease(Warranted):
    sandbox: Sandbox
    # the fence step of fence-then-release: wait until the sandbox is gone, fail closed when unsure
    confirm: bool = False


# --- agents -----------------------------------------------------------------------------------------------


class ContinueTask(KsquadModel):
    """A follow-up message to a task that paused for input or credentials."""

    task_id: str
    context_id: str
    text: str = ""


class AgentInvocation(Warranted):
    route: RouteChoice
    attempt: int
    fence: int
    # Where the agent runs: a sandbox the worker made and sealed for the attempt, or (kind "external") the
    # resolved agent's own endpoint.
    sandbox: Sandbox
    turn: int = (
        0  # the attempt's messages: 0 first, then one more for each fallback, input or refreshed credential
    )
    continue_task: ContinueTask | None = None
    # Tokens the Run may still use (its token budget less what it used): the call that reaches it ends the run.
    token_budget_left: int | None = None

    @property
    def contract(self) -> ExecutionContract:
        return self.warrant.contract(self.route, self.attempt, self.fence)

    @property
    def endpoint(self) -> str:
        return self.sandbox.endpoint

    @property
    def context_id(self) -> str:
        return f"{self.warrant.envelope.uid}-a{self.attempt}"

    @property
    def message_id(self) -> str:
        """ "<run-uid>-a<attempt>" for an attempt's first message, "-t<turn>" after."""
        return self.context_id + (f"-t{self.turn}" if self.turn else "")


class AgentResult(KsquadModel):
    task_id: str
    outputs: dict[str, str] = Field(default_factory=dict)
    artifacts: list[Artifact] = Field(default_factory=list)
    summary: str = ""
    usage: UsageStatus | None = None  # the attempt's model usage so far (all its turns), as recorded


# An AgentError's details: [0] the model of its type (FailureDetails, TaskPause, RateLimitDetails), and [1], when
# the attempt made model calls, its usage so far (UsageStatus).
USAGE_DETAIL = 1


class AgentError(StrEnum):
    """ApplicationError types that invoke_agent raises (non-retryable); details[0] is the model below."""

    RATE_LIMITED = "RateLimited"
    CREDENTIAL_EXPIRED = "CredentialExpired"
    INPUT_REQUIRED = "InputRequired"
    AGENT_FAILED = "AgentFailed"
    INVALID_AGENT_RESPONSE = "InvalidAgentResponse"
    SANDBOX_LOST = "SandboxLost"  # the agent stopped answering: its sandbox died
    TOKEN_BUDGET_SPENT = "TokenBudgetSpent"  # a call reached the Run's token budget: the run ends, no retry
    # A cancelled call (the Run cancelled, its deadline, a pause): the agent did not report its task CANCELED
    # within the wait, so the task may go on. Raised only after a cancel; the Run's AgentStopped condition says so.
    CANCEL_UNCONFIRMED = "CancelUnconfirmed"


# acquire_sandbox's ApplicationError type when the cluster cannot run the sandbox as configured (a RuntimeClass
# that does not exist): the run fails at once, naming what to set, instead of retrying what cannot work.
SANDBOX_MISCONFIGURED = "SandboxMisconfigured"
# The worker refused what it was handed: not what the bridge resolved or the worker made (temporal_client.seal).
UNSEALED = "Unsealed"
# The bridge or the worker refused a copy of a Run: a sealed envelope under another workflow id, or another execution
# than the one the bridge started (workflows.envelope).
COPY_REFUSED = "CopyRefused"


class RateLimitDetails(KsquadModel):
    retry_after: str | None = None  # raw Retry-After (delta-seconds or HTTP-date) or retry-after-ms
    retry_after_ms: str | None = None
    response_date: str | None = None  # the response's Date header, for HTTP-date arithmetic
    # the provider's own reset headers, raw (x-ratelimit-reset-requests: "6m0s", anthropic-...-reset: RFC 3339)
    provider_resets: dict[str, str] = Field(default_factory=dict)
    observed_at: datetime | None = None
    model: str | None = None
    credential: str | None = None  # "<namespace>/<secret>"


class TaskPause(KsquadModel):
    """The agent's task waits (InputRequired, CredentialExpired): continue it with a follow-up message."""

    task_id: str
    context_id: str
    message: str = ""


class FailureDetails(KsquadModel):
    message: str
    task_id: str | None = None


# --- outputs ----------------------------------------------------------------------------------------------


class OutputsRequest(Warranted):
    attempt: int
    fence: int
    outputs: dict[str, str]
    artifacts: list[Artifact] = Field(default_factory=list)


class PublishedOutputs(KsquadModel):
    outputs: dict[str, str]  # the small map for status.outputs
    config_map: str | None = None


# --- entity workflows -------------------------------------------------------------------------------------


class EntitySignal(KsquadModel):
    """Signal-with-start of an entity workflow (a credential's throttle, a concurrency gate)."""

    warrant: Warrant  # of the run that sends it (its execution: the warrant's chain)
    workflow: Literal["CredentialThrottle", "ConcurrencyGate"]
    workflow_id: str
    signal: str
    arg: dict[str, object]


class WorkflowIds(KsquadModel):
    ids: list[str]


# --- the activities, typed ----------------------------------------------------------------------------------
# The workflows call these stubs by reference (`workflow.execute_activity(resolve_references, request)`): the
# name, argument and result type come from here. `activities/` and `crd_bridge` implement each under the same
# name and signature; tests/workflows/test_activity_links.py checks every implementation against its stub.


@activity.defn(name=Activity.RESOLVE_REFERENCES)
async def resolve_references(req: ResolveRequest) -> Resolution:
    raise NotImplementedError("the bridge's (crd_bridge.activities), or the embedded stack's")


@activity.defn(name=Activity.MIRROR_STATUS)
async def mirror_status(snapshot: StatusSnapshot) -> None:
    raise NotImplementedError("the bridge's (crd_bridge.activities), or the embedded stack's")


@activity.defn(name=Activity.CLAIM_WORK_ITEM)
async def claim_work_item(req: ClaimRequest) -> Claim:
    raise NotImplementedError("activities.claims")


@activity.defn(name=Activity.FENCE_WORK_ITEM)
async def fence_work_item(upd: ClaimUpdate) -> Claim:
    raise NotImplementedError("activities.claims")


@activity.defn(name=Activity.RENEW_CLAIM)
async def renew_claim(upd: ClaimUpdate) -> Claim:
    raise NotImplementedError("activities.claims")


@activity.defn(name=Activity.RELEASE_WORK_ITEM)
async def release_work_item(upd: ClaimUpdate) -> None:
    raise NotImplementedError("activities.claims")


@activity.defn(name=Activity.FENCE_ATTEMPT)
async def fence_attempt(req: AttemptFence) -> None:
    raise NotImplementedError("activities.claims")


@activity.defn(name=Activity.RECORD_RUN_ENDING)
async def record_run_ending(req: RunEnding) -> None:
    raise NotImplementedError("activities.claims")


@activity.defn(name=Activity.ACQUIRE_SANDBOX)
async def acquire_sandbox(req: SandboxRequest) -> Sandbox:
    raise NotImplementedError("activities.sandboxes")


@activity.defn(name=Activity.RELEASE_SANDBOX)
async def release_sandbox(rel: SandboxRelease) -> None:
    raise NotImplementedError("activities.sandboxes")


@activity.defn(name=Activity.PUBLISH_OUTPUTS)
async def publish_outputs(req: OutputsRequest) -> PublishedOutputs:
    raise NotImplementedError("activities.sandboxes")


@activity.defn(name=Activity.INVOKE_AGENT)
async def invoke_agent(inv: AgentInvocation) -> AgentResult:
    raise NotImplementedError("activities.agents")


@activity.defn(name=Activity.SIGNAL_WITH_START)
async def signal_with_start(message: EntitySignal) -> ThrottleNotice | None:
    raise NotImplementedError("activities.entities")


@activity.defn(name=Activity.FIND_CLOSED_WORKFLOWS)
async def find_closed_workflows(ids: WorkflowIds) -> list[str]:
    raise NotImplementedError("activities.entities")


@activity.defn(name=Activity.ANNOUNCE_CREDENTIAL_LIMIT)
async def announce_credential_limit(announcement: LimitAnnouncement) -> int:
    raise NotImplementedError("activities.entities")


@activity.defn(name=Activity.RESERVE_RESUME_PLACE)
async def reserve_resume_place(req: ResumePlaceRequest) -> datetime:
    raise NotImplementedError("activities.entities")


STUBS = (
    resolve_references,
    mirror_status,
    claim_work_item,
    fence_work_item,
    renew_claim,
    release_work_item,
    fence_attempt,
    record_run_ending,
    acquire_sandbox,
    release_sandbox,
    publish_outputs,
    invoke_agent,
    signal_with_start,
    find_closed_workflows,
    announce_credential_limit,
    reserve_resume_place,
)
