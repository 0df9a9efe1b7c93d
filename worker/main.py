"""`ksquad-worker`: connect to Temporal and the coordination store, serve the ksquad task queue until SIGTERM
or Ctrl-C."""

import asyncio
import logging
import signal
from pathlib import Path

from activities.agents import AgentActivities
from activities.claims import ClaimActivities
from activities.store import Store
from worker.registry import build_worker
from worker.settings import Settings
from worker.temporal import connect

log = logging.getLogger("ksquad.worker")


async def serve(settings: Settings) -> None:
    if settings.database_url.startswith("sqlite:///"):
        Path(settings.database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    store = await Store.open(settings.database_url)  # migrates to the newest schema first
    client = await connect(settings.temporal_address, settings.temporal_namespace)
    activities = [*ClaimActivities(store).all(), AgentActivities(store).invoke_agent]
    worker = build_worker(client, settings.task_queue, activities)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("serving task queue %s on %s (namespace %s), store %s", settings.task_queue,
             settings.temporal_address, settings.temporal_namespace, store.engine.url.render_as_string())  # fmt: skip
    try:
        async with worker:
            await stop.wait()
    finally:
        await store.close()
    log.info("stopped")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(Settings.from_env()))
