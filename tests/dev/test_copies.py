"""A copy of a real Run's start input, as a client of the Temporal namespace without the codec key makes it: the
ciphertext read from the Run's history and started again with `temporal workflow start` under a workflow id of
their own, under the Run's own id once it has closed, or beside the Run while it runs. Each copy is refused
before anything is done (crd_bridge.envelopes, worker.seals): the Run's status, its work item's thread, its
answer, its usage, the model's calls and the sandboxes are as they were, and the Run's event stream says that a
copy was refused, naming it. A codec user who edits one field of the envelope (who is charged, which item is
written, the inputs, the uid) breaks its seal instead."""

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload

from crd_bridge.envelopes import COPIES_REFUSED
from dev.stack import DevStack, dev_stack
from testbed.embedded import stack_options, wait_terminal
from tests.dev.test_temporal_writers import final_state, temporal
from workflows.activity_types import WORKER_TASK_QUEUE
from workflows.status import RunStatus

NS = "bench"  # wait_terminal's namespace
API = "ksquad.io/v1alpha1"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "m": [{"text": "the answer"}],
    "slow": [{"delay": 4, "text": "slowly"}],
}


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as stack:
        yield stack


async def victim_run(dev: DevStack, name: str, model: str = "m") -> None:
    await dev.store.create_item(NS, f"{name}-item", title="the victim's item", created_by="alice")
    await dev.runs.apply(
        [
            {
                "apiVersion": API,
                "kind": "Agent",
                "metadata": {"name": f"agent-{name}", "namespace": NS},
                "spec": {"modelEndpointRef": "local", "model": model},
            },
            {
                "apiVersion": API,
                "kind": "Run",
                "metadata": {"name": name, "namespace": NS},
                "spec": {
                    "agents": [f"agent-{name}"],
                    "inputs": {"task": "answer"},
                    "workItemRef": f"{name}-item",
                },
            },
        ]
    )


async def start_input(dev: DevStack, workflow_id: str) -> Payload:
    """The Run's start input as its history holds it: ciphertext and its metadata (what a client without the codec
    key can read and copy)."""
    async for event in dev.client.get_workflow_handle(workflow_id).fetch_history_events():
        (payload,) = event.workflow_execution_started_event_attributes.input.payloads
        return payload
    raise AssertionError("no history")


async def start_copy(dev: DevStack, workflow_id: str, copied: Payload) -> None:
    meta = [arg for k, v in copied.metadata.items() for arg in ("--input-meta", f"{k}={v.decode()}")]
    started = await temporal(
        dev,
        "workflow",
        "start",
        "--type",
        "RunWorkflow",
        "--task-queue",
        WORKER_TASK_QUEUE,
        "-w",
        workflow_id,
        "--input-base64",
        "--input",
        base64.b64encode(copied.data).decode(),
        *meta,
    )
    assert started.returncode == 0, started.stderr


async def ended(dev: DevStack, workflow_id: str, within: float = 60) -> RunStatus:
    handle = dev.client.get_workflow_handle(workflow_id, result_type=RunStatus)
    result: RunStatus = await asyncio.wait_for(handle.result(), within)
    return result


@dataclass
class Victim:
    """Everything of a Run that a copy could touch."""

    status: dict[str, Any]
    thread: list[tuple[str, str, int | None]]
    answer: Any
    usage: Any
    events: list[str]
    model_calls: int
    sandboxes: list[str]


async def victim(dev: DevStack, name: str) -> Victim:
    run = await dev.runs.get(NS, name)
    thread = [(e.kind, e.body, e.fence) for e in await dev.store.item_events(NS, f"{name}-item")]
    assert dev.scripted is not None
    return Victim(
        status=dict(run.status or {}),
        thread=thread,
        answer=await dev.store.artifact(run.uid, "answer"),
        usage=await dev.store.run_usage(run.uid),
        events=[f"{e.kind}: {e.message}" for e in await dev.store.events(run.uid)],
        model_calls=len(dev.scripted.calls),
        sandboxes=sorted(p.name for p in (dev.state_dir / "sandboxes").glob("*")),
    )


def refused_so_far() -> float:
    return float(sum(COPIES_REFUSED.labels(a)._value.get() for a in ("resolve_references", "mirror_status")))


