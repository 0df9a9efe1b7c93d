"""What the bridge measures (prometheus-client; on its `/metrics` with the Temporal SDK's figures).

ksquad_apply_to_status_seconds            a new Run's arrival at the bridge (its watch event) to its first
                                          status (Pending, WorkflowStarted): how soon kubectl shows a phase
ksquad_status_mirror_lag_seconds          a workflow's state change to its status on the Run
ksquad_status_writes_total{result}        written, stale (a newer revision is there), gone, failed
ksquad_runs{phase}                        the Runs the leading bridge watches, by phase (standbys: none)
ksquad_reconciles_total{result}           the reconciler's passes: done, retry, error
"""

from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10, 30, 60)

APPLY_TO_STATUS_SECONDS = Histogram(
    "ksquad_apply_to_status_seconds",
    "a new Run's watch event at the bridge to its first status",
    buckets=LAG_BUCKETS,
)
MIRROR_LAG_SECONDS = Histogram(
    "ksquad_status_mirror_lag_seconds",
    "a workflow's state change to its status on the Run",
    buckets=LAG_BUCKETS,
)
STATUS_WRITES = Counter("ksquad_status_writes", "status writes to Runs, by result", ["result"])
RECONCILES = Counter("ksquad_reconciles", "reconciler passes over Runs, by result", ["result"])


class RunsByPhase(Collector):
    """`ksquad_runs{phase}` at scrape time, from the phases the leader's watch has seen (one per process: the
    bridge's activities tell it where to look)."""

    def __init__(self) -> None:
        self.phases: Callable[[], Iterable[str] | None] = lambda: None

    def collect(self) -> Iterator[Metric]:
        seen = self.phases()
        family = GaugeMetricFamily(
            "ksquad_runs", "Runs watched by the leading bridge, by phase", labels=["phase"]
        )
        if seen is not None:
            for phase, count in sorted(Tally(seen).items()):
                family.add_metric([phase], count)
        yield family


RUNS_BY_PHASE = RunsByPhase()
REGISTRY.register(RUNS_BY_PHASE)
