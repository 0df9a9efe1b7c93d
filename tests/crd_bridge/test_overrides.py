"""A Run's overrides beat its Agent's defaults, through the API server, the bridge's resolution, the worker and a
real A2A agent: the model the scripted model is asked for is the Run's `spec.model` when it names one, else the
Agent's, else the ModelEndpoint's (crd_bridge/resolve.py, DESIGN.md "Resources")."""

from testbed.agents import AgentFactory, ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, StackFactory
from tests.crd_bridge.test_bridge_resilience import remote_agent


async def test_the_runs_model_beats_the_agents_which_beats_the_endpoints(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    for name in ("agent-model", "run-model"):
        model.script(name, {"text": f"answered as {name}"})
    stack = await start_stack()
    await remote_agent(
        stack, model, start_agent, {"model": "agent-model"}
    )  # its ModelEndpoint says dev-model
    runs = {"defaults": {}, "overridden": {"model": "run-model"}}
    stack.apply(
        *(
            {
                "apiVersion": RUN_API,
                "kind": "Run",
                "metadata": {"name": name},
                "spec": {"agents": ["remote"], "inputs": {"task": f"task of {name}"}, **overrides},
            }
            for name, overrides in runs.items()
        )
    )
    for name, expected in (("defaults", "agent-model"), ("overridden", "run-model")):
        run = await stack.wait_phase(name, {"Succeeded", "Failed"})
        assert run["status"]["phase"] == "Succeeded", run["status"]
        assert run["status"]["model"] == expected, run["status"]
        assert run["status"]["outputs"]["answer"] == f"answered as {expected}", run["status"]["outputs"]
        asked = {c.model for c in model.state.calls if c.task == f"task of {name}"}
        assert asked == {expected}, f"{name} asked the model for {asked}"
