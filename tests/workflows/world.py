"""Test-only stand-ins for the Run workflow's activities: a scripted, recording world.

The real activities (claims on SQL, sandboxes on Kubernetes, agents over A2A, the bridge) arrive with their
own issues and are tested against real components there. Here each activity is a small in-memory model
that enforces the same rules (one claim holder, fences, sandboxes that exist until deleted) and records every
call in order, so a test can assert what happened and in which order. The entity activities (messages to
the credential and gate workflows) are the real ones: they talk to the real Temporal test server.
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.entities import EntityActivities
from worker.temporal import register_search_attributes, with_converter
from workflows.activity_types import (
    BRIDGE_TASK_QUEUE,
    WORKER_TASK_QUEUE,
    Activity,
    AgentError,
    AgentInvocation,
    AgentResult,
    Claim,
    ClaimRequest,
    ClaimUpdate,
    FailureDetails,
    OutputsRequest,
    PublishedOutputs,
    RateLimitDetails,
    ResolveRequest,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
    TaskPause,
)
from workflows.contract import ConcurrencyScope, CredentialRef, ModelRef, Resolution, ResolvedAgent
from workflows.entities import ConcurrencyGateWorkflow, CredentialThrottleWorkflow
from workflows.run import RunWorkflow
from workflows.spec import RunInput, parse_run_spec
from workflows.status import RunStatus, StatusSnapshot


@dataclass
class Outcome:
    """What the scripted agent does with one invocation."""

    kind: str  # ok | rate_limited | input_required | credential_expired | failed | invalid | lost | hang
    outputs: dict[str, str] = field(default_factory=dict)
    retry_after: str | None = None
    retry_after_ms: str | None = None
    response_date: str | None = None
    message: str = ""


def ok(**outputs: str) -> Outcome:
    return Outcome("ok", outputs=outputs or {"result": "done"})


def rate_limited(retry_after: str | None = None, **kw: Any) -> Outcome:
    return Outcome("rate_limited", retry_after=retry_after, **kw)


def hang() -> Outcome:
    return Outcome("hang")


@dataclass
class Call:
    activity: str
    run: str
    detail: dict[str, Any]
    at: datetime


def agent(
    name: str, secret: str, fallback: tuple[str, str] | None = None, endpoint: str | None = None
) -> ResolvedAgent:
    return ResolvedAgent(
        name=name,
        model=ModelRef(
            name=f"{name}-model", url="http://model.test/v1", credential=CredentialRef(secret_name=secret)
        ),
        fallback_model=(
            ModelRef(
                name=fallback[0],
                url="http://model.test/v1",
                credential=CredentialRef(secret_name=fallback[1]),
            )
            if fallback
            else None
        ),
        endpoint=endpoint,
        system_prompt="You fix flaky tests.",
    )


class World:
    """The fake cluster, claim store, sandboxes and agents one test runs against."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.agents: dict[str, ResolvedAgent] = {"dev-1": agent("dev-1", "dev-1-key")}
        self.team_agents: dict[str, list[str]] = {}
        self.missing: dict[str, list[str]] = {}  # run name -> objects reported missing
        self.invalid: dict[str, str] = {}
        self.scopes: dict[str, list[ConcurrencyScope]] = {}  # run name -> scopes it counts against
        self.scripts: dict[str, list[Outcome]] = {}  # run name -> outcomes, one per invocation
        self.default_outcome = ok()
        self.claims: dict[str, tuple[str, int]] = {}  # work item -> (holder run, fence)
        self.fences: dict[str, int] = {}  # work item -> latest fence ever issued
        self.sandboxes: set[str] = set()
        self.mirrored: dict[str, list[RunStatus]] = {}
        self.sandbox_fails: dict[str, int] = {}  # run name -> how many acquisitions fail
        self.in_flight: dict[str, asyncio.Event] = {}  # run name -> set while an invocation runs

    def now(self) -> datetime:
        return activity.info().current_attempt_scheduled_time or datetime.now(UTC)

    def record(self, name: Activity, run: str, **detail: Any) -> None:
        self.calls.append(Call(name.value, run, detail, datetime.now(UTC)))

    def calls_of(self, name: Activity, run: str | None = None) -> list[Call]:
        return [c for c in self.calls if c.activity == name.value and (run is None or c.run == run)]

    def order(self, run: str) -> list[str]:
        return [c.activity for c in self.calls if c.run == run]

    # --- bridge queue -------------------------------------------------------------------------------------

    @activity.defn(name=Activity.RESOLVE_REFERENCES)
    async def resolve_references(self, req: ResolveRequest) -> Resolution:
        run = req.run.name
        self.record(Activity.RESOLVE_REFERENCES, run)
        if run in self.invalid:
            return Resolution(outcome="invalid", error=self.invalid[run])
        if self.missing.get(run):
            return Resolution(outcome="missing", missing=list(self.missing[run]))
        names = req.spec.agents or self.team_agents.get(req.spec.team_ref or "", [])
        return Resolution(
            outcome="resolved", agents=[self.agents[n] for n in names], scopes=self.scopes.get(run, [])
        )

    @activity.defn(name=Activity.MIRROR_STATUS)
    async def mirror_status(self, snapshot: StatusSnapshot) -> None:
        self.mirrored.setdefault(snapshot.name, []).append(snapshot.status)

    # --- claims -------------------------------------------------------------------------------------------

    @activity.defn(name=Activity.CLAIM_WORK_ITEM)
    async def claim_work_item(self, req: ClaimRequest) -> Claim:
        holder = self.claims.get(req.work_item_ref)
        if holder is not None and holder[0] != req.run.name:
            raise ApplicationError(f"{req.work_item_ref} is held by {holder[0]}", type="WorkItemHeld")
        fence = self.fences.get(req.work_item_ref, 0) + 1
        self.fences[req.work_item_ref] = fence
        self.claims[req.work_item_ref] = (req.run.name, fence)
        self.record(Activity.CLAIM_WORK_ITEM, req.run.name, fence=fence, attempt=req.attempt)
        return Claim(work_item_ref=req.work_item_ref, fence=fence)

    def _check(self, upd: ClaimUpdate, what: Activity) -> None:
        holder = self.claims.get(upd.work_item_ref)
        if holder != (upd.run.name, upd.fence):
            raise ApplicationError(f"{what}: stale fence {upd.fence} (holder {holder})", type="StaleFence",
                                   non_retryable=True)  # fmt: skip

    @activity.defn(name=Activity.FENCE_WORK_ITEM)
    async def fence_work_item(self, upd: ClaimUpdate) -> Claim:
        self._check(upd, Activity.FENCE_WORK_ITEM)
        fence = self.fences[upd.work_item_ref] + 1
        self.fences[upd.work_item_ref] = fence
        self.claims[upd.work_item_ref] = (upd.run.name, fence)
        self.record(Activity.FENCE_WORK_ITEM, upd.run.name, fence=fence)
        return Claim(work_item_ref=upd.work_item_ref, fence=fence)

    @activity.defn(name=Activity.RENEW_CLAIM)
    async def renew_claim(self, upd: ClaimUpdate) -> Claim:
        self._check(upd, Activity.RENEW_CLAIM)
        self.record(Activity.RENEW_CLAIM, upd.run.name, lease=upd.lease_seconds)
        return Claim(work_item_ref=upd.work_item_ref, fence=upd.fence)

    @activity.defn(name=Activity.RELEASE_WORK_ITEM)
    async def release_work_item(self, upd: ClaimUpdate) -> None:
        self._check(upd, Activity.RELEASE_WORK_ITEM)
        del self.claims[upd.work_item_ref]
        self.record(Activity.RELEASE_WORK_ITEM, upd.run.name, fence=upd.fence)

    # --- sandboxes and outputs ----------------------------------------------------------------------------

    @activity.defn(name=Activity.ACQUIRE_SANDBOX)
    async def acquire_sandbox(self, req: SandboxRequest) -> Sandbox:
        run = req.contract.run.name
        if self.sandbox_fails.get(run, 0) > 0:
            self.sandbox_fails[run] -= 1
            self.record(Activity.ACQUIRE_SANDBOX, run, failed=True)
            raise ApplicationError("ImagePullBackOff: image agent:missing not found", type="SandboxFailed",
                                   non_retryable=True)  # fmt: skip
        name = f"{run}-exec-{req.contract.run.attempt}"
        self.sandboxes.add(name)
        self.record(Activity.ACQUIRE_SANDBOX, run, sandbox=name, fence=req.contract.run.fence)
        return Sandbox(name=name, kind="cold", endpoint=f"http://{name}.test/")

    @activity.defn(name=Activity.RELEASE_SANDBOX)
    async def release_sandbox(self, rel: SandboxRelease) -> None:
        self.sandboxes.discard(rel.sandbox.name)
        self.record(Activity.RELEASE_SANDBOX, rel.run.name, sandbox=rel.sandbox.name, confirm=rel.confirm)

    @activity.defn(name=Activity.PUBLISH_OUTPUTS)
    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        self.record(Activity.PUBLISH_OUTPUTS, req.run.name, fence=req.fence)
        return PublishedOutputs(outputs=req.outputs, config_map=f"{req.run.name}-outputs")

    # --- the agent ----------------------------------------------------------------------------------------

    @activity.defn(name=Activity.INVOKE_AGENT)
    async def invoke_agent(self, inv: AgentInvocation) -> AgentResult:
        run = inv.contract.run.name
        script = self.scripts.get(run, [])
        outcome = script.pop(0) if script else self.default_outcome
        self.record(Activity.INVOKE_AGENT, run, message_id=inv.message_id, model=inv.contract.model.name,
                    agent=inv.contract.agent.name, outcome=outcome.kind, fence=inv.contract.run.fence,
                    follow_up=inv.continue_task.model_dump() if inv.continue_task else None)  # fmt: skip
        task_id = f"task-{inv.message_id}"
        if outcome.kind == "ok":
            return AgentResult(task_id=task_id, outputs=outcome.outputs, summary="fixed")
        if outcome.kind == "hang":
            event = self.in_flight.setdefault(run, asyncio.Event())
            event.set()
            try:
                while True:
                    activity.heartbeat(task_id)
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                self.record(Activity.INVOKE_AGENT, run, cancelled=task_id)
                raise
            finally:
                event.clear()
        if outcome.kind == "rate_limited":
            details = RateLimitDetails(
                retry_after=outcome.retry_after, retry_after_ms=outcome.retry_after_ms,
                response_date=outcome.response_date, observed_at=activity.info().started_time, model=inv.contract.model.name,
                credential=inv.contract.model.credential.secret_name if inv.contract.model.credential else None,
            )  # fmt: skip
            raise ApplicationError(
                "429 Too Many Requests", details, type=AgentError.RATE_LIMITED, non_retryable=True
            )
        if outcome.kind in ("input_required", "credential_expired"):
            kind = (
                AgentError.INPUT_REQUIRED
                if outcome.kind == "input_required"
                else AgentError.CREDENTIAL_EXPIRED
            )
            pause = TaskPause(task_id=task_id, context_id=inv.context_id, message=outcome.message)
            raise ApplicationError(outcome.message or kind.value, pause, type=kind, non_retryable=True)
        kind = {"failed": AgentError.AGENT_FAILED, "invalid": AgentError.INVALID_AGENT_RESPONSE,
                "lost": AgentError.SANDBOX_LOST}[outcome.kind]  # fmt: skip
        raise ApplicationError(outcome.message or kind.value, FailureDetails(message=outcome.message or kind.value,
                               task_id=task_id), type=kind, non_retryable=True)  # fmt: skip

    def activities(self) -> list[Any]:
        return [
            self.claim_work_item, self.fence_work_item, self.renew_claim, self.release_work_item,
            self.acquire_sandbox, self.release_sandbox, self.publish_outputs, self.invoke_agent,
        ]  # fmt: skip

    def bridge_activities(self) -> list[Any]:
        return [self.resolve_references, self.mirror_status]


