"""Settings of the ksquad processes, read from the environment (KSQUAD_*), with the embedded defaults."""

import os
from dataclasses import dataclass

from worker.registry import MAX_CACHED_WORKFLOWS
from workflows.activity_types import WORKER_TASK_QUEUE

DEFAULT_DATABASE_URL = "sqlite:///.ksquad/ksquad.db"  # the embedded default; PostgreSQL in production


@dataclass(frozen=True)
class Settings:
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    task_queue: str = WORKER_TASK_QUEUE
    # postgresql://user@host/db (the password from PGPASSWORD or ~/.pgpass, never in a manifest) or sqlite:///
    database_url: str = DEFAULT_DATABASE_URL
    temporal_api_key: str | None = None
    temporal_tls: bool = False
    health_port: int = 8082
    max_cached_workflows: int = MAX_CACHED_WORKFLOWS

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            temporal_address=os.environ.get("KSQUAD_TEMPORAL_ADDRESS", cls.temporal_address),
            temporal_namespace=os.environ.get("KSQUAD_TEMPORAL_NAMESPACE", cls.temporal_namespace),
            task_queue=os.environ.get("KSQUAD_TASK_QUEUE", cls.task_queue),
            database_url=os.environ.get("KSQUAD_DATABASE_URL", cls.database_url),
            temporal_api_key=os.environ.get("KSQUAD_TEMPORAL_API_KEY") or None,
            temporal_tls=os.environ.get("KSQUAD_TEMPORAL_TLS", "").lower() in ("1", "true", "yes"),
            health_port=int(os.environ.get("KSQUAD_HEALTH_PORT", cls.health_port)),
            max_cached_workflows=int(os.environ.get("KSQUAD_MAX_CACHED_WORKFLOWS", cls.max_cached_workflows)),
        )
