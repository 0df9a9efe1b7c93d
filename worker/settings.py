"""Settings of the ksquad processes, read from the environment (KSQUAD_*), with the embedded defaults."""

import os
from dataclasses import dataclass, field

from temporal_client.connection import TemporalSettings
from worker.registry import MAX_CACHED_WORKFLOWS
from workflows.activity_types import WORKER_TASK_QUEUE

DEFAULT_DATABASE_URL = "sqlite:///.ksquad/ksquad.db"  # the embedded default; PostgreSQL in production


@dataclass(frozen=True)
class Settings:
    temporal: TemporalSettings = field(default_factory=TemporalSettings)
    task_queue: str = WORKER_TASK_QUEUE
    # postgresql://user@host/db (the password from PGPASSWORD or ~/.pgpass, never in a manifest) or sqlite:///
    database_url: str = DEFAULT_DATABASE_URL
    health_port: int = 8082
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            temporal=TemporalSettings.from_env(),
            task_queue=os.environ.get("KSQUAD_TASK_QUEUE", cls.task_queue),
            database_url=os.environ.get("KSQUAD_DATABASE_URL", cls.database_url),
            health_port=int(os.environ.get("KSQUAD_HEALTH_PORT", cls.health_port)),
            max_cached_workflows=int(os.environ.get("KSQUAD_MAX_CACHED_WORKFLOWS", cls.max_cached_workflows)),
        )
