"""The Temporal part of the test bed: both servers come from wheels and behave as ksquad needs."""

import asyncio
import time
import uuid

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.support.workflows import SleepWorkflow, TaggedWorkflow
from workflows import search_attributes as sa

FIVE_HOURS = 5 * 3600


async def test_time_skipping_sleeps_five_hours_of_workflow_time(
    time_skipping_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = time_skipping_env.client
    async with Worker(client, task_queue=task_queue, workflows=[SleepWorkflow]):
        started = time.monotonic()
        slept = await client.execute_workflow(
            SleepWorkflow.run, FIVE_HOURS, id=f"sleep-{uuid.uuid4()}", task_queue=task_queue
        )
        wall = time.monotonic() - started
    assert slept >= FIVE_HOURS
    # Not a timing target: proof that the server skipped time instead of waiting for it.
    assert wall < 60, f"5 hours of workflow time took {wall:.1f}s of wall time: time was not skipped"


async def test_dev_server_lists_workflows_by_custom_search_attribute(
    temporal_client: Client, task_queue: str
) -> None:
    phase = f"Tested-{uuid.uuid4().hex[:8]}"  # unique, so other tests' workflows cannot match
    ids = [f"tagged-{uuid.uuid4()}" for _ in range(3)]
    async with Worker(temporal_client, task_queue=task_queue, workflows=[TaggedWorkflow]):
        for wf_id in ids[:2]:
            await temporal_client.execute_workflow(TaggedWorkflow.run, phase, id=wf_id, task_queue=task_queue)
        await temporal_client.execute_workflow(TaggedWorkflow.run, "Other", id=ids[2], task_queue=task_queue)

    query = f'{sa.PHASE.name} = "{phase}" AND {sa.ATTEMPT.name} = 1'
    listed: set[str] = set()
    for _ in range(100):  # visibility is eventually consistent
        listed = {wf.id async for wf in temporal_client.list_workflows(query)}
        if len(listed) >= 2:
            break
        await asyncio.sleep(0.1)
    assert listed == set(ids[:2])
