"""Pending: a Run's references (Agents, ModelEndpoints, Team, Project, credentials) resolved by the bridge.
Missing ones are named in a condition and waited for, until the bridge says one changed or a backoff passes."""

import contextlib

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows.activity_types import BRIDGE_TASK_QUEUE, ResolveRequest, resolve_references
from workflows.contract import Resolution
from workflows.envelope import RunEnvelope
from workflows.run.interrupts import CANCEL_OR_PAUSE, Interrupts
from workflows.run.mirror import StatusMirror
from workflows.run.options import call, later
from workflows.run.outcomes import RunFailed, cause, refusal
from workflows.status import ConditionType, Phase

RETRY_MAX_SECONDS = 30.0


class References:
    def __init__(self, envelope: RunEnvelope, mirror: StatusMirror, interrupts: Interrupts) -> None:
        self.request = ResolveRequest(envelope=envelope)
        self.claim_seconds = envelope.spec.timeouts.claim_seconds
        self.mirror = mirror
        self.interrupts = interrupts
        self.changed = False  # the bridge signalled that an object this run may reference changed

    async def resolve(self) -> Resolution:
        """Resolved references, within timeouts.claimSeconds. Raises RunFailed (invalid, never found) or
        Interrupted (cancel, pause: after a pause, call again for a fresh deadline)."""
        deadline = later(self.claim_seconds)
        delay = 1.0
        while True:
            self.changed = False
            activity = call(
                resolve_references,
                self.request,
                task_queue=BRIDGE_TASK_QUEUE,
                deadline=deadline,
                summary="resolve references",
            )
            try:
                resolution = await self.interrupts.interruptible(activity, CANCEL_OR_PAUSE)
            except ActivityError as err:
                if refused := refusal(err):  # not the bridge's envelope, or a copy of one
                    raise RunFailed(refused, cause(err)) from err
                raise RunFailed("ResolutionFailed", f"could not resolve references: {cause(err)}") from err
            condition = ConditionType.REFERENCES_RESOLVED
            if resolution.outcome == "resolved":
                if not resolution.agents:
                    raise RunFailed("NoEligibleAgents", "the Run names no agents and its Team has none")
                agents = ", ".join(a.name for a in resolution.agents)
                self.mirror.condition(condition, True, "Resolved", f"agents: {agents}")
                return resolution
            if resolution.outcome == "invalid":
                message = resolution.error or "invalid references"
                self.mirror.condition(condition, False, "Invalid", message)
                raise RunFailed("InvalidReferences", message)
            missing = ", ".join(resolution.missing)
            self.mirror.condition(condition, False, "Missing", f"waiting for {missing}")
            now = workflow.now()
            if now >= deadline:
                message = f"{missing} not found within timeouts.claimSeconds ({self.claim_seconds}s)"
                raise RunFailed("ReferencesNotFound", message)
            status, message = self.mirror.status, f"waiting for {missing}"
            if (status.phase, status.reason, status.message) != (Phase.PENDING, "ReferencesMissing", message):
                self.mirror.move(Phase.PENDING, reason="ReferencesMissing", message=message)  # said once
            wait = min(delay, (deadline - now).total_seconds())
            delay = min(delay * 2, RETRY_MAX_SECONDS)
            with contextlib.suppress(TimeoutError):  # the backoff passed: ask again
                await self.interrupts.interruptible(
                    workflow.wait_condition(
                        lambda: self.changed, timeout=wait, timeout_summary=f"wait for {missing}"
                    ),
                    CANCEL_OR_PAUSE,
                )
