"""`ksquad-worker`: connect to Temporal and serve the ksquad task queue until SIGTERM or Ctrl-C."""

import asyncio
import logging
import signal

from temporalio.client import Client

from worker.registry import build_worker
from worker.settings import Settings

log = logging.getLogger("ksquad.worker")


async def serve(settings: Settings) -> None:
    client = await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace)
    worker = build_worker(client, settings.task_queue)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "serving task queue %s on %s (namespace %s)",
        settings.task_queue,
        settings.temporal_address,
        settings.temporal_namespace,
    )
    async with worker:
        await stop.wait()
    log.info("stopped")


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(Settings.from_env()))
