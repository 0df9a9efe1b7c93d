"""A process's /metrics: its own registry and the Temporal SDK's figures in one exposition, and what a workflow
records through the SDK's meter counted once, not again when the workflow replays."""

import re
import uuid

from prometheus_client import Counter
from temporalio.worker import Worker

from dev.devserver import DevServer
from temporal_client.connection import connect
from temporal_client.telemetry import Telemetry
from tests.support.workflows import MeasuredWorkflow

PROCESS_COUNTER = Counter("ksquad_test_telemetry_marks", "a process-side figure of this test")


def value(exposition: str, name: str, **labels: str) -> float:
    """The sample `name{labels...}` (labels in any order, others allowed), or 0 when absent."""
    for line in exposition.splitlines():
        if not line.startswith(name + "{") and line.split(" ")[0] != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(found.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_one_exposition_has_the_process_and_the_workflow_figures_counted_once(
    dev_server: DevServer,
) -> None:
    telemetry = Telemetry()
    try:
        client = await connect(dev_server.target, runtime=telemetry.runtime)
        queue = f"telemetry-{uuid.uuid4().hex[:8]}"
        PROCESS_COUNTER.inc()
        # Nothing cached: the second workflow task replays the first, which must not record again.
        async with Worker(client, task_queue=queue, workflows=[MeasuredWorkflow], max_cached_workflows=0):
            await client.execute_workflow(MeasuredWorkflow.run, id=f"measured-{queue}", task_queue=queue)
        text = (await telemetry.exposition()).decode()
    finally:
        await telemetry.aclose()
    assert value(text, "ksquad_test_telemetry_marks_total") == 1.0, "the process's own registry"
    assert value(text, "ksquad_run_phase_changes_total", phase="Running", reason="Started") == 1.0, text[
        -3000:
    ]
    assert value(text, "ksquad_runs_finished_total", phase="Succeeded", reason="Done") == 1.0
    assert value(text, "ksquad_run_phase_seconds_count", phase="Pending") == 1.0
    assert value(text, "ksquad_run_phase_seconds_sum", phase="Running") == 1.0, "seconds, not milliseconds"
    assert value(text, "temporal_workflow_completed_total") >= 1.0, "the SDK's own figures"
