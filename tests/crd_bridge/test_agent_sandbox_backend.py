"""The agent-sandbox backend on the real stack: a pool of `backend: agent-sandbox` (the chart's SandboxTemplate and
SandboxWarmPool, kubernetes-sigs/agent-sandbox's controller, testbed/agent_sandbox.py), Runs applied with kubectl,
the bridge and the worker as the chart's service accounts, the reference agent on the node's kubelet, the scripted
model. The lifecycle the Job backend's tests prove, on it: a Run claims the pool's warm sandbox (the same pod,
adopted) and succeeds, and its claim, Sandbox and pod are gone after; the sandbox's pod killed mid-run is fenced,
confirmed gone (its Sandbox would make it again) and the retry claims another; a Run deleted mid-run ends with
everything of it gone; Runs that claim together each get a sandbox of their own."""

import asyncio
import json
from typing import Any

import pytest

from kube import ApiError, path
from testbed import agent_sandbox, chart
from testbed.agents import ModelEndpoint
from testbed.images import AGENT_IMAGE
from testbed.stack import RUNC_FOR_GVISOR, Stack, apply_chart_rbac
from tests.crd_bridge.conftest import StackFactory
from tests.crd_bridge.test_bridge_e2e import in_order, run_doc, wait_for

POOL = "as"
AGENTS = "agents.x-k8s.io/v1beta1"
EXTENSIONS = "extensions.agents.x-k8s.io/v1beta1"
RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}}  # the stack's sandboxes' (testbed.stack)


async def agent_sandbox_stack(start_stack: StackFactory, model: ModelEndpoint, replicas: int) -> Stack:
    """A stack whose worker claims from the chart's pool `as` of backend agent-sandbox, its sandboxes ready (the
    Agent and the credential its pods mount applied first)."""
    stack = await start_stack()
    stack.apply(*stack.resources(model))
    agent_sandbox.start(stack.cluster)
    values: dict[str, Any] = {
        # the stack's sandboxes' resources (testbed.stack), without the chart's default limit: the worker claims
        # only from a pool placed as its Run's sandbox would be
        "sandbox": {
            "image": AGENT_IMAGE,
            "runtimeClasses": RUNC_FOR_GVISOR,
            "resources": {**RESOURCES, "limits": None},
        },
        "agentSandbox": {"controllerUser": agent_sandbox.USER},
        "pools": [
            {
                "name": POOL,
                "namespace": stack.namespace,
                "replicas": replicas,
                "backend": "agent-sandbox",
                "credentials": ["model-key"],
            }
        ],
    }
    apply_chart_rbac(stack.cluster, stack.namespace, values)  # the worker's Role: claims too
    rendered = chart.render({**values, "namespaces": [stack.namespace]})
    chart.apply(stack.cluster, rendered, {"SandboxTemplate", "SandboxWarmPool"})
    stack.pools = [p.model_dump() for p in chart.worker_settings(rendered).pools]
    stack.kill("worker")
    await stack.start("worker")
    await pool_full(stack, replicas)
    return stack


async def pool_full(stack: Stack, replicas: int) -> None:
    async def full() -> bool:
        pool = await stack.kube.get(
            path(EXTENSIONS, "sandboxwarmpools", stack.namespace, f"ksquad-pool-{POOL}")
        )
        return int(pool.get("status", {}).get("readyReplicas") or 0) >= replicas

    for _ in range(600):
        if await full():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(
        f"pool {POOL} not full in 120 s: {stack.kubectl('get', 'pods', '-n', stack.namespace).stdout}"
    )


def interactive(name: str, **spec: Any) -> dict[str, Any]:
    return run_doc(name, sandboxPolicy={"class": "interactive"}, **spec)


async def warm_sandboxes(stack: Stack) -> set[str]:
    listed = await stack.kube.list(path(AGENTS, "sandboxes", stack.namespace))
    return {s["metadata"]["name"] for s in listed["items"]}


