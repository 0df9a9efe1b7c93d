"""What invoke_agent has seen of the remote task (its heartbeat details), and the activity's timing."""

import time
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity

from workflows.activity_types import CLAIM_LEASE_SECONDS
from workflows.status import Artifact

OUTPUTS_ARTIFACT = "ksquad.io/outputs"  # a data artifact: the run's outputs, a small string map
MAX_OUTPUTS = 32  # keys in status.outputs
MAX_OUTPUT_VALUE = 4096  # characters per output value
# Progress is stored as it comes up to a burst, then at most PROGRESS_PER_SECOND (a token bucket); the updates
# not stored are counted in the next stored one, and every change of state is stored. An agent flooding
# progress must not flood the store.
PROGRESS_BURST = 20
PROGRESS_PER_SECOND = 5.0


@dataclass
class Timing:
    # Temporal tells an activity it is cancelled only in the answer to a heartbeat: at 1 s a user's cancel of a
    # Running run stops the agent and reads Cancelled in under a second at p50 (bench.cancel; 4.1 s at 5 s), for
    # one heartbeat a second per agent call in flight (the worker's throttle allows no more).
    heartbeat_seconds: float = 1.0
    stall_seconds: float = 20.0  # no event for this long: ask the agent whether it is still there
    probe_seconds: float = 5.0
    cancel_wait_seconds: float = 10.0
    lease_seconds: float = CLAIM_LEASE_SECONDS


@dataclass
class Progress:
    """What the activity has seen of the remote task (also its heartbeat details)."""

    task_id: str | None = None
    state: str = ""
    events: int = 0
    artifacts: list[Artifact] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)
    recorded_state: int | None = None  # of the last status stored
    tokens: float = PROGRESS_BURST  # status updates that may be stored now, refilled at PROGRESS_PER_SECOND
    refilled_at: float = field(default_factory=time.monotonic)
    coalesced: int = 0  # status updates not stored since the last stored one
    answer: str = ""  # the text of the last text artifact: the agent's answer when it sends one

    def may_record(self, state: int) -> bool:
        now = time.monotonic()
        self.tokens = min(PROGRESS_BURST, self.tokens + (now - self.refilled_at) * PROGRESS_PER_SECOND)
        self.refilled_at = now
        if state != self.recorded_state or self.tokens >= 1:
            self.tokens -= 1
            return True
        self.coalesced += 1
        return False

    def take_outputs(self, outputs: Any) -> None:
        if isinstance(outputs, dict):
            for key, value in list(outputs.items())[:MAX_OUTPUTS]:
                self.outputs[str(key)] = str(value)[:MAX_OUTPUT_VALUE]

    def heartbeat(self) -> dict[str, Any]:
        return {"taskId": self.task_id, "state": self.state, "events": self.events}


def previous_task_id() -> str | None:
    """The remote task an earlier attempt of this activity started, from its last heartbeat."""
    details = activity.info().heartbeat_details
    if details and isinstance(details[0], dict):
        task_id = details[0].get("taskId")
        return str(task_id) if task_id else None
    return None
