"""The bridge's settings, from the environment (the chart sets them)."""

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from crd_bridge.resolve import ANYTHING, AllowLists
from temporal_client.connection import TemporalSettings
from workflows.activity_types import WORKER_TASK_QUEUE


def _list(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _allowed(env: Mapping[str, str], name: str) -> frozenset[str] | None:
    """An allow-list from the environment: unset means anything, set (even empty) means those only."""
    return frozenset(_list(env[name])) if name in env else None


@dataclass(frozen=True)
class BridgeSettings:
    temporal: TemporalSettings = field(default_factory=TemporalSettings)
    worker_task_queue: str = WORKER_TASK_QUEUE  # where Run workflows are started
    kubeconfig: str | None = None
    database_url: str | None = None  # the store for phase events (the cluster API's streams); None: none
    watch_namespaces: list[str] = field(default_factory=list)  # empty: every namespace
    lease_namespace: str = "ksquad-system"
    lease_name: str = "ksquad-bridge"
    identity: str = field(default_factory=socket.gethostname)
    namespace_max_concurrent_runs: int | None = None
    allow: AllowLists = ANYTHING  # what Runs and Agents may ask for (the chart's allow-lists)
    cancel_wait_seconds: float = 60.0  # deleting a Run waits this long for its workflow to end Cancelled
    health_port: int = 8081
    reconcilers: int = 8  # Runs reconciled in parallel

    @classmethod
    def from_env(cls) -> "BridgeSettings":
        env = os.environ
        limit = env.get("KSQUAD_NAMESPACE_MAX_CONCURRENT_RUNS")
        return cls(
            temporal=TemporalSettings.from_env(env),
            worker_task_queue=env.get("KSQUAD_TASK_QUEUE", cls.worker_task_queue),
            kubeconfig=env.get("KUBECONFIG") or None,
            database_url=env.get("KSQUAD_DATABASE_URL") or None,
            watch_namespaces=_list(env.get("KSQUAD_WATCH_NAMESPACES")),
            lease_namespace=env.get("KSQUAD_LEASE_NAMESPACE", env.get("POD_NAMESPACE", cls.lease_namespace)),
            lease_name=env.get("KSQUAD_LEASE_NAME", cls.lease_name),
            identity=env.get("POD_NAME") or socket.gethostname(),
            namespace_max_concurrent_runs=int(limit) if limit else None,
            allow=AllowLists(
                images=_allowed(env, "KSQUAD_ALLOWED_IMAGES"),
                runtime_classes=_allowed(env, "KSQUAD_ALLOWED_RUNTIME_CLASSES"),
                endpoints=_allowed(env, "KSQUAD_ALLOWED_AGENT_ENDPOINTS"),
                service_accounts=_allowed(env, "KSQUAD_ALLOWED_SERVICE_ACCOUNTS"),
                priority_classes=_allowed(env, "KSQUAD_ALLOWED_PRIORITY_CLASSES"),
                toleration_keys=_allowed(env, "KSQUAD_ALLOWED_TOLERATIONS"),
            ),
            cancel_wait_seconds=float(env.get("KSQUAD_CANCEL_WAIT_SECONDS", cls.cancel_wait_seconds)),
            health_port=int(env.get("KSQUAD_HEALTH_PORT", cls.health_port)),
        )
