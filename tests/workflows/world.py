"""Test-only stand-ins for the Run workflow's activities: a scripted, recording world.

The real activities (claims on SQL, sandboxes on Kubernetes, agents over A2A, the bridge) arrive with their
own issues and are tested against real components there. Here each activity is a small in-memory model
that enforces the same rules (one claim holder, fences, sandboxes that exist until deleted) and records every
call in order, so a test can assert what happened and in which order. The entity activities (messages to
the credential and gate workflows) are the real ones: they talk to the real Temporal test server.
"""

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from temporal_client.connection import connect, register_search_attributes, with_converter, with_signing
from temporal_client.proofs import Signing
from temporal_client.seal import Sealer
from worker.registry import build_worker
from workflows.activity_types import (
    BRIDGE_TASK_QUEUE,
    WORKER_TASK_QUEUE,
    Activity,
    AgentError,
    AgentInvocation,
    AgentResult,
    AttemptFence,
    Claim,
    ClaimRequest,
    ClaimUpdate,
    FailureDetails,
    OutputsRequest,
    PublishedOutputs,
    RateLimitDetails,
    ResolveRequest,
    RunEnding,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
    TaskPause,
)
from workflows.contract import ConcurrencyScope, CredentialRef, FairShare, ModelRef, Resolution, ResolvedAgent
from workflows.entity_types import ResumePlaceRequest
from workflows.inbox import Sender
from workflows.run import RunInput, RunWorkflow
from workflows.spec import parse_run_spec
from workflows.status import PhaseEvent, RunStatus, StatusSnapshot

WORLD_KEY = secrets.token_bytes(32)
WORLD_SEALER = Sealer(WORLD_KEY)


@dataclass
class Outcome:
    """What the scripted agent does with one invocation."""

    kind: str  # ok | block | hang | rate_limited | input_required | credential_expired | failed | invalid | lost
    outputs: dict[str, str] = field(default_factory=dict)
    retry_after: str | None = None
    retry_after_date: float | None = None  # Retry-After as an HTTP-date this many seconds after the response
    blocks: bool = False  # wait for `world.release(run)` before answering
    retry_after_ms: str | None = None
    response_date: str | None = None
    message: str = ""


def ok(**outputs: str) -> Outcome:
    return Outcome("ok", outputs=outputs or {"result": "done"})


def rate_limited(retry_after: str | None = None, **kw: Any) -> Outcome:
    return Outcome("rate_limited", retry_after=retry_after, **kw)


def failed(message: str = "the tests still fail", kind: str = "failed", blocks: bool = False) -> Outcome:
    return Outcome(kind, message=message, blocks=blocks)


def hang() -> Outcome:
    """Heartbeats until cancelled."""
    return Outcome("hang")


def block() -> Outcome:
    """Heartbeats until the test calls `world.release(run)`, then succeeds."""
    return Outcome("block")


@dataclass
class Call:
    activity: str
    run: str
    detail: dict[str, Any]
    at: datetime
    # A local activity's clock is the machine's, not the time-skipping server's: its `at` is not comparable.
    local: bool = False


