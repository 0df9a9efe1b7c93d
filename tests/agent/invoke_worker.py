"""A worker process for the worker-crash test: InvokeAgentOnce and the real invoke_agent activity.

python -m tests.agent.invoke_worker TARGET TASK_QUEUE DATABASE_URL

The sandbox token key comes from KSQUAD_SANDBOX_TOKEN_KEY_FILE, as the production worker's does: the workers the
test starts one after the other make the same token for the attempt.
"""

import asyncio
import sys

from activities.agents import AgentActivities, CallerKeys, Timing
from store import Store
from temporal_client.connection import connect
from tests.support.workflows import InvokeAgentOnce
from worker.registry import build_worker


async def main(target: str, task_queue: str, database_url: str) -> None:
    store = await Store.open(database_url)
    client = await connect(target)
    agents = AgentActivities(store, Timing(heartbeat_seconds=0.5), CallerKeys.from_env())
    async with build_worker(client, task_queue, [agents.invoke_agent], workflows=[InvokeAgentOnce]):
        print("worker ready", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
