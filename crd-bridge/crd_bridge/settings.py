"""The bridge's settings, from the environment (the chart sets them)."""

import os
import socket
from dataclasses import dataclass, field

from workflows.activity_types import WORKER_TASK_QUEUE


def _list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


@dataclass(frozen=True)
class BridgeSettings:
    temporal_address: str = "127.0.0.1:7233"
    temporal_namespace: str = "default"
    temporal_api_key: str | None = None
    temporal_tls: bool = False
    worker_task_queue: str = WORKER_TASK_QUEUE  # where Run workflows are started
    kubeconfig: str | None = None
    watch_namespaces: list[str] = field(default_factory=list)  # empty: every namespace
    # Where credential Secrets are watched for rotation (None: the watched namespaces; empty: nowhere)
    credential_namespaces: list[str] | None = None
    lease_namespace: str = "ksquad-system"
    lease_name: str = "ksquad-bridge"
    identity: str = field(default_factory=socket.gethostname)
    namespace_max_concurrent_runs: int | None = None
    cancel_wait_seconds: float = 60.0  # deleting a Run waits this long for its workflow to end Cancelled
    health_port: int = 8081
    reconcilers: int = 8  # Runs reconciled in parallel

    def credential_watch(self) -> list[str] | None:
        """The namespaces whose credential Secrets are watched: None for every namespace, [] for none."""
        if self.credential_namespaces is None:
            return self.watch_namespaces or None
        return self.credential_namespaces

    @classmethod
    def from_env(cls) -> "BridgeSettings":
        env = os.environ
        limit = env.get("KSQUAD_NAMESPACE_MAX_CONCURRENT_RUNS")
        return cls(
            temporal_address=env.get("KSQUAD_TEMPORAL_ADDRESS", cls.temporal_address),
            temporal_namespace=env.get("KSQUAD_TEMPORAL_NAMESPACE", cls.temporal_namespace),
            temporal_api_key=env.get("KSQUAD_TEMPORAL_API_KEY") or None,
            temporal_tls=env.get("KSQUAD_TEMPORAL_TLS", "").lower() in ("1", "true", "yes"),
            worker_task_queue=env.get("KSQUAD_TASK_QUEUE", cls.worker_task_queue),
            kubeconfig=env.get("KUBECONFIG") or None,
            watch_namespaces=_list(env.get("KSQUAD_WATCH_NAMESPACES")),
            credential_namespaces=(
                _list(env["KSQUAD_CREDENTIAL_NAMESPACES"]) if "KSQUAD_CREDENTIAL_NAMESPACES" in env else None
            ),
            lease_namespace=env.get("KSQUAD_LEASE_NAMESPACE", env.get("POD_NAMESPACE", cls.lease_namespace)),
            lease_name=env.get("KSQUAD_LEASE_NAME", cls.lease_name),
            identity=env.get("POD_NAME") or socket.gethostname(),
            namespace_max_concurrent_runs=int(limit) if limit else None,
            cancel_wait_seconds=float(env.get("KSQUAD_CANCEL_WAIT_SECONDS", cls.cancel_wait_seconds)),
            health_port=int(env.get("KSQUAD_HEALTH_PORT", cls.health_port)),
        )
