"""The claim activities of the Run workflow, on the coordination store, and lease keeping for heartbeats.

Errors keep their meaning across the activity boundary: a held item and an unreachable database are
retryable (the workflow's claim deadline bounds the retries), a stale fence is not (the holder lost the item
and must not act as if it had it).
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.metrics import CLAIM_SECONDS, since_scheduled
from store import Holder, StaleFence, Store, StoreError, StoreUnavailable, WorkItemHeld, work_item_key
from workflows.activity_types import (
    Activity,
    AttemptFence,
    Claim,
    ClaimRequest,
    ClaimUpdate,
    RunEnding,
    RunRef,
)

log = logging.getLogger(__name__)

STALE_FENCE = "StaleFence"
WORK_ITEM_HELD = "WorkItemHeld"
STORE_UNAVAILABLE = "StoreUnavailable"


def holder_of(run: RunRef) -> Holder:
    return Holder(uid=run.uid, run=f"{run.namespace}/{run.name}", triggered_by=run.triggered_by)


def as_activity_error(err: StoreError) -> ApplicationError:
    """The store's errors as activity failures: retryable unless the fence is stale."""
    if isinstance(err, StaleFence):
        return ApplicationError(str(err), type=STALE_FENCE, non_retryable=True)
    if isinstance(err, WorkItemHeld):
        return ApplicationError(str(err), type=WORK_ITEM_HELD)
    return ApplicationError(str(err), type=STORE_UNAVAILABLE)


@contextlib.contextmanager
def store_errors_as_activity_errors() -> Iterator[None]:
    """The body's store errors leave as activity failures (`as_activity_error`)."""
    try:
        yield
    except StoreError as err:
        raise as_activity_error(err) from None


class ClaimActivities:
    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name=Activity.CLAIM_WORK_ITEM)
    async def claim_work_item(self, req: ClaimRequest) -> Claim:
        try:
            # Asked first: a store that fails here has claimed nothing, and the retried activity asks again.
            item = await self.store.find_item(req.run.namespace, req.work_item_ref) is not None
            result = await self.store.claim(
                work_item_key(req.run.namespace, req.work_item_ref), holder_of(req.run), req.lease_seconds
            )
        except (WorkItemHeld, StoreUnavailable) as err:
            outcome = "held" if isinstance(err, WorkItemHeld) else "error"
            CLAIM_SECONDS.labels(outcome).observe(since_scheduled())
            raise as_activity_error(err) from None  # the message says it all; a chain would not fit
        CLAIM_SECONDS.labels("claimed").observe(since_scheduled())
        if result.took_over_from:
            log.info(
                "%s: took %s over from expired holder %s",
                req.run.name,
                req.work_item_ref,
                result.took_over_from,
            )
        return Claim(
            work_item_ref=req.work_item_ref,
            fence=result.fence,
            lease_expires_at=result.lease_expires_at,
            item=item,
        )

    @activity.defn(name=Activity.FENCE_WORK_ITEM)
    async def fence_work_item(self, upd: ClaimUpdate) -> Claim:
        try:
            fence = await self.store.fence_bump(
                work_item_key(upd.run.namespace, upd.work_item_ref), holder_of(upd.run), upd.fence
            )
        except (StaleFence, StoreUnavailable) as err:
            raise as_activity_error(err) from None  # the message says it all; a chain would not fit
        return Claim(work_item_ref=upd.work_item_ref, fence=fence)

    @activity.defn(name=Activity.RENEW_CLAIM)
    async def renew_claim(self, upd: ClaimUpdate) -> Claim:
        try:
            until = await self.store.renew(
                work_item_key(upd.run.namespace, upd.work_item_ref),
                holder_of(upd.run),
                upd.fence,
                upd.lease_seconds,
            )
        except (StaleFence, StoreUnavailable) as err:
            raise as_activity_error(err) from None  # the message says it all; a chain would not fit
        return Claim(work_item_ref=upd.work_item_ref, fence=upd.fence, lease_expires_at=until)

    @activity.defn(name=Activity.RELEASE_WORK_ITEM)
    async def release_work_item(self, upd: ClaimUpdate) -> None:
        try:
            await self.store.release(
                work_item_key(upd.run.namespace, upd.work_item_ref), holder_of(upd.run), upd.fence
            )
        except (StaleFence, StoreUnavailable) as err:
            raise as_activity_error(err) from None  # the message says it all; a chain would not fit

    @activity.defn(name=Activity.FENCE_ATTEMPT)
    async def fence_attempt(self, req: AttemptFence) -> None:
        """The attempt ended: the fence of a Run without a work item moves past it now, not when the next
        attempt's agent call begins, so an agent that did not hear its cancel is refused meanwhile too."""
        with store_errors_as_activity_errors():
            await self.store.begin_attempt(holder_of(req.run), req.attempt + 1)

    @activity.defn(name=Activity.RECORD_RUN_ENDING)
    async def record_run_ending(self, req: RunEnding) -> None:
        """The Run's ending on its work item, once, as the orchestrator (whatever the agent wrote or did not:
        failed before it ran, cancelled, timed out, refused a budget); then its agent's checkpoints are forgotten,
        since no attempt will resume from them. A Run without a work item moves its fence past its last attempt
        first: that attempt's token (good for hours) acts no more, as an item's released claim refuses its own."""
        run, ref = req.run, req.warrant.envelope.spec.work_item_ref
        with store_errors_as_activity_errors():
            if ref is not None:
                message = f"{run.namespace}/{run.name} ended {req.phase} ({req.reason})"
                message += f" after {req.attempt} attempt{'s' if req.attempt != 1 else ''}"
                await self.store.record_ending(
                    run.namespace, ref, holder_of(run), req.attempt, req.phase, req.reason, message
                )
            else:
                await self.store.begin_attempt(holder_of(run), req.attempt + 1)
            await self.store.forget_checkpoints(run.uid)

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.claim_work_item,
            self.fence_work_item,
            self.renew_claim,
            self.release_work_item,
            self.fence_attempt,
            self.record_run_ending,
        ]


@dataclass
class Lease:
    """The state of a lease kept alive in the background (see `keep_lease`)."""

    lost: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""
    renewals: int = 0


@contextlib.asynccontextmanager
async def keep_lease(
    store: Store, work_item_ref: str | None, holder: Holder, fence: int, lease_seconds: float, every: float
) -> AsyncIterator[Lease]:
    """Renew the claim's lease every `every` seconds while the body runs (the Running activity's heartbeat).

    If the fence moved on (another holder took the item), `lease.lost` is set and renewing stops: the body
    must stop acting for the run. A database outage is retried at the next tick; the lease lasts meanwhile.
    """
    lease = Lease()
    if work_item_ref is None:
        yield lease
        return

    async def renew() -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await store.renew(work_item_ref, holder, fence, lease_seconds)
                lease.renewals += 1
            except StaleFence as err:
                lease.reason = str(err)
                lease.lost.set()
                return
            except StoreUnavailable as err:
                log.warning("renewing %s: %s (retrying)", work_item_ref, err)

    task = asyncio.create_task(renew())
    try:
        yield lease
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
