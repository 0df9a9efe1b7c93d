"""What an attempt holds: the work item's claim (its fence) and the sandbox its agent runs in. Letting go is
fence-then-release: bump the fence (the old holder's writes are rejected from then on), delete the sandbox and,
when fenced, confirm it is gone, then release the claim; shielded, so that a cancellation waits for it."""

import asyncio
import contextlib
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as TemporalTimeoutError
from temporalio.workflow import ActivityCancellationType

from workflows.activity_types import (
    CLAIM_LEASE_SECONDS,
    SANDBOX_MISCONFIGURED,
    AttemptFence,
    ClaimRequest,
    ClaimUpdate,
    RunRef,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
    acquire_sandbox,
    claim_work_item,
    fence_attempt,
    fence_work_item,
    release_sandbox,
    release_work_item,
    renew_claim,
)
from workflows.patches import Patches
from workflows.run.interrupts import ANY_INTERRUPT, Interrupts
from workflows.run.mirror import StatusMirror
from workflows.run.options import (
    AGENT_HEARTBEAT_TIMEOUT,
    WarrantOf,
    call,
    call_local,
    start,
    tenant_priority,
)
from workflows.run.outcomes import AttemptFailed, RunFailed, cause, refusal
from workflows.spec import RunSpec
from workflows.status import ConditionType, WorkItemStatus

# What stops claiming and starting a sandbox: every interrupt (a throttle too: the attempt would only wait).

# A Temporal cancel that arrives while a pause renews the claim waits for the renewal, then goes on up as itself
# (workflow.patched: runs that cancelled the renewal with it before replay as they ran).
RENEWAL_SHIELDED_PATCH = "renewal-shielded-from-cancel"
# A Run without a work item fences an ended attempt in its teardown (workflow.patched: runs whose teardown did not
# replay as they ran; their next attempt's agent call moved the fence).
FENCE_ATTEMPT_PATCH = "fence-attempt-without-item"


