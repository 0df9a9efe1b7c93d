"""What the worker's activities measure (prometheus-client; served on the worker's `/metrics` with the Temporal
SDK's figures, temporal_client.telemetry). Latencies run from when Temporal scheduled the activity's first
attempt to its end, so retries and queueing on a busy worker count: it is what a run waited.

    ksquad_claim_seconds{outcome}              claiming a work item: claimed, held (by another run), error
    ksquad_sandbox_acquire_seconds{kind}       getting a sandbox: warm (a pod from a pool), cold (a Job), local
    ksquad_sandbox_acquire_failures_total{reason}
    ksquad_agent_call_seconds{outcome}         one A2A turn: completed, or the AgentError that ended it
    ksquad_activities_refused_total{activity, reason}   acting activities refused: a copy of a Run, or unsealed
    ksquad_model_calls_total{namespace, credential, model, user}     model calls agents reported (each once)
    ksquad_model_tokens_total{namespace, credential, model, user, direction}   their tokens: input, output
"""

import time
from datetime import UTC, datetime

from prometheus_client import Counter, Histogram
from temporalio import activity

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
CALL_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

CLAIM_SECONDS = Histogram(
    "ksquad_claim_seconds", "claiming a work item, by outcome", ["outcome"], buckets=LATENCY_BUCKETS
)
SANDBOX_ACQUIRE_SECONDS = Histogram(
    "ksquad_sandbox_acquire_seconds", "getting a sandbox, by kind", ["kind"], buckets=LATENCY_BUCKETS
)
SANDBOX_ACQUIRE_FAILURES = Counter(
    "ksquad_sandbox_acquire_failures", "sandbox acquisitions that failed, by reason", ["reason"]
)
ACTIVITIES_REFUSED = Counter(
    "ksquad_activities_refused",
    "acting activities the worker refused: a copy of a Run (reason copy) or not what the bridge sealed",
    ["activity", "reason"],
)
ENTITY_IMPOSTORS = Counter(
    "ksquad_entity_impostors_terminated",
    "workflows under a gate's or a credential's id that were not ksquad's (type, task queue, input), terminated",
    ["workflow"],
)
AGENT_CALL_SECONDS = Histogram(
    "ksquad_agent_call_seconds", "one A2A turn with the agent, by outcome", ["outcome"], buckets=CALL_BUCKETS
)


def since_scheduled() -> float:
    """Seconds since Temporal scheduled this activity's first attempt (now, outside an activity: 0)."""
    try:
        scheduled = activity.info().scheduled_time
    except RuntimeError:
        return 0.0
    return max(0.0, (datetime.now(UTC) - scheduled).total_seconds())


class Stopwatch:
    """Seconds since it started, by the monotonic clock (for a turn, which is not an activity's whole life)."""

    def __init__(self) -> None:
        self.started = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self.started


USAGE_LABELS = ["namespace", "credential", "model", "user"]
MODEL_CALLS = Counter("ksquad_model_calls", "model calls agents reported, each once", USAGE_LABELS)
MODEL_TOKENS = Counter(
    "ksquad_model_tokens",
    "tokens of the model calls agents reported, by direction",
    [*USAGE_LABELS, "direction"],
)
