"""The bridge under stress: killed during a burst of Run creations, and two replicas behind one Lease (a leader
killed, and one stopped gracefully that gives the Lease up)."""

import asyncio
import signal
import subprocess
import time
from typing import Any

import yaml

from kube import path
from testbed import chart
from testbed.agents import MODEL_KEY, AgentFactory, ModelEndpoint
from tests.crd_bridge.conftest import RUN_API, Stack, StackFactory
from workflows.status import Phase

BURST = 200


def run_docs(names: list[str], namespace: str) -> str:
    return yaml.safe_dump_all(
        [
            {
                "apiVersion": RUN_API,
                "kind": "Run",
                "metadata": {"name": n, "namespace": namespace},
                "spec": {"agents": ["remote"]},
            }
            for n in names
        ]
    )


async def remote_agent(
    stack: Stack, model: ModelEndpoint, start_agent: AgentFactory, agent_spec: dict[str, Any] | None = None
) -> None:
    """One already-running A2A agent for every run (Agent.endpoint): no sandbox per run. It answers the workers
    that sign with the stack's endpoint key and reads the namespace's credential as mounted for it."""
    secrets = stack.root / "remote-secrets"
    (secrets / stack.namespace / "model-key").mkdir(parents=True, exist_ok=True)
    (secrets / stack.namespace / "model-key" / "apiKey").write_text(MODEL_KEY)
    agent = await start_agent(None, endpoint_key=stack.endpoint_key, secrets_dir=secrets)
    docs = stack.resources(model, "remote", endpoint=agent.url)
    docs[-1]["spec"].update(agent_spec or {})  # the Agent
    stack.apply(*docs)


async def phases(stack: Stack) -> dict[str, str]:
    runs = await stack.kube.list(path(RUN_API, "runs", stack.namespace))
    return {r["metadata"]["name"]: r.get("status", {}).get("phase", "") for r in runs["items"]}


async def test_a_bridge_killed_during_a_burst_of_200_runs_leaves_exactly_one_workflow_each(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    model.script("dev-model", {"text": "done"})
    stack = await start_stack()
    await remote_agent(stack, model, start_agent)
    names = [f"burst-{i:03d}" for i in range(BURST)]
    creating = asyncio.create_task(
        asyncio.to_thread(stack.kubectl, "apply", "-f", "-", input=run_docs(names, stack.namespace))
    )
    for _ in range(600):  # kill the bridge once it has started some workflows, mid-burst
        if "started workflow" in stack.log("bridge") and stack.log("bridge").count("started workflow") >= 20:
            break
        await asyncio.sleep(0.05)
    started = stack.log("bridge").count("started workflow")
    stack.kill("bridge")
    assert 20 <= started < BURST, (
        f"the kill landed mid-burst: {started} of {BURST} workflows started before it"
    )
    await creating
    await stack.start("bridge")

    done: dict[str, str] = {}
    for _ in range(900):
        done = await phases(stack)
        if len(done) == BURST and all(Phase(p).terminal for p in done.values() if p) and all(done.values()):
            break
        await asyncio.sleep(0.2)
    assert sorted(done) == names
    assert set(done.values()) == {"Succeeded"}, {p: list(done.values()).count(p) for p in set(done.values())}
    for name in names:
        executions = [
            w async for w in stack.temporal.list_workflows(f"WorkflowId = '{stack.namespace}/{name}'")
        ]
        assert len(executions) == 1, f"{name} has {len(executions)} workflows"


async def leader_and_standby(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> tuple[Stack, subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """A stack with two bridge replicas behind one Lease: the first started leads."""
    model.script("dev-model", {"text": "done"})
    stack = await start_stack()
    first = stack.processes.pop("bridge")
    stack.processes["bridge-a"] = first
    await remote_agent(stack, model, start_agent)
    standby = await stack.start("bridge")
    await asyncio.sleep(3)  # both replicas share bridge.log: count who leads
    assert stack.log("bridge").count(" leads (lease") == 1, "exactly one replica leads"
    return stack, first, standby


def lease_path(stack: Stack) -> str:
    return path("coordination.k8s.io/v1", "leases", chart.RELEASE_NAMESPACE, f"bridge-{stack.namespace}")


async def test_two_bridge_replicas_never_both_act_and_the_standby_takes_over(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    stack, first, standby = await leader_and_standby(start_stack, model, start_agent)
    stack.kubectl("apply", "-f", "-", input=run_docs(["before-failover"], stack.namespace))
    await stack.wait_phase("before-failover", {"Succeeded"})

    first.send_signal(signal.SIGKILL)  # the leader dies without giving the Lease back
    first.wait()
    stack.kubectl("apply", "-f", "-", input=run_docs(["after-failover"], stack.namespace))
    run = await stack.wait_phase("after-failover", {"Succeeded"}, within=90)
    assert run["status"]["phase"] == "Succeeded"
    assert stack.log("bridge").count(" leads (lease") == 2, "the standby took the Lease over"
    assert standby.poll() is None
    lease = await stack.kube.get(lease_path(stack))
    assert lease["spec"]["leaseTransitions"] == 1
    for name in ("before-failover", "after-failover"):  # one replica acted on each: one start, one workflow
        workflow_id = f"{stack.namespace}/{name}"
        assert stack.log("bridge").count(f"started workflow {workflow_id} ") == 1, name
        assert len([w async for w in stack.temporal.list_workflows(f"WorkflowId = '{workflow_id}'")]) == 1, (
            name
        )


async def test_a_leader_that_stops_gives_the_lease_up_and_the_standby_leads_at_once(
    start_stack: StackFactory, model: ModelEndpoint, start_agent: AgentFactory
) -> None:
    stack, first, standby = await leader_and_standby(start_stack, model, start_agent)
    leader = (await stack.kube.get(lease_path(stack)))["spec"]["holderIdentity"]

    first.send_signal(signal.SIGTERM)  # how a pod's deletion, `helm upgrade` and a node drain stop it
    assert await asyncio.to_thread(first.wait, 30) == 0
    stopped = time.monotonic()
    given_up = (await stack.kube.get(lease_path(stack)))["spec"]
    # Read as the process exits: without the release the Lease would name it for leaseDurationSeconds (15) more.
    assert given_up["holderIdentity"] != leader, given_up
    assert " gave the lease " in stack.log("bridge")
    while stack.log("bridge").count(" leads (lease") < 2:
        assert time.monotonic() - stopped < 60, "the standby never led"
        await asyncio.sleep(0.1)
    print(f"[lease] the standby led {time.monotonic() - stopped:.1f}s after the leader exited")
    stack.kubectl("apply", "-f", "-", input=run_docs(["after-handover"], stack.namespace))
    assert (await stack.wait_phase("after-handover", {"Succeeded"}, within=90))["status"][
        "phase"
    ] == "Succeeded"
    assert standby.poll() is None
    lease = (await stack.kube.get(lease_path(stack)))["spec"]
    assert (lease["holderIdentity"], lease["leaseTransitions"]) != (leader, 0) and lease[
        "leaseTransitions"
    ] == 1