class Holdings:
    def __init__(
        self,
        run: RunRef,
        spec: RunSpec,
        claim_fence: int | None,
        mirror: StatusMirror,
        interrupts: Interrupts,
        warrant: WarrantOf,
        patches: Patches,
    ) -> None:
        self.run = run
        self.patches = patches
        self.warrant = warrant
        self.work_item = spec.work_item_ref
        self.claim_seconds = spec.timeouts.claim_seconds
        self.claim_fence = claim_fence  # carried over continue-as-new (a pause keeps the claim)
        self.sandbox: Sandbox | None = None
        self.mirror = mirror
        self.interrupts = interrupts

    async def claim(self, attempt: int, deadline: datetime) -> int:
        """Claim the work item for this attempt; returns the fence its writes carry."""
        ref = self.work_item
        if ref is None:  # no work item: writes are still fenced, by attempt
            return attempt
        request = ClaimRequest(warrant=self.warrant(), attempt=attempt, lease_seconds=CLAIM_LEASE_SECONDS)
        try:
            claim = await self.interrupts.interruptible(
                call(claim_work_item, request, deadline=deadline, summary=f"claim {ref}"), ANY_INTERRUPT
            )
        except ActivityError as err:
            if refused := refusal(err):
                raise RunFailed(refused, cause(err)) from err
            raise RunFailed(
                "ClaimTimeout",
                f"could not claim {ref} within timeouts.claimSeconds ({self.claim_seconds}s): {cause(err)}",
            ) from err
        self.claim_fence = claim.fence
        self.mirror.status.work_item = WorkItemStatus(ref=ref, fence=claim.fence, item=claim.item)
        self.mirror.condition(ConditionType.WORK_ITEM_CLAIMED, True, "Claimed", f"{ref} fence {claim.fence}")
        return claim.fence

    async def acquire_sandbox(self, request: SandboxRequest, deadline: datetime, attempt: int) -> Sandbox:
        try:
            self.sandbox = await self.interrupts.interruptible(
                call(
                    acquire_sandbox,
                    request,
                    deadline=deadline,
                    heartbeat=AGENT_HEARTBEAT_TIMEOUT,
                    summary=f"sandbox for attempt {attempt}",
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    priority=tenant_priority(self.run.namespace),
                ),
                ANY_INTERRUPT,
            )
        except ActivityError as err:
            if refused := refusal(err):
                raise RunFailed(refused, cause(err)) from err
            if isinstance(err.cause, ApplicationError) and err.cause.type == SANDBOX_MISCONFIGURED:
                raise RunFailed(err.cause.type, cause(err)) from err  # what cannot work is not retried
            if (
                isinstance(err.cause, TemporalTimeoutError)
                and err.cause.type == TimeoutType.SCHEDULE_TO_CLOSE
            ):
                # The phase's bound, not the sandbox's own failure: say what its pod was waiting for then.
                raise AttemptFailed(
                    "ClaimTimeout",
                    f"no sandbox within timeouts.claimSeconds ({self.claim_seconds}s): {waiting_for(err.cause)}",
                ) from err
            raise AttemptFailed("SandboxFailed", cause(err)) from err
        self.hold_sandbox(self.sandbox)
        return self.sandbox

    def hold_sandbox(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        self.mirror.condition(ConditionType.SANDBOX_READY, True, sandbox.kind.capitalize(), sandbox.name)
        self.mirror.status.sandbox = sandbox.status

    async def teardown(self, fence: bool = True, release: bool = True) -> None:
        """Fence-then-release. Raises RunFailed when any step cannot be done: a retry must never start while
        the old holder may still act. Shielded: a cancellation that arrives meanwhile waits until it is done."""
        steps = asyncio.ensure_future(self._teardown_steps(fence, release))
        try:
            await asyncio.shield(steps)
        except asyncio.CancelledError:
            await steps
            raise

    async def _teardown_steps(self, fence: bool, release: bool) -> None:
        try:
            if fence and self.claim_fence is not None and self.work_item is not None:
                update = ClaimUpdate(warrant=self.warrant(), fence=self.claim_fence)
                fenced = await call(fence_work_item, update, summary=f"fence {self.work_item}")
                self.claim_fence = fenced.fence
                assert self.mirror.status.work_item is not None
                self.mirror.status.work_item.fence = fenced.fence
            elif (
                fence
                and self.work_item is None
                and self.mirror.status.attempt
                and self.patches.patched(FENCE_ATTEMPT_PATCH)
            ):
                attempt = self.mirror.status.attempt
                request = AttemptFence(warrant=self.warrant(), attempt=attempt)
                await call_local(fence_attempt, request, summary=f"fence off attempt {attempt}")
            await self.release_sandbox(confirm=fence)
            if release:
                await self.release_claim()
        except ActivityError as err:
            if self.sandbox is not None:  # not confirmed gone: its agent may still be at work in it
                message = f"its sandbox {self.sandbox.name} was not confirmed gone: {cause(err)}"
                self.mirror.condition(ConditionType.AGENT_STOPPED, False, "SandboxNotGone", message[:1000])
            raise RunFailed("TeardownFailed", f"could not fence and release safely: {cause(err)}") from err

    async def release_sandbox(self, confirm: bool) -> None:
        sandbox = self.sandbox
        if sandbox is None:
            return
        if sandbox.kind != "external":
            await call(
                release_sandbox,
                SandboxRelease(warrant=self.warrant(), sandbox=sandbox, confirm=confirm),
                start_to_close=300,
                heartbeat=AGENT_HEARTBEAT_TIMEOUT,
                summary=f"delete sandbox {sandbox.name}" + (" and confirm it is gone" if confirm else ""),
            )
        self.mirror.condition(ConditionType.SANDBOX_READY, False, "Released", sandbox.name)
        stopped = self.mirror.status.condition(ConditionType.AGENT_STOPPED)
        if confirm and sandbox.kind != "external" and stopped is not None and stopped.status == "False":
            # The agent that did not confirm its cancel ran in this sandbox, now deleted and seen gone.
            message = f"its sandbox {sandbox.name} was deleted and is gone ({stopped.message})"
            self.mirror.condition(ConditionType.AGENT_STOPPED, True, "SandboxGone", message)
        self.sandbox = None
        self.mirror.status.sandbox = None

    async def release_claim(self) -> None:
        ref = self.work_item
        if ref is None or self.claim_fence is None:
            return
        update = ClaimUpdate(warrant=self.warrant(), fence=self.claim_fence)
        await call(release_work_item, update, summary=f"release {ref}")
        self.mirror.condition(ConditionType.WORK_ITEM_CLAIMED, False, "Released", ref)
        self.claim_fence = None

    async def renew_for(self, until: datetime) -> None:
        """A pause holds the claim: extend the lease to cover it (heartbeats are not renewing it). Shielded, as
        teardown is: a Temporal cancel that arrives meanwhile waits for the renewal, then goes on up. Cancelled with
        the run, the renewal ended in an ActivityError that ended the run Failed instead of Cancelled (and a
        cancel request for a renewal that had just completed was refused by the test server: the run hung)."""
        ref = self.work_item
        if ref is None or self.claim_fence is None:
            return
        lease = int((until - workflow.now()).total_seconds()) + CLAIM_LEASE_SECONDS
        update = ClaimUpdate(warrant=self.warrant(), fence=self.claim_fence, lease_seconds=lease)
        renewal = start(renew_claim, update, summary=f"hold {ref} through the pause")
        try:
            await asyncio.shield(renewal)
        except asyncio.CancelledError:
            if not self.patches.patched(RENEWAL_SHIELDED_PATCH):
                # Recorded before the patch: the renewal was cancelled with the run, and replays the same way.
                renewal.cancel()
                await renewal
                return
            with contextlib.suppress(ActivityError):
                await renewal  # renewed or not: the cancellation's teardown releases the claim next
            raise


def waiting_for(timeout: TemporalTimeoutError) -> str:
    """What acquire_sandbox's last heartbeat said its pod was waiting for ("pod ... cannot be scheduled: ...")."""
    details = timeout.last_heartbeat_details
    last = details[0] if details and isinstance(details[0], dict) else {}
    return str(last.get("waiting") or "nothing said yet")[:1000]
