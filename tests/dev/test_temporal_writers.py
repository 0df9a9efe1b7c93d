"""Whoever can write to the Temporal namespace, as the embedded stack meets them: `temporal workflow start` and
`signal` from the CLI, without the codec (no key) or through the codec endpoint (someone allowed to decode,
who can encode too). They cannot make the worker make a sandbox, read a credential or call a model the bridge
did not resolve for a Run: a payload in clear is refused, an envelope they wrote is not sealed, and a resolution
they carry in as if continued as new is not taken (tests/dev/test_copies.py: copies of a real Run's)."""

import asyncio
import json
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus

from agent.scripted_model import ScriptedModel, build_app
from dev.embedded import LOCAL_CREDENTIAL_SECRET
from dev.stack import DevStack, dev_stack
from testbed.asgi import serving
from testbed.embedded import stack_options, wait_terminal
from workflows.activity_types import WORKER_TASK_QUEUE
from workflows.contract import CredentialRef, ModelRef, Resolution, ResolvedAgent
from workflows.run import RunInput
from workflows.run.state import RunCarry
from workflows.spec import RunSpec
from workflows.status import RunStatus

TEMPORAL = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "temporal")


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path / ".ksquad", {"m": [{"text": "ok"}]})) as stack:
        yield stack


@pytest.fixture
async def listener() -> AsyncIterator[tuple[str, ScriptedModel]]:
    """The attacker's server: where they want the developer's model key sent."""
    state = ScriptedModel()
    state.load({"m": [{"text": "thanks for the key"}]})
    async with serving(build_app(state)) as url:
        yield f"{url}/v1", state


def forged_input(name: str, model_url: str) -> dict[str, Any]:
    """A Run's workflow input as the attacker writes it: a resolution naming the local key and their own URL."""
    stolen = ModelRef(name="m", url=model_url, credential=CredentialRef(secret_name=LOCAL_CREDENTIAL_SECRET))
    resolution = Resolution(outcome="resolved", agents=[ResolvedAgent(name="thief", model=stolen)])
    run = RunInput(
        namespace="attacker",
        name=name,
        uid=f"uid-{name}",
        spec=RunSpec(agents=["thief"]),
        carry=RunCarry(status=RunStatus(), resolution=resolution),
    )
    return run.model_dump(mode="json", by_alias=True)


async def temporal(dev: DevStack, *args: str, codec: bool = False) -> subprocess.CompletedProcess[str]:
    """The temporal CLI, in a thread: the codec endpoint it calls is served by this process's event loop."""
    command = [TEMPORAL, *args, "--address", dev.server.target]
    if codec:  # as someone allowed to use the codec endpoint (it encodes for whoever may decode)
        token = (dev.state_dir / "api.token").read_text().strip()
        command += ["--codec-endpoint", f"{dev.api_url}/codec", "--codec-auth", f"Bearer {token}"]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)


async def start(dev: DevStack, name: str, body: dict[str, Any], codec: bool = False) -> None:
    started = await temporal(
        dev,
        "workflow",
        "start",
        "--type",
        "RunWorkflow",
        "--task-queue",
        WORKER_TASK_QUEUE,
        "-w",
        f"attacker/{name}",
        "--input",
        json.dumps(body),
        codec=codec,
    )
    assert started.returncode == 0, started.stderr


async def final_state(dev: DevStack, workflow_id: str, within: float = 60) -> dict[str, Any]:
    handle = dev.client.get_workflow_handle(workflow_id, result_type=RunStatus)
    result = await asyncio.wait_for(handle.result(), within)
    dumped: dict[str, Any] = result.model_dump(mode="json", by_alias=True)
    return dumped


async def test_a_workflow_started_in_clear_never_runs(
    dev: DevStack, listener: tuple[str, ScriptedModel]
) -> None:
    url, attacker = listener
    await start(dev, "in-clear", forged_input("in-clear", url))
    handle = dev.client.get_workflow_handle("attacker/in-clear")
    failures: list[str] = []
    for _ in range(100):
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                # The failure's text is encrypted too: read it as an operator does, through the codec.
                error: BaseException | None = await dev.client.data_converter.decode_failure(
                    event.workflow_task_failed_event_attributes.failure
                )
                while error is not None:
                    failures.append(str(error))
                    error = error.__cause__
        if failures:
            break
        await asyncio.sleep(0.1)
    assert failures, "the worker took the workflow's input in clear"
    assert any("refused a RunInput in clear" in f for f in failures), failures
    await asyncio.sleep(2)  # what the worker would have done by now, had it taken the input
    assert not attacker.calls, "the attacker's server was called"
    assert not list((dev.state_dir / "sandboxes").glob("in-clear-*")), "a sandbox was made"
    await handle.terminate("test over")


