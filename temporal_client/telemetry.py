"""Metrics of a ksquad process, on one `/metrics`: its own (prometheus-client's registry: claims, sandboxes,
agent calls, status writes, API requests) and the Temporal SDK's (workflow and activity task latencies, polls,
slots, and the Run workflow's own figures: phases, rate-limit pauses, resume lateness, gate and throttle
queues, recorded through `workflow.metric_meter()`, which records nothing while a workflow replays).

The SDK exports from its Rust core on a loopback port of its own; `exposition()` reads it and appends it to
the process's registry, so a scrape sees both with one target.
"""

import socket

import httpx
from prometheus_client import REGISTRY, generate_latest
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

# Buckets of the workflows' histograms (seconds): phases last from milliseconds to days, resumes are late by
# milliseconds when all is well.
BUCKETS = {
    "ksquad_run_phase_seconds": (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 14400, 86400),
    "ksquad_resume_lateness_seconds": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
}


def _free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Telemetry:
    """A Temporal runtime exporting the SDK's metrics on loopback, and the process's combined exposition."""

    def __init__(self) -> None:
        self.sdk_address = f"127.0.0.1:{_free_loopback_port()}"
        self.runtime = Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(
                    bind_address=self.sdk_address,
                    counters_total_suffix=True,
                    durations_as_seconds=True,
                    histogram_bucket_overrides=BUCKETS,
                )
            )
        )
        self._http = httpx.AsyncClient(timeout=5.0)

    async def exposition(self) -> bytes:
        own = generate_latest(REGISTRY)
        try:
            sdk = (await self._http.get(f"http://{self.sdk_address}/metrics")).content
        except httpx.TransportError:
            sdk = b"# the Temporal SDK's metrics did not answer\n"
        return own + sdk

    async def aclose(self) -> None:
        await self._http.aclose()
