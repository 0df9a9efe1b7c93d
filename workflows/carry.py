"""What a Run's workflow carries over when it continues as new (between attempts: no activity in flight)."""

from datetime import datetime

from pydantic import Field

from workflows.contract import Resolution
from workflows.model import KsquadModel
from workflows.status import RunStatus


class RunCarry(KsquadModel):
    """What a continued-as-new run carries over (taken only between attempts: no activity in flight)."""

    status: RunStatus
    resolution: Resolution | None = None
    agent_index: int = 0
    on_fallback: bool = False
    consecutive_limits: int = 0
    throttles: dict[str, datetime] = Field(default_factory=dict)
    strikes: dict[str, int] = Field(default_factory=dict)
    unplaced: dict[str, datetime] = Field(default_factory=dict)  # limits this run holds no ramp place after
    slots: list[str] = Field(default_factory=list)
    claim_fence: int | None = None
