"""What a Run's workflow starts with, and what it carries when it continues as new: the state of each part
(the status mirror's status, the throttles', the held claim's fence, the route), never a copy of it."""

from datetime import datetime

from pydantic import Field

from workflows.contract import Resolution
from workflows.envelope import RunEnvelope
from workflows.model import KsquadModel
from workflows.status import RunStatus


class ThrottleState(KsquadModel):
    """The credential limits a run knows of (`workflows.run.throttles`)."""

    # per credential key: no call before this instant (the provider's limit, or this run's place after it)
    until: dict[str, datetime] = Field(default_factory=dict)
    strikes: dict[str, int] = Field(default_factory=dict)  # limits in a row, per key
    unplaced: list[str] = Field(default_factory=list)  # keys whose limit this run has no place after yet
    # per key: the end of the limit whose fair ramp this run waits in (store.ramps), until its turn is confirmed
    ramps: dict[str, datetime] = Field(default_factory=dict)
    waited_seconds: float = 0.0  # Paused(RateLimited) so far, over all pauses (timeouts.rateLimitedSeconds)


class Route(KsquadModel):
    """The agent and model a run is on (`RunWorkflow` moves it: fallback, re-route)."""

    agent_index: int = 0
    on_fallback: bool = False  # on the agent's fallback model
    on_project_fallback: bool = False  # on the Project's, after (or without) the agent's
    consecutive_limits: int = 0


class RunCarry(KsquadModel):
    """What a continued-as-new run carries over (taken only between attempts: no activity in flight, no
    sandbox held)."""

    status: RunStatus
    resolution: Resolution | None = None
    route: Route = Field(default_factory=Route)
    throttles: ThrottleState = Field(default_factory=ThrottleState)
    slots: list[str] = Field(default_factory=list)  # concurrency scopes whose slot the run holds
    slot_asks: dict[str, int] = Field(default_factory=dict)  # workflows.run.gates.Gates.asks
    claim_fence: int | None = None
    nonces: list[str] = Field(default_factory=list)  # the proofs of the signals it took (workflows.inbox)
    proof_floor: int = 0  # proofs issued at or before it are refused (workflows.inbox.Inbox.floor)


class RunInput(RunEnvelope):
    """What the bridge (or the embedded stack) starts a Run's workflow with: its envelope, sealed
    (workflows.envelope). The carry is the workflow's own, when it continues as new: taken from no one else."""

    carry: RunCarry | None = None
