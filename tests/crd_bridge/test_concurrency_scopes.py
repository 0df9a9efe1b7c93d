"""Concurrency scopes through the real stack (the API server, the bridge's resolution, the worker, an A2A agent and
the scripted model): the namespace limit the chart's `bridge.namespaceMaxConcurrentRuns` sets, and a Project's
`maxConcurrentRuns`. Each admits one run at a time, in order, says why the others wait, and leaves no slot held
once its runs have ended. (The Team limit is proven on the embedded stack: tests/dev/test_lifecycle.py.)"""

from datetime import datetime
from typing import Any

from kube import path
from testbed.agents import AgentFactory, ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, Stack, StackFactory
from tests.crd_bridge.test_bridge_resilience import remote_agent

THINKING = {"delay": 3, "text": "done"}  # long enough that the second run must wait for the first


def run_doc(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": RUN_API,
        "kind": "Run",
        "metadata": {"name": name},
        "spec": {"agents": ["remote"], **spec},
    }


async def one_at_a_time(stack: Stack, first: str, second: str, scope: str) -> None:
    """`first` runs, `second` waits Queued naming `scope`, then runs only after `first` has ended."""
    await stack.wait_phase(first, {"Running"})
    waiting = await stack.wait_phase(second, {"Queued"})
    assert (waiting["status"]["reason"], waiting["status"]["message"]) == (
        "ConcurrencyLimit",
        f"{scope} is full (1); position 1",
    ), waiting["status"]
    admitted = {c["type"]: c for c in waiting["status"]["conditions"]}["Admitted"]
    assert (admitted["status"], admitted["reason"], admitted["message"]) == ("False", "Queued", scope)
    for name in (first, second):
        assert (await stack.wait_phase(name, {"Succeeded", "Failed"}, within=120))["status"][
            "phase"
        ] == "Succeeded"
    first_done = await stack.kube.get(path(RUN_API, "runs", stack.namespace, first))
    second_run = await stack.kube.get(path(RUN_API, "runs", stack.namespace, second))
    ended = datetime.fromisoformat(first_done["status"]["lastTransitionTime"].replace("Z", "+00:00"))
    claimed = {c["type"]: c for c in second_run["status"]["conditions"]}["Admitted"]
    assert claimed["status"] == "True" and claimed["reason"] == "SlotsHeld", claimed
    admitted_at = datetime.fromisoformat(claimed["lastTransitionTime"].replace("Z", "+00:00"))
    assert admitted_at >= ended, f"{second} was admitted at {admitted_at}, before {first} ended at {ended}"


async def test_the_namespace_limit_admits_one_run_at_a_time(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", THINKING)
    stack = await start_stack(bridge=False)
    stack.bridge_env["KSQUAD_NAMESPACE_MAX_CONCURRENT_RUNS"] = (
        "1"  # the chart's bridge.namespaceMaxConcurrentRuns
    )
    await stack.start("bridge")
    await remote_agent(stack, model, start_agent)
    stack.apply(run_doc("ns-first"))
    await stack.wait_phase("ns-first", {"Running"})
    stack.apply(run_doc("ns-second"))
    await one_at_a_time(stack, "ns-first", "ns-second", f"namespace/{stack.namespace}")


async def test_a_projects_limit_admits_one_of_its_runs_at_a_time_and_not_anothers(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", THINKING)
    stack = await start_stack()
    await remote_agent(stack, model, start_agent)
    stack.apply(
        {
            "apiVersion": RUN_API,
            "kind": "Project",
            "metadata": {"name": "billing"},
            "spec": {"maxConcurrentRuns": 1},
        }
    )
    stack.apply(run_doc("p-first", projectRef="billing"))
    await stack.wait_phase("p-first", {"Running"})
    stack.apply(run_doc("p-second", projectRef="billing"), run_doc("unbound"))
    # A run of no Project is not held back by the Project's limit.
    assert (await stack.wait_phase("unbound", {"Running", "Succeeded"}))["status"]["phase"] in (
        "Running",
        "Succeeded",
    )
    await one_at_a_time(stack, "p-first", "p-second", f"project/{stack.namespace}/billing")