def agent(
    name: str,
    secret: str,
    fallback: tuple[str, str] | None = None,
    endpoint: str | None = None,
    project_fallback: tuple[str, str] | None = None,
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
        project_fallback_model=(
            ModelRef(
                name=project_fallback[0],
                url="http://model.test/v1",
                credential=CredentialRef(secret_name=project_fallback[1]),
            )
            if project_fallback
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
        self.broken: dict[str, str] = {}  # run name -> why publishing its outputs fails for good
        # the ramps: credential@limit -> run -> its place (in arrival order; store.ramps orders by Team too)
        self.resume_places: dict[str, dict[str, int]] = {}
        self.scopes: dict[str, list[ConcurrencyScope]] = {}  # run name -> scopes it counts against
        self.shares: dict[str, FairShare] = {}  # run name -> its Team and weight (none: FairShare())
        self.scripts: dict[str, list[Outcome]] = {}  # run name -> outcomes, one per invocation
        self.default_outcome = ok()
        self.claims: dict[str, tuple[str, int]] = {}  # work item -> (holder run, fence)
        self.fences: dict[str, int] = {}  # work item -> latest fence ever issued
        self.sandboxes: set[str] = set()
        self.mirrored: dict[str, list[RunStatus]] = {}
        self.events: dict[str, list[PhaseEvent]] = {}  # every state change, as the bridge gets them
        self.sandbox_fails: dict[str, int] = {}  # run name -> how many acquisitions fail
        self.unschedulable: set[str] = set()  # run names whose sandbox's pod never gets a node
        self.cancelled: list[str] = []  # agent tasks cancelled mid-flight
        self.entered: dict[tuple[str, str], asyncio.Event] = {}  # (activity, run) -> set once it started
        self.released: dict[str, asyncio.Event] = {}  # run name -> set by the test to end a `block`
        self.blocked_claims: set[str] = set()  # runs whose claims hang until cancelled
        self.stalled_mirrors: dict[str, int] = {}  # run name -> how many status writes hang (then fail)
        self.slow_renewals: dict[str, float] = {}  # run name -> seconds each lease renewal takes to answer
        # The key the world's bridge seals envelopes and resolutions and signs signals with, as the worker checks
        # them (one per test process: start_run seals with it).
        self.sealer = WORLD_SEALER

    def _entered(self, name: Activity, run: str) -> asyncio.Event:
        return self.entered.setdefault((name.value, run), asyncio.Event())

    async def wait_entered(self, name: Activity, run: str, within: float = 20) -> None:
        await asyncio.wait_for(self._entered(name, run).wait(), within)

    def release(self, run: str) -> None:
        self.released.setdefault(run, asyncio.Event()).set()

    async def until(self, what: str, predicate: Callable[[], bool], within: float = 20) -> None:
        """Wait (real time: the test server does not skip time meanwhile) until `predicate` holds."""
        deadline = asyncio.get_running_loop().time() + within
        while not predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.02)

    def last(self, run: str) -> RunStatus | None:
        statuses = self.mirrored.get(run)
        return statuses[-1] if statuses else None

    def phases(self, run: str) -> list[str]:
        return [s.phase.value for s in self.mirrored.get(run, [])]

    async def until_phase(self, run: str, phase: str, within: float = 20) -> RunStatus:
        try:
            await self.until(
                f"{run} to be {phase}", lambda: (s := self.last(run)) is not None and s.phase == phase, within
            )
        except AssertionError as timed_out:
            last = self.last(run)
            seen = f"{self.phases(run)}, last: {last.message if last else None!r}, calls: {self.calls_of_run(run)}"
            raise AssertionError(f"{timed_out} (phases mirrored: {seen})") from None
        status = self.last(run)
        assert status is not None
        return status

    def record(self, name: Activity, run: str, **detail: Any) -> None:
        """Record a call at the server's clock (which the time-skipping server moves), and mark it entered."""
        self.calls.append(Call(name.value, run, detail, server_now(), activity.info().is_local))
        self._entered(name, run).set()

    def calls_of_run(self, run: str) -> list[str]:
        return [c.activity for c in self.calls if c.run == run]

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
        resolution = Resolution(
            outcome="resolved",
            agents=[self.agents[n] for n in names],
            scopes=self.scopes.get(run, []),
            share=self.shares.get(run, FairShare()),
        )
        # As the bridge does: for the execution asking (here, its run: the world resolves before any
        # continue-as-new), which the worker checks every acting activity against.
        return self.sealer.seal_warrant(req.envelope, activity.info().workflow_run_id or "", resolution)

    @activity.defn(name=Activity.MIRROR_STATUS)
    async def mirror_status(self, snapshot: StatusSnapshot) -> None:
        if self.stalled_mirrors.get(snapshot.name, 0) > 0:
            self.stalled_mirrors[snapshot.name] -= 1
            await asyncio.sleep(45)  # an API server that never answers this one write
            raise ApplicationError("the write hung")
        self.mirrored.setdefault(snapshot.name, []).append(snapshot.status)
        self.events.setdefault(snapshot.name, []).extend(snapshot.events)

    # --- claims -------------------------------------------------------------------------------------------

    @activity.defn(name=Activity.CLAIM_WORK_ITEM)
    async def claim_work_item(self, req: ClaimRequest) -> Claim:
        if req.run.name in self.blocked_claims:
            self.record(Activity.CLAIM_WORK_ITEM, req.run.name, blocked=True)
            await heartbeat_until_cancelled()
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
            raise ApplicationError(
                f"{what}: stale fence {upd.fence} (holder {holder})", type="StaleFence", non_retryable=True
            )

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
        if upd.run.name in self.slow_renewals:
            await asyncio.sleep(self.slow_renewals[upd.run.name])  # a claim store slow to answer
        return Claim(work_item_ref=upd.work_item_ref, fence=upd.fence)

    @activity.defn(name=Activity.RELEASE_WORK_ITEM)
    async def release_work_item(self, upd: ClaimUpdate) -> None:
        self._check(upd, Activity.RELEASE_WORK_ITEM)
        del self.claims[upd.work_item_ref]
        self.record(Activity.RELEASE_WORK_ITEM, upd.run.name, fence=upd.fence)

    @activity.defn(name=Activity.FENCE_ATTEMPT)
    async def fence_attempt(self, req: AttemptFence) -> None:
        self.record(Activity.FENCE_ATTEMPT, req.run.name, attempt=req.attempt)

    @activity.defn(name=Activity.RECORD_RUN_ENDING)
    async def record_run_ending(self, req: RunEnding) -> None:
        self.record(Activity.RECORD_RUN_ENDING, req.run.name, phase=req.phase, reason=req.reason)

    # --- sandboxes and outputs ----------------------------------------------------------------------------

    @activity.defn(name=Activity.ACQUIRE_SANDBOX)
    async def acquire_sandbox(self, req: SandboxRequest) -> Sandbox:
        run = req.contract.run.name
        if self.sandbox_fails.get(run, 0) > 0:
            self.sandbox_fails[run] -= 1
            self.record(Activity.ACQUIRE_SANDBOX, run, failed=True)
            raise ApplicationError(
                "ImagePullBackOff: image agent:missing not found", type="SandboxFailed", non_retryable=True
            )
        name = f"{run}-exec-{req.contract.run.attempt}"
        while (
            run in self.unschedulable
        ):  # as the Kubernetes backend waits: heartbeating what the pod waits for
            activity.heartbeat(
                {"job": name, "waiting": f"pod {name}-x cannot be scheduled: 0/1 nodes are available"}
            )
            await asyncio.sleep(0.2)
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
        if req.run.name in self.broken:
            raise ApplicationError(self.broken[req.run.name], type="Broken", non_retryable=True)
        return PublishedOutputs(outputs=req.outputs, config_map=f"{req.run.name}-outputs")

    @activity.defn(name=Activity.RESERVE_RESUME_PLACE)
    async def reserve_resume_place(self, req: ResumePlaceRequest) -> datetime:
        """activities.entities.ResumePlaces in arrival order (the world has no database): a run asking again when
        its turn comes finds it where it was."""
        places = self.resume_places.setdefault(f"{req.key}@{req.until.isoformat()}", {})
        place = places.setdefault(req.run_id or f"unnamed-{len(places)}", len(places) + 1)
        return req.until + timedelta(seconds=(place - 1) / req.resume_per_second)

    # --- the agent ----------------------------------------------------------------------------------------

    @activity.defn(name=Activity.INVOKE_AGENT)
    async def invoke_agent(self, inv: AgentInvocation) -> AgentResult:
        run = inv.contract.run.name
        script = self.scripts.get(run, [])
        outcome = script.pop(0) if script else self.default_outcome
        self.record(
            Activity.INVOKE_AGENT,
            run,
            message_id=inv.message_id,
            model=inv.contract.model.name,
            agent=inv.contract.agent.name,
            outcome=outcome.kind,
            fence=inv.contract.run.fence,
            follow_up=inv.continue_task.model_dump() if inv.continue_task else None,
        )
        task_id = f"task-{inv.message_id}"
        if outcome.kind in ("hang", "block") or outcome.blocks:
            try:
                if outcome.kind == "hang":
                    await heartbeat_until_cancelled()
                released = self.released.setdefault(run, asyncio.Event())
                while not released.is_set():
                    activity.heartbeat(task_id)
                    await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                self.cancelled.append(task_id)
                raise
            released.clear()
        if outcome.kind in ("ok", "block"):
            return AgentResult(task_id=task_id, outputs=outcome.outputs, summary="fixed")
        if outcome.kind == "rate_limited":
            now = server_now()
            retry_after, response_date = outcome.retry_after, outcome.response_date
            if outcome.retry_after_date is not None:
                retry_after = format_datetime(now + timedelta(seconds=outcome.retry_after_date), usegmt=True)
                response_date = format_datetime(now, usegmt=True)
            details = RateLimitDetails(
                retry_after=retry_after,
                retry_after_ms=outcome.retry_after_ms,
                response_date=response_date,
                observed_at=now,
                model=inv.contract.model.name,
                credential=inv.contract.model.credential.secret_name
                if inv.contract.model.credential
                else None,
            )
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
        kind = {
            "failed": AgentError.AGENT_FAILED,
            "invalid": AgentError.INVALID_AGENT_RESPONSE,
            "lost": AgentError.SANDBOX_LOST,
        }[outcome.kind]
        raise ApplicationError(
            outcome.message or kind.value,
            FailureDetails(message=outcome.message or kind.value, task_id=task_id),
            type=kind,
            non_retryable=True,
        )

    def activities(self) -> list[Any]:
        return [
            self.claim_work_item,
            self.fence_work_item,
            self.renew_claim,
            self.release_work_item,
            self.fence_attempt,
            self.record_run_ending,
            self.acquire_sandbox,
            self.release_sandbox,
            self.publish_outputs,
            self.invoke_agent,
            self.reserve_resume_place,
        ]

    def bridge_activities(self) -> list[Any]:
        return [self.resolve_references, self.mirror_status]


def activity_name(fn: Any) -> str:
    definition = activity._Definition.from_callable(fn)
    assert definition is not None
    assert definition.name is not None
    return definition.name


def server_now() -> datetime:
    """The Temporal server's clock as the running activity sees it (skipped time included)."""
    return activity.info().current_attempt_scheduled_time or datetime.now(UTC)


async def heartbeat_until_cancelled() -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(0.02)


def run_input(name: str, namespace: str = "ksquad-system", uid: str | None = None, **spec: Any) -> RunInput:
    spec.setdefault("agents", ["dev-1"])
    return RunInput(
        namespace=namespace,
        name=name,
        uid=uid or f"uid-{name}",
        triggered_by="alice@example.com",
        spec=parse_run_spec(spec),
    )


@asynccontextmanager
async def running_world(env: WorkflowEnvironment, world: World) -> AsyncIterator[Client]:
    """Workers for RunWorkflow, the entity workflows, the world's activities and the bridge queue."""
    async with serving(with_converter(env.client), world) as client:
        yield client


@asynccontextmanager
async def running_world_on(target: str, world: World, real: Sequence[Any] = ()) -> AsyncIterator[Client]:
    """The same against a server at `target` (the dev server); `real` activities replace the world's."""
    async with serving(await connect(target), world, real) as client:
        yield client


@asynccontextmanager
async def serving(client: Client, world: World, real: Sequence[Any] = ()) -> AsyncIterator[Client]:
    await register_search_attributes(client)
    replaced = {activity_name(a) for a in real}
    fakes = [a for a in world.activities() if activity_name(a) not in replaced]
    worker = build_worker(client, WORKER_TASK_QUEUE, [*fakes, *real], sealer=world.sealer)
    bridge = Worker(client, task_queue=BRIDGE_TASK_QUEUE, activities=world.bridge_activities())
    async with worker, bridge:
        # The test sends signals as the bridge does (with its proof); see tests/workflows/test_signals.py for
        # those sent without.
        yield with_signing(client, world.sealer, Signing(Sender.BRIDGE))


async def start_run(
    client: Client, inp: RunInput, sealer: Sealer | None = None
) -> WorkflowHandle[RunWorkflow, RunStatus]:
    """Start the Run's workflow as the bridge does: its envelope sealed (with the world's key, `sealer`)."""
    sealed = (sealer or WORLD_SEALER).seal_envelope(inp)
    return await client.start_workflow(
        RunWorkflow.run, sealed, id=inp.workflow_id, task_queue=WORKER_TASK_QUEUE
    )
