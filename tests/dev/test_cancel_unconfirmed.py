"""Cancelling has a bound when the agent never confirms (embedded default: Temporal's dev server, the worker, SQLite,
ksquad's API, the scripted model, the shared reference agent as its own process). The Run's agent is an `endpoint`
behind a proxy that loses every CancelTask, and its model call is held, so the agent is at work and never hears
the cancel. Cancelled, the Run still ends Cancelled, while the agent's call is still held, and says why it could not
be sure: AgentStopped=False (CancelUnconfirmed, naming the attempt and the task), the same words in the Cancelled
message, and Cancelling then Cancelled in its events. (A local sandbox's agent that hears no cancel is killed with
its sandbox, and the condition says so: tests/dev/test_superseded_attempts.py.)"""

import asyncio
import time
from pathlib import Path
from typing import Any

from dev.stack import dev_stack
from testbed.asgi import serving
from testbed.embedded import stack_options, start_agent, wait_terminal
from tests.support.a2a_proxy import dropping_cancels
from workflows.signals import RunSignal

NS = "bench"  # the test bed's instant agent serves this namespace
API = "ksquad.io/v1alpha1"
SCRIPT: dict[str, list[dict[str, Any]]] = {"held": [{"hold": True, "text": "never sent"}]}


async def test_a_run_whose_agent_never_confirms_the_cancel_ends_cancelled_and_says_so(tmp_path: Path) -> None:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as dev:
        assert dev.scripted is not None
        dev.scripted.held = True
        agent = await start_agent(dev)
        try:
            instant = await dev.runs.objects.get("Agent", NS, "instant")
            assert instant is not None
            proxy = dropping_cancels(instant.spec["endpoint"])
            async with serving(proxy) as proxy_url:

                def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
                    return {
                        "apiVersion": API,
                        "kind": kind,
                        "metadata": {"name": name, "namespace": NS},
                        "spec": spec,
                    }

                agent_spec = {"model": "held", "modelEndpointRef": "local", "endpoint": f"{proxy_url}/"}
                await dev.runs.apply(
                    [
                        obj("Agent", "deaf", agent_spec),
                        obj("Run", "ignored", {"agents": ["deaf"], "inputs": {"task": "Work."}}),
                    ]
                )
                deadline = time.monotonic() + 60
                while dev.scripted.in_flight != 1:
                    assert time.monotonic() < deadline, "the agent's model call never came"
                    await asyncio.sleep(0.1)

                await dev.runs.signal(NS, "ignored", RunSignal.CANCEL, "not needed")
                assert await wait_terminal(dev, ["ignored"], within=60) == {"ignored": "Cancelled"}

                assert dev.scripted.in_flight == 1, "the Run ended at its bound, not when the agent let go"
                (task_id,) = proxy.state.dropped  # the one CancelTask, lost
                run = await dev.runs.get(NS, "ignored")
                status = run.status or {}
                (stopped,) = [c for c in status["conditions"] if c["type"] == "AgentStopped"]
                assert (stopped["status"], stopped["reason"]) == ("False", "CancelUnconfirmed"), stopped
                assert stopped["message"] == (
                    f"attempt 1: deaf did not confirm the cancel of its task {task_id} within 10s: "
                    "it may still be at work"
                )
                assert status["message"] == f"not needed; {stopped['message']}"
                phases = [e.data["phase"] for e in await dev.store.events(run.uid, kind="phase")]
                assert phases[-2:] == ["Cancelling", "Cancelled"], phases
        finally:
            dev.scripted.held = False
            agent.terminate()
            agent.wait(10)
