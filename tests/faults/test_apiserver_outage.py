"""kube-apiserver gone for 30 s while runs are in flight (the bridge and the worker as the chart deploys them,
cold sandbox Jobs on the loopback kubelet): the runs go on (agents keep working, workflows move to their next
step and wait there), and once it is back (and the bridge, which gave up its leader lease, is started again as
its Deployment would) every Run's status converges on its workflow's."""

import asyncio
import time
from collections import Counter

from testbed.agents import ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, StackFactory
from workflows.status import RunStatus

RUNS = 6
DOWN_SECONDS = 30


async def test_runs_go_on_through_an_apiserver_outage_and_statuses_converge(
    start_stack: StackFactory, model: ModelEndpoint, fault_counts: Counter[str]
) -> None:
    # Every run's call is held in flight until the outage begins, then answered during it: however long the
    # sandboxes take to start on a busy node, the outage finds every run mid-call.
    model.script("dev-model", {"hold": True, "text": "done despite the outage"})
    model.state.held = True
    stack = await start_stack()
    names = [f"outage-{i}" for i in range(RUNS)]
    stack.apply(
        *stack.resources(model),
        *(
            {
                "apiVersion": RUN_API,
                "kind": "Run",
                "metadata": {"name": n},
                "spec": {"agents": ["dev-1"], "inputs": {"task": n}},
            }
            for n in names
        ),
    )
    for name in names:
        await stack.wait_phase(name, {"Running"}, within=180)
    started = time.monotonic()
    while model.state.in_flight < RUNS:  # Running, and its call has reached the model
        assert time.monotonic() - started < 60, f"only {model.state.in_flight} of {RUNS} calls in flight"
        await asyncio.sleep(0.1)
    handles = {n: stack.temporal.get_workflow_handle(f"{stack.namespace}/{n}") for n in names}

    stack.cluster.stop_apiserver()
    down_at = time.monotonic()
    model.state.held = False  # the agents' calls end now, while the API server is down
    try:
        moved_on: set[str] = set()
        while time.monotonic() - down_at < DOWN_SECONDS:
            for name, handle in handles.items():
                described = await handle.describe()
                if "invoke_agent" not in {
                    a.activity_type.name for a in described.raw_description.pending_activities
                }:
                    moved_on.add(name)  # the agent answered; the workflow went on without the apiserver
            await asyncio.sleep(1)
    finally:
        stack.cluster.start_apiserver()
        stack.cluster.wait_for_resource("runs.ksquad.io")  # for the tests after this one too
    assert moved_on == set(names), f"only {sorted(moved_on)} got past their agent call during the outage"
    # The bridge cannot renew its leader lease without the apiserver: it stops, as client-go's leader election
    # does, and its Deployment starts it again; here the test does what the kubelet would.
    assert stack.processes["bridge"].poll() is not None, (
        "the bridge that lost its lease is gone, not hanging on"
    )
    assert "could not renew the lease" in stack.log("bridge")
    await stack.start("bridge")

    for name in names:
        run = await stack.wait_phase(name, {"Succeeded", "Failed"}, within=180)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        state = await handles[name].query("state", result_type=RunStatus)
        assert run["status"]["revision"] == state.revision, f"{name}: the status converged on the workflow's"
        assert run["status"]["outputs"] == {"answer": "done despite the outage"}
    assert stack.processes["worker"].poll() is None, "the worker rode it out"
    fault_counts["apiserver_outage.runs"] += RUNS
    fault_counts["apiserver_outage.seconds_down"] += DOWN_SECONDS
    fault_counts["apiserver_outage.bridge_restarts"] += 1