async def test_a_resolution_written_by_a_codec_user_is_refused_before_any_sandbox_or_call(
    dev: DevStack, listener: tuple[str, ScriptedModel]
) -> None:
    url, attacker = listener
    await start(dev, "forged", forged_input("forged", url), codec=True)
    state = await final_state(dev, "attacker/forged")
    assert (state["phase"], state["reason"]) == ("Failed", "Unsealed"), state
    assert "not one the bridge sealed" in state["message"] and "KSQUAD_SEAL_KEY_FILE" in state["message"]
    assert not attacker.calls, "the attacker's server was called"
    assert not list((dev.state_dir / "sandboxes").glob("forged-*")), "a sandbox was made"


async def test_a_workflow_for_a_run_that_does_not_exist_resolves_to_nothing(dev: DevStack) -> None:
    body = forged_input("no-such-run", "http://127.0.0.1:9/v1")
    body.pop("carry")  # no resolution of its own: the bridge is asked
    await start(dev, "no-such-run", body, codec=True)
    state = await final_state(dev, "attacker/no-such-run")
    assert (state["phase"], state["reason"]) == ("Failed", "Unsealed"), state


# Workflows started under a Team's gate id before its Runs come, each a way of never answering: another type; the
# gate's type on a queue no ksquad worker polls; the gate's type with its input in clear (it never runs a task).
GATE_IMPOSTORS = {
    "another type": ("NotAGate", WORKER_TASK_QUEUE, {"scope": "team/bench/one"}),
    "a queue nobody polls": ("ConcurrencyGate", "nobody-polls-this", {"scope": "team/bench/one"}),
    "its input in clear": ("ConcurrencyGate", WORKER_TASK_QUEUE, {"scope": "team/bench/one"}),
}


@pytest.mark.parametrize("impostor", list(GATE_IMPOSTORS))
async def test_a_workflow_squatting_a_gates_id_is_terminated_and_the_teams_runs_are_admitted(
    dev: DevStack, impostor: str
) -> None:
    """The gate's id is ksquad's: a Run's request to it reaches only a ConcurrencyGate on ksquad's queue that the
    worker can read. Before, the request went to whatever ran under the id, and every Run of the Team waited."""
    kind, queue, body = GATE_IMPOSTORS[impostor]
    started = await temporal(
        dev,
        "workflow",
        "start",
        "--type",
        kind,
        "--task-queue",
        queue,
        "-w",
        "gate/team/bench/one",
        "--input",
        json.dumps(body),
    )
    assert started.returncode == 0, started.stderr
    squatter = dev.client.get_workflow_handle("gate/team/bench/one")
    squatter_run = (await squatter.describe()).run_id
    api = "ksquad.io/v1alpha1"
    await dev.runs.apply(
        [
            {
                "apiVersion": api,
                "kind": "Agent",
                "metadata": {"name": "a", "namespace": "bench"},
                "spec": {"modelEndpointRef": "local", "model": "m"},
            },
            {
                "apiVersion": api,
                "kind": "Team",
                "metadata": {"name": "one", "namespace": "bench"},
                "spec": {"agents": ["a"], "maxConcurrentRuns": 1},
            },
            *[
                {
                    "apiVersion": api,
                    "kind": "Run",
                    "metadata": {"name": f"r{i}", "namespace": "bench"},
                    "spec": {"agents": [], "teamRef": "one"},
                }
                for i in (1, 2)
            ],
        ]
    )
    assert await wait_terminal(dev, ["r1", "r2"], within=90) == {"r1": "Succeeded", "r2": "Succeeded"}
    ended = dev.client.get_workflow_handle("gate/team/bench/one", run_id=squatter_run)
    assert (await ended.describe()).status == WorkflowExecutionStatus.TERMINATED
    async for event in ended.fetch_history_events():
        if event.HasField("workflow_execution_terminated_event_attributes"):
            reason = event.workflow_execution_terminated_event_attributes.reason
            assert reason.startswith("not ksquad's ConcurrencyGate: "), reason
    gate = await dev.client.get_workflow_handle("gate/team/bench/one").describe()
    assert (gate.workflow_type, gate.task_queue) == ("ConcurrencyGate", WORKER_TASK_QUEUE)
