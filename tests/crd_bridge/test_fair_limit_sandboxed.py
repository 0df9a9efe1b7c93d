"""bench.sandbox_overhead's fair limit with a warm sandbox makes a sandboxed Run's call, on the control plane's node:
a Run whose agent runs in a pod of the chart's pool, and the fair limit taking a pod of the same template from a
pool of its own (bench.fair_limit), reach the same model with the same request through the agent in the pod, get
the same answer, and the fair limit's pod is deleted after its task. (Beside the bridge's tests: it applies the
chart's cluster-wide policies as they do, which a later `helm install` of tests/chart would refuse to adopt.)"""

from agent.callers import read_key
from bench.fair_limit import (
    FAIR_TASK_QUEUE,
    FairLimitWorkflow,
    contract_of_a_run,
    fair_limit_worker_at,
    fair_task_for,
)
from bench.histories import shape_of
from bench.sandbox_overhead import POOL, fair_namespace, ksquad_runs, quiet
from bench.warm_claims import apply_pools
from kube import path
from testbed.agents import ModelEndpoint
from tests.crd_bridge.conftest import StackFactory


def seen(call: object) -> dict[str, object]:
    """A model call as the scripted model recorded it, less its time."""
    return {k: v for k, v in vars(call).items() if k != "at"}


async def test_the_fair_limit_with_a_warm_sandbox_sends_a_sandboxed_runs_task_through_the_same_agent(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    answers = [{"text": "the first answer"}, {"text": "the second answer"}]
    stack = (
        await start_stack()
    )  # sandboxes on runc, as the bridge's tests run them (the bench measures gVisor)
    stack.apply(*stack.resources(model))
    apply_pools(stack, 1, pools=1)
    stack.kill("worker")  # started again knowing the pool
    await stack.start("worker")
    fair_ns = await fair_namespace(stack, 1)
    await quiet(stack.kube, [stack.namespace, fair_ns], 1, within=180)
    model.script("dev-model", *answers)
    await ksquad_runs(stack, "same", 1)  # fails unless the Run's sandbox was the pool's warm pod
    template, run_answer = await contract_of_a_run(stack.temporal, f"{stack.namespace}/same-0")
    assert run_answer == "the first answer"
    assert template.contract.agent.endpoint is None, "the agent is the sandbox's"
    (run_call,) = model.state.calls

    await quiet(stack.kube, [stack.namespace, fair_ns], 1, within=180)
    (taken,) = (await stack.kube.list(path("v1", "pods", fair_ns)))["items"]
    in_a_sandbox = template.model_copy(update={"pool": f"{fair_ns}/{POOL}"})
    workflow_id = f"fair-sandboxed-{fair_ns}"
    async with fair_limit_worker_at(
        stack.dev_server.target, read_key(stack.endpoint_key), stack.kube, [(fair_ns, POOL)]
    ) as client:
        fair_answer = await client.execute_workflow(
            FairLimitWorkflow.run,
            fair_task_for(in_a_sandbox, "fair-sandboxed"),
            id=workflow_id,
            task_queue=FAIR_TASK_QUEUE,
        )
        shape = await shape_of(client.get_workflow_handle(workflow_id))
    assert fair_answer == "the second answer", "the fair limit's answer is its own call's, not the Run's"
    assert len(model.state.calls) == 2, "the fair limit's task reached the model once, through the pod"
    assert seen(model.state.calls[1]) == seen(run_call)
    assert shape["activities"] == 1 and shape["workflow_tasks"] == 2, shape
    left = {p["metadata"]["name"]: p for p in (await stack.kube.list(path("v1", "pods", fair_ns)))["items"]}
    name = taken["metadata"]["name"]
    assert name not in left or left[name]["metadata"].get("deletionTimestamp"), (
        f"the pod the fair limit took, {name}, is not deleted after its task"
    )
