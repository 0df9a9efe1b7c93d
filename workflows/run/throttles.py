"""The credential limits a run knows of: its own 429s and other runs' (from each credential's throttle
workflow), and its place in the ramp after each limit, so that the runs one limit paused do not all call the
provider again in the same second. The instant a run may call again is `until[key]`, and only there."""

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.activity_types import reserve_resume_place
from workflows.contract import FairShare
from workflows.entity_types import (
    CredentialLimit,
    CredentialSubscription,
    ResumePlaceRequest,
    ThrottleNotice,
    credential_workflow_id,
)
from workflows.patches import Patches
from workflows.run.options import RETRY_BOOKKEEPING, WarrantOf, call, entity_signal
from workflows.run.outcomes import cause
from workflows.run.state import ThrottleState

# Runs paused before fair ramps replay their place in pause order (store.next_in_line) and never confirm it.
FAIR_RAMP_PATCH = "fair-resume-ramp"


class Throttles:
    def __init__(self, state: ThrottleState, run_id: str, warrant: WarrantOf, patches: Patches) -> None:
        self.state = state
        self.patches = patches
        self.run_id = run_id
        self.warrant = warrant
        self.subscribed: list[str] = []  # credential keys whose throttle workflow knows this run

    def limit(self, key: str, until: datetime) -> None:
        """A limit on `key` until `until`: this run holds no place in the ramp after it yet."""
        current = self.state.until.get(key)
        if current is None or until > current:
            self.state.until[key] = until
            if key not in self.state.unplaced:
                self.state.unplaced.append(key)

    def until(self, key: str) -> datetime | None:
        return self.state.until.get(key)

    def is_throttled(self, key: str) -> bool:
        until = self.state.until.get(key)
        return until is not None and until > workflow.now()

    def moved(self, key: str, until: datetime) -> bool:
        return self.state.until.get(key) != until

    def strike(self, key: str) -> int:
        """One more limit in a row on `key`; returns how many."""
        self.state.strikes[key] = self.state.strikes.get(key, 0) + 1
        return self.state.strikes[key]

    def noticed(self, notice: ThrottleNotice) -> None:
        """Another run's limit, from the credential's throttle workflow."""
        self.limit(notice.key, notice.until)
        self.state.strikes[notice.key] = notice.strikes

    async def take_place(self, key: str, resume_per_second: float, share: FairShare) -> None:
        """This run's turn in the ramp after the limit on `key` (store.ramps: 1/resumePerSecond apart, fair across
        Teams). When the turn comes, the store confirms it: a Team that came since may be ahead, and the run waits
        on. Without the store the run resumes at the limit itself (or at the turn it had)."""
        if key in self.state.unplaced and self.is_throttled(key):
            self.state.unplaced.remove(key)
            limit = self.state.until[key]
            request = ResumePlaceRequest(key=key, until=limit, resume_per_second=resume_per_second)
            if self.patches.patched(FAIR_RAMP_PATCH):
                update = {"run_id": self.run_id, **share.model_dump(), "warrant": self.warrant()}
                request = request.model_copy(update=update)
                self.state.ramps[key] = limit
        elif key in self.state.ramps and not self.is_throttled(key):
            limit = self.state.ramps.pop(key)
            request = ResumePlaceRequest(
                key=key,
                until=limit,
                resume_per_second=resume_per_second,
                run_id=self.run_id,
                **share.model_dump(),
                warrant=self.warrant(),
            )
        else:
            return
        summary = f"turn in the ramp after {key}'s limit"
        try:
            if request.run_id is None:
                turn = await call(reserve_resume_place, request, start_to_close=30, summary=summary)
            else:
                # One store statement, asked again as the turn comes: a local activity, so the server dispatches
                # no task for it and the run calls its model the sooner.
                turn = await workflow.execute_local_activity(
                    reserve_resume_place,
                    request,
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=RETRY_BOOKKEEPING,
                    summary=summary,
                )
        except ActivityError as err:
            workflow.logger.warning("no turn in the ramp after %s: %s", key, cause(err))
            self.state.ramps.pop(key, None)
            return
        if turn > self.state.until.get(key, limit):
            self.state.until[key] = turn
            if request.run_id is not None:
                self.state.ramps[key] = limit

    # --- the credentials' throttle workflows --------------------------------------------------------------

    async def subscribe(self, keys: list[str]) -> list[ThrottleNotice]:
        """Tell each credential's throttle workflow about this run; returns the limits in force right now."""
        notices = []
        for key in keys:
            if key in self.subscribed:
                continue
            notice = await self._signal(key, "subscribe", CredentialSubscription(run_id=self.run_id))
            self.subscribed.append(key)
            if notice is not None:
                notices.append(notice)
        return notices

    async def report(self, key: str, until: datetime) -> None:
        """This run's own 429: every other run on the credential pauses too."""
        self.limit(key, until)
        await self._signal(key, "limited", CredentialLimit(run_id=self.run_id, until=until))

    async def cleared(self, key: str) -> None:
        """A call on `key` succeeded after limits: the credential's backoff starts over."""
        if self.state.strikes.get(key):
            await self._signal(key, "cleared", CredentialSubscription(run_id=self.run_id))

    async def unsubscribe_all(self) -> None:
        for key in self.subscribed:
            await self._signal(key, "unsubscribe", CredentialSubscription(run_id=self.run_id))
        self.subscribed = []

    async def _signal(
        self, key: str, signal: str, arg: CredentialLimit | CredentialSubscription
    ) -> ThrottleNotice | None:
        return await entity_signal(
            self.warrant(), "CredentialThrottle", credential_workflow_id(key), signal, arg
        )
