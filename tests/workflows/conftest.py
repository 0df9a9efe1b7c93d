from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from testbed.temporal import start_time_skipping
from tests.workflows.world import World, running_world


@pytest.fixture
async def ts_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping Temporal of the test's own: entity workflows and ids never leak between tests."""
    env = await start_time_skipping()
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
async def client(ts_env: WorkflowEnvironment, world: World) -> AsyncIterator[Client]:
    async with running_world(ts_env, world) as client:
        yield client