def run_input(name: str, namespace: str = "ksquad-system", uid: str | None = None, **spec: Any) -> RunInput:
    spec.setdefault("agents", ["dev-1"])
    return RunInput(namespace=namespace, name=name, uid=uid or f"uid-{name}", triggered_by="alice@example.com",
                    spec=parse_run_spec(spec))  # fmt: skip


@asynccontextmanager
async def running_world(env: WorkflowEnvironment, world: World) -> AsyncIterator[Client]:
    """Workers for RunWorkflow, the entity workflows, the world's activities and the bridge queue."""
    client = with_converter(env.client)
    await register_search_attributes(client)
    entities = EntityActivities(client, WORKER_TASK_QUEUE)
    worker = Worker(
        client, task_queue=WORKER_TASK_QUEUE,
        workflows=[RunWorkflow, CredentialThrottleWorkflow, ConcurrencyGateWorkflow],
        activities=[*world.activities(), entities.signal_with_start, entities.find_closed_workflows],
    )  # fmt: skip
    bridge = Worker(client, task_queue=BRIDGE_TASK_QUEUE, activities=world.bridge_activities())
    async with worker, bridge:
        yield client


async def start_run(client: Client, inp: RunInput) -> Any:
    return await client.start_workflow(RunWorkflow.run, inp, id=inp.workflow_id, task_queue=WORKER_TASK_QUEUE)
