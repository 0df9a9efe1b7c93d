"""The installed release traces a Run (the chart's `tracing` values, to the test bed's Jaeger): one tree from the
bridge's pod through the worker's (the sandbox it made, named) to the agent in the Run's cold sandbox, its model call
and its checkpoint writes to ksquad-api's listener for sandboxes, each process named by the chart's service names."""

import tracing
from testbed.agents import ModelEndpoint
from testbed.jaeger import Jaeger, lineage, only, service, tags, wait_trace
from tests.chart.conftest import Release, phase_of
from tests.chart.test_api import start_run


async def test_an_installed_release_traces_a_run_from_the_bridge_into_its_sandbox(
    release: Release, model: ModelEndpoint, chart_jaeger: Jaeger
) -> None:
    release.ensure_credential(model)
    model.script("dev-model", {"text": "Traced from the bridge to the model."})
    release.squad(model)
    start_run(release, "traced", "Trace me.", agents=["dev-1"])
    run = await phase_of(release, "traced", {"Succeeded", "Failed"}, timeout=180)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    uid = run["metadata"]["uid"]

    trace = await wait_trace(
        chart_jaeger,
        f"{tracing.trace_id(uid):032x}",
        "chat dev-model",
        "invoke_agent dev-1",
        "RunActivity:invoke_agent",
        "StartWorkflow:RunWorkflow",
        "reconcile Run: start",
        "POST /attempts/checkpoints",
        "RunActivity:acquire_sandbox",
    )
    assert lineage(trace, only(trace, "chat dev-model")) == [
        "ksquad-agent: chat dev-model",
        "ksquad-agent: task dev-1",
        "ksquad-agent: POST /",
        "ksquad-worker: invoke_agent dev-1",
        "ksquad-worker: RunActivity:invoke_agent",
        "ksquad-worker: StartActivity:invoke_agent",
        "ksquad-bridge: StartWorkflow:RunWorkflow",
        "ksquad-bridge: start Run workflow",
        "ksquad-bridge: reconcile Run: start",
    ]
    writes = [s for s in trace["spans"] if service(trace, s) == "ksquad-api"]
    assert writes, "the agent's checkpoint writes reached ksquad-api in the attempt's trace"
    assert all(lineage(trace, s)[1] == "ksquad-agent: task dev-1" for s in writes), [
        lineage(trace, s) for s in writes
    ]
    assert {s["operationName"] for s in writes} >= {"POST /attempts/checkpoints"}, [
        s["operationName"] for s in writes
    ]
    call = tags(only(trace, "invoke_agent dev-1"))
    assert call["ksquad.run.name"] == "traced" and call["ksquad.run.uid"] == uid
    assert call["ksquad.run.triggered_by"] == run["metadata"]["annotations"]["ksquad.io/triggered-by"]
    assert call["ksquad.credential.name"] == "model-key"
    sandbox = tags(only(trace, "RunActivity:acquire_sandbox"))
    assert (sandbox["ksquad.sandbox.kind"], sandbox["ksquad.sandbox.runtime_class"]) == ("cold", "gvisor")
    assert sandbox["ksquad.run.uid"] == uid