async def claimed(stack: Stack, run: str) -> tuple[str, str]:
    """(claim, sandbox) of the Run's current attempt, from its status."""
    return claimed_in(
        (await stack.kube.get(path("ksquad.io/v1alpha1", "runs", stack.namespace, run)))["status"]
    )


def claimed_in(status: dict[str, Any]) -> tuple[str, str]:
    assert (status.get("sandbox") or {}).get("kind") == "claimed", json.dumps(status)[:2000]
    claim, _, sandbox = status["sandbox"]["name"].partition("/")
    return claim, sandbox


async def gone(stack: Stack, claim: str, sandbox: str) -> bool:
    for url in (
        path(EXTENSIONS, "sandboxclaims", stack.namespace, claim),
        path(AGENTS, "sandboxes", stack.namespace, sandbox),
        path("v1", "pods", stack.namespace, sandbox),
    ):
        try:
            await stack.kube.get(url)
            return False
        except ApiError as err:
            if err.status != 404:
                raise
    return True


async def test_a_run_claims_the_pools_warm_sandbox_and_leaves_nothing_behind(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"text": "answered from a claimed sandbox"})
    stack = await agent_sandbox_stack(start_stack, model, replicas=1)
    warm = await warm_sandboxes(stack)
    stack.apply(*stack.resources(model), interactive("claims"))
    await stack.wait_phase("claims", {"Running", "Succeeded"})
    claim, sandbox = await claimed(stack, "claims")
    assert claim == "claims-exec-1" and sandbox in warm, (claim, sandbox, warm)
    pod = await stack.kube.get(path("v1", "pods", stack.namespace, sandbox))
    assert pod["metadata"]["annotations"]["ksquad.io/caller-token-sha256"], (
        "the attempt's caller hash reached the pod"
    )
    run = await stack.wait_phase("claims", {"Succeeded", "Failed"}, within=120)
    assert run["status"]["phase"] == "Succeeded", json.dumps(run["status"])[:2000]
    assert run["status"]["outputs"] == {"answer": "answered from a claimed sandbox"}
    await wait_for_async(lambda: gone(stack, claim, sandbox), "the claim, its Sandbox and its pod gone")
    await pool_full(stack, 1)  # agent-sandbox made the pool whole again


async def test_a_claimed_sandbox_killed_mid_run_is_confirmed_gone_and_the_retry_claims_another(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 600, "text": "never"}, {"text": "done in the second sandbox"})
    stack = await agent_sandbox_stack(start_stack, model, replicas=1)
    stack.apply(*stack.resources(model), interactive("fragile", workItemRef="wi-fragile"))
    await stack.wait_phase("fragile", {"Running"})
    await wait_for(lambda: model.state.in_flight == 1, "the agent's model call", within=120)
    claim, sandbox = await claimed(stack, "fragile")
    stack.kubectl("delete", "pod", sandbox, "-n", stack.namespace, "--grace-period=0", "--force")

    run = await stack.wait_phase("fragile", {"Succeeded", "Failed"}, within=240)
    status = run["status"]
    assert status["phase"] == "Succeeded", json.dumps(status)[:2000]
    assert status["attempt"] == 2 and status["outputs"] == {"answer": "done in the second sandbox"}, status
    told = await stack.phase_log(run["metadata"]["uid"])
    assert in_order(told, ["Running", "RetryBackoff", "Claiming", "Running"]), told
    # The first sandbox (whose Sandbox made its pod again after the kill) was gone before the retry's claim.
    assert await gone(stack, claim, sandbox)
    assert len(model.state.calls) == 2, "one call per attempt"


