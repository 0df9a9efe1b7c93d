"""The timed waits between attempts, each one durable timer and no calls: Paused(RateLimited) before an attempt,
until the credential's turn after its limit (bounded by timeouts.rateLimitedSeconds over all such pauses), and
the retry backoff after a failed attempt (the retry policy's jittered delay, while retries are left)."""

import functools

from temporalio import workflow

from workflows import metrics
from workflows.entity_types import DEFAULT_RESUME_PER_SECOND
from workflows.policies import equal_jitter_backoff
from workflows.run.interrupts import CANCEL_OR_PAUSE, Interrupt, Interrupted, Interrupts
from workflows.run.mirror import StatusMirror
from workflows.run.options import later
from workflows.run.outcomes import AttemptFailed, RunFailed
from workflows.run.pauses import Pauses
from workflows.run.route import Router
from workflows.run.throttles import Throttles
from workflows.spec import RunSpec
from workflows.status import PauseReason, Phase


class Backoff:
    def __init__(
        self,
        spec: RunSpec,
        mirror: StatusMirror,
        interrupts: Interrupts,
        route: Router,
        throttles: Throttles,
        pauses: Pauses,
    ) -> None:
        self.spec = spec
        self.mirror = mirror
        self.interrupts = interrupts
        self.route = route
        self.throttles = throttles
        self.pauses = pauses

    async def while_throttled(self) -> None:
        """Paused(RateLimited) until the credential's resumeAt: one durable timer, no calls meanwhile."""
        while True:
            key = self.route.credential_key()
            await self.throttles.take_place(
                key,
                self.route.model().resume_per_second or DEFAULT_RESUME_PER_SECOND,
                self.route.share(),
            )
            until = self.throttles.until(key)
            now = workflow.now()
            if until is None or until <= now:
                # A notice that came while no attempt was in flight (a continued-as-new run's status still says
                # Running when it subscribes again) has been waited out here: it must not end the next attempt.
                if self.interrupts.pending == Interrupt.THROTTLED:
                    self.interrupts.pending = None
                return
            bound = self.spec.timeouts.rate_limited_seconds
            budget = bound - self.throttles.state.waited_seconds
            if budget <= 0:
                raise RunFailed(
                    "RateLimitedTimeout",
                    f"{key} kept answering 429: rate limited for timeouts.rateLimitedSeconds ({bound}s) in all",
                )
            status = self.mirror.status  # read before the move below replaces it
            if status.phase != Phase.PAUSED or status.resume_at != until:
                if status.pause_reason != PauseReason.RATE_LIMITED:
                    metrics.rate_limit_paused(key)
                self.mirror.move(
                    Phase.PAUSED,
                    pause_reason=PauseReason.RATE_LIMITED,
                    reason="RateLimited",
                    resume_at=until,
                    message=f"{key} is rate limited; resuming at {until.isoformat()}",
                )
            try:
                await self.interrupts.interruptible(
                    workflow.wait_condition(
                        functools.partial(self.throttles.moved, key, until),
                        timeout=min((until - now).total_seconds(), budget),
                        timeout_summary=f"rate limited: resume at {until.isoformat()}",
                    ),
                    CANCEL_OR_PAUSE,
                )
            except TimeoutError:
                if workflow.now() >= until:
                    metrics.resumed_late(key, workflow.now() - until)
            except Interrupted as interrupted:
                self.throttles.state.waited_seconds += (workflow.now() - now).total_seconds()
                await self.pauses.hold_or_raise(interrupted)
                continue
            self.throttles.state.waited_seconds += (workflow.now() - now).total_seconds()

    async def retry_or_fail(self, failed: AttemptFailed) -> None:
        """After a failed attempt: RunFailed once the retry policy's retries are spent, else Pending(RetryBackoff)
        for its jittered delay; a pause meanwhile holds the run, then the next attempt claims."""
        policy = self.spec.retry_policy
        status = self.mirror.status  # read before the move below replaces it
        status.retries += 1
        retry = status.retries
        if retry > policy.max_retries:
            raise RunFailed(failed.reason, f"{failed.message} (after {policy.max_retries} retries)")
        delay = equal_jitter_backoff(
            retry, policy.backoff_seconds, policy.max_backoff_seconds, workflow.random().random()
        )
        resume_at = later(delay)
        self.mirror.move(
            Phase.PENDING,
            reason="RetryBackoff",
            resume_at=resume_at,
            message=f"attempt {status.attempt} failed ({failed.reason}: {failed.message}); "
            f"retry {retry} of {policy.max_retries} at {resume_at.isoformat()}",
        )
        try:
            await self.interrupts.interruptible(
                workflow.sleep(delay, summary=f"backoff before retry {retry}"), CANCEL_OR_PAUSE
            )
        except Interrupted as interrupted:
            await self.pauses.hold_or_raise(interrupted)
