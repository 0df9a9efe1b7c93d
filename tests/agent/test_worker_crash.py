"""The worker running invoke_agent is SIGKILLed mid-stream: the retried activity resubscribes to the same
remote task, and the agent received exactly one message."""

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType

from activities.agents import CallerKeys
from agent.callers import SANDBOX_KEY_ENV, TOKEN_SHA256_ANNOTATION, read_key
from dev.devserver import DevServer
from store import Holder, Store, work_item_key
from temporal_client.connection import connect
from testbed import warrants
from testbed.agents import AgentFactory, ModelEndpoint, contract
from tests.support.workflows import InvokeAgentOnce


def start_worker(
    dev_server: DevServer, task_queue: str, db: str, log: Path, key: Path
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.agent.invoke_worker", dev_server.target, task_queue, db],
        env={**os.environ, SANDBOX_KEY_ENV: str(key)},
        stdout=subprocess.PIPE,
        stderr=log.open("ab"),
        cwd=Path(__file__).parents[2],
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"worker ready", log.read_text()[-2000:]
    return process


async def test_a_killed_worker_does_not_make_the_agent_run_twice(
    dev_server: DevServer, model: ModelEndpoint, start_agent: AgentFactory, tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'ksquad.db'}"
    store = await Store.open(db)
    holder = Holder("uid-r", "payments/r", "alice@example.com")
    fence = (await store.claim(work_item_key("payments", "wi-1"), holder, 120)).fence
    model.script("dev-model", {"delay": 6, "text": "Fixed, once."})
    c = contract(model, fence=fence)
    key = tmp_path / "sandbox-token.key"  # both workers hold it, as every replica of a deployment does
    key.write_bytes(os.urandom(32))
    annotations = tmp_path / "annotations"  # what the sandbox learns: the token's hash only
    digest = CallerKeys(read_key(key)).sandbox_token_sha256(c.run)
    annotations.write_text(f'{TOKEN_SHA256_ANNOTATION}="{digest}"\n')
    agent = await start_agent(c, annotations=annotations)
    invocation = warrants.invocation(c, agent.url)
    task_queue = f"crash-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "workers.log"

    first = await asyncio.to_thread(start_worker, dev_server, task_queue, db, log, key)
    client = await connect(dev_server.target)
    handle = await client.start_workflow(
        InvokeAgentOnce.run, invocation, id=f"crash-{uuid.uuid4()}", task_queue=task_queue
    )
    for _ in range(400):  # until the agent is mid-task (its model call in flight)
        if model.state.in_flight == 1:
            break
        await asyncio.sleep(0.02)
    assert model.state.in_flight == 1, "the agent is mid-task when the worker is killed"
    await asyncio.sleep(1.0)  # a heartbeat or two carry the remote task id
    first.kill()
    first.wait()
    second = await asyncio.to_thread(start_worker, dev_server, task_queue, db, log, key)
    try:
        result = await asyncio.wait_for(handle.result(), 60)
    finally:
        second.kill()
        second.wait()
        await store.close()

    assert result.outputs == {"answer": "Fixed, once."}
    stats = await agent.stats()
    assert stats["messages"] == 1, "the agent received exactly one message"
    assert stats["duplicates"] == 0, "the retried activity did not even send it again"
    assert len(model.state.calls) == 1, "the model was called once"
    started = [
        e
        async for e in handle.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert started[-1].activity_task_started_event_attributes.attempt == 2, (
        "the activity ran again, on the new worker"
    )