async def test_a_copy_of_a_finished_runs_start_input_is_refused_under_a_new_id_and_under_its_own(
    dev: DevStack,
) -> None:
    await victim_run(dev, "done")
    assert await wait_terminal(dev, ["done"], within=60) == {"done": "Succeeded"}
    before, counted = await victim(dev, "done"), refused_so_far()
    copied = await start_input(dev, f"{NS}/done")

    await start_copy(dev, "attacker/copy", copied)  # under a workflow id of the attacker's
    copy = await ended(dev, "attacker/copy")
    assert (copy.phase, copy.reason) == ("Failed", "CopyRefused"), copy
    assert f"sealed for workflow {NS}/done" in (copy.message or "")

    await start_copy(dev, f"{NS}/done", copied)  # under the Run's own id, now that it has closed
    again = await ended(dev, f"{NS}/done")
    assert (again.phase, again.reason) == ("Failed", "CopyRefused"), again
    assert "is not the execution the bridge started" in (again.message or "")

    after = await victim(dev, "done")
    assert after.events[: len(before.events)] == before.events
    notices = after.events[len(before.events) :]
    assert notices and all(e.startswith("refusal: ") for e in notices), notices
    assert any("attacker/copy" in e for e in notices) and any(f"{NS}/done run" in e for e in notices), notices
    for field in ("status", "thread", "answer", "usage", "model_calls", "sandboxes"):
        assert getattr(after, field) == getattr(before, field), f"the copy changed the Run's {field}"
    assert refused_so_far() >= counted + 2, "ksquad_copies_refused_total counts them"


async def test_a_copy_started_beside_a_live_run_is_refused_and_the_run_goes_on(dev: DevStack) -> None:
    await victim_run(dev, "live", model="slow")
    deadline = time.monotonic() + 30
    while ((await dev.runs.get(NS, "live")).status or {}).get("phase") != "Running":
        assert time.monotonic() < deadline, "the Run never ran"
        await asyncio.sleep(0.1)
    await start_copy(dev, "attacker/beside", await start_input(dev, f"{NS}/live"))
    copy = await ended(dev, "attacker/beside")
    assert (copy.phase, copy.reason) == ("Failed", "CopyRefused"), copy
    assert await wait_terminal(dev, ["live"], within=60) == {"live": "Succeeded"}
    after = await victim(dev, "live")
    assert after.model_calls == 1, "the model was asked once, by the Run itself"
    assert [kind for kind, _, _ in after.thread].count("artifact") == 1, "one answer on the item"
    assert len(after.sandboxes) == 1, "one sandbox: the Run's"


async def test_a_sealed_envelope_with_any_field_changed_by_a_codec_user_is_refused(dev: DevStack) -> None:
    """Through the codec the attacker reads the Run's envelope and writes their own with one field changed: who is
    charged, which item is written, the inputs, which Run it is. Its seal no longer holds."""
    await victim_run(dev, "sealed")
    assert await wait_terminal(dev, ["sealed"], within=60) == {"sealed": "Succeeded"}
    codec = dev.client.data_converter.payload_codec
    assert codec is not None
    (clear,) = await codec.decode([await start_input(dev, f"{NS}/sealed")])
    body = json.loads(clear.data)
    forgeries = {
        "charged": {**body, "triggeredBy": "mallory"},
        "item": {**body, "spec": {**body["spec"], "workItemRef": "someone-elses-item"}},
        "inputs": {**body, "spec": {**body["spec"], "inputs": {"task": "leak the key"}}},
        "uid": {**body, "uid": "uid-of-another-run"},
    }
    for label, forged in forgeries.items():  # each under the Run's own id: only the changed field differs
        started = await temporal(
            dev,
            "workflow",
            "start",
            "--type",
            "RunWorkflow",
            "--task-queue",
            WORKER_TASK_QUEUE,
            "-w",
            f"{NS}/sealed",
            "--input",
            json.dumps(forged),
            codec=True,
        )
        assert started.returncode == 0, started.stderr
        state = await final_state(dev, f"{NS}/sealed")
        assert (state["phase"], state["reason"]) == ("Failed", "Unsealed"), (label, state)
    assert dev.scripted is not None and len(dev.scripted.calls) == 1, "only the Run itself asked the model"