async def test_a_run_deleted_mid_run_takes_its_claimed_sandbox_with_it(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    model.script("dev-model", {"delay": 120, "text": "never"})
    stack = await agent_sandbox_stack(start_stack, model, replicas=1)
    stack.apply(*stack.resources(model), interactive("doomed"))
    await stack.wait_phase("doomed", {"Running"})
    await wait_for(lambda: model.state.in_flight == 1, "the agent's model call", within=120)
    claim, sandbox = await claimed(stack, "doomed")
    stack.kubectl("delete", "run", "doomed", "-n", stack.namespace, "--wait=true", "--timeout=90s")
    await wait_for_async(lambda: gone(stack, claim, sandbox), "the claim, its Sandbox and its pod gone")


@pytest.mark.timeout(600)
async def test_runs_claiming_together_each_get_a_sandbox_of_their_own(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    """Three Runs at once on a pool of two: two adopt warm sandboxes, the third is made one (or waits for the
    refill); no sandbox serves two."""
    names = ["c1", "c2", "c3"]
    model.script("dev-model", *({"delay": 3, "text": "mine"} for _ in names))
    stack = await agent_sandbox_stack(start_stack, model, replicas=2)
    stack.apply(*stack.resources(model), *(interactive(n) for n in names))

    async def sandbox_while_held(name: str) -> str:
        """The Run's sandbox, read while it holds it (for its model call's 3 s). The three are watched together:
        one after the other, a Run could end (its sandbox released, gone from its status) while the test still
        waited for the one before."""
        for _ in range(1800):
            status = (await stack.run(name)).get("status", {})
            if status.get("sandbox"):
                return claimed_in(status)[1]
            assert status.get("phase") not in ("Succeeded", "Failed"), (
                f"{name} ended before its sandbox was seen: {json.dumps(status)[:2000]}"
            )
            await asyncio.sleep(0.1)
        raise AssertionError(f"{name} held no sandbox within 180 s")

    sandboxes = dict(zip(names, await asyncio.gather(*(sandbox_while_held(n) for n in names)), strict=True))
    assert len(set(sandboxes.values())) == len(names), sandboxes
    for name in names:
        run = await stack.wait_phase(name, {"Succeeded", "Failed"}, within=180)
        assert run["status"]["phase"] == "Succeeded", json.dumps(run["status"])[:2000]


async def wait_for_async(check: Any, what: str, within: float = 120) -> None:
    for _ in range(int(within / 0.25)):
        if await check():
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"no {what} within {within} s")


async def test_a_sandbox_not_of_the_charts_template_is_not_used_and_the_run_goes_cold(
    start_stack: StackFactory, model: ModelEndpoint
) -> None:
    """Someone changed the pool's SandboxTemplate (an operator by hand; an editor is refused by the admission policy):
    agent-sandbox hands out a pod of the new template. The worker compares the pod with the template the chart
    rendered, deletes the claim and runs the attempt in a cold Job; the changed pod never gets the attempt's task."""
    model.script("dev-model", {"delay": 3, "text": "answered from a cold Job"})
    stack = await agent_sandbox_stack(start_stack, model, replicas=1)
    template = f"ksquad-pool-{POOL}"
    added = [
        {
            "op": "add",
            "path": "/spec/podTemplate/spec/containers/0/env/-",
            "value": {"name": "X", "value": "1"},
        }
    ]
    stack.kubectl(
        "patch", "sandboxtemplate", template, "-n", stack.namespace, "--type=json", "-p", json.dumps(added)
    )
    stack.kubectl("delete", "sandboxes", "--all", "-n", stack.namespace, "--wait=true", "--timeout=60s")
    await pool_full(stack, 1)  # made again, of the changed template
    stack.apply(interactive("refused"))
    running = await stack.wait_phase("refused", {"Running", "Succeeded", "Failed"}, within=180)
    assert running["status"].get("sandbox") == {"kind": "cold", "name": "refused-exec-1"}, running["status"]
    run = await stack.wait_phase("refused", {"Succeeded", "Failed"}, within=180)
    assert run["status"]["phase"] == "Succeeded", json.dumps(run["status"])[:2000]
    await wait_for_async(
        lambda: gone(stack, "refused-exec-1", "no-such-sandbox"), "the refused claim deleted"
    )
    said = (stack.root / "worker.log").read_text()
    assert "claim" in said and "not used: not the pool's template" in said, "the claim was made, and refused"
    assert len(model.state.calls) == 1, "one call, from the cold Job"
