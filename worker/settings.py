"""Settings of the ksquad processes, read from the environment (KSQUAD_*), with the embedded defaults."""

import os
from dataclasses import dataclass

TASK_QUEUE = "ksquad"  # the worker's queue: workflows and their activities
BRIDGE_TASK_QUEUE = (
    "ksquad-bridge"  # activities that touch ksquad.io objects (mirror_status, resolve_references)
)


@dataclass(frozen=True)
class Settings:
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    task_queue: str = TASK_QUEUE

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            temporal_address=os.environ.get("KSQUAD_TEMPORAL_ADDRESS", cls.temporal_address),
            temporal_namespace=os.environ.get("KSQUAD_TEMPORAL_NAMESPACE", cls.temporal_namespace),
            task_queue=os.environ.get("KSQUAD_TASK_QUEUE", cls.task_queue),
        )
