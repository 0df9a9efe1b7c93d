"""`ksquad-bridge`: the CRD bridge process.

Every replica serves the `ksquad-bridge` task queue (resolve_references, mirror_status: both safe to run
anywhere); the replica holding the Lease also reconciles Runs and watches credentials. Health on
`KSQUAD_HEALTH_PORT` (8081): `/healthz` (alive), `/readyz` (serving the task queue).
"""

import asyncio
import contextlib
import logging
import signal
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.worker import Worker

from crd_bridge.activities import BridgeActivities
from crd_bridge.credentials import CredentialWatcher
from crd_bridge.leader import LeaderElector, LostLeadership
from crd_bridge.runs import RunReconciler
from crd_bridge.settings import BridgeSettings
from kube import Config, Kube
from workflows.activity_types import BRIDGE_TASK_QUEUE
from workflows.client import connect

log = logging.getLogger("ksquad.bridge")


async def serve(settings: BridgeSettings) -> int:
    state = {"ready": False, "leader": False}

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "leader": state["leader"]})

    async def readyz(_: Request) -> JSONResponse:
        return JSONResponse({"ready": state["ready"]}, status_code=200 if state["ready"] else 503)

    health = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz)]),
                                           host="0.0.0.0", port=settings.health_port, log_level="warning",
                                           lifespan="off"))  # fmt: skip
    health.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async with Kube(Config.load(settings.kubeconfig)) as kube:
        temporal = await connect(settings.temporal_address, settings.temporal_namespace,
                                 api_key=settings.temporal_api_key, tls=settings.temporal_tls)  # fmt: skip
        bridge = BridgeActivities(kube, settings.identity, settings.namespace_max_concurrent_runs)
        health_task = asyncio.create_task(health.serve())
        worker = Worker(temporal, task_queue=BRIDGE_TASK_QUEUE, activities=bridge.all())
        code = 0
        async with worker:
            state["ready"] = True
            elector = LeaderElector(kube, settings.lease_namespace, settings.lease_name, settings.identity)
            stopping = asyncio.create_task(stop.wait())
            acquiring = asyncio.create_task(elector.acquire())
            await asyncio.wait([stopping, acquiring], return_when=asyncio.FIRST_COMPLETED)
            if acquiring.done():
                state["leader"] = True
                reconciler = RunReconciler(kube, temporal, settings, bridge)
                tasks = [asyncio.create_task(reconciler.run()), asyncio.create_task(CredentialWatcher(kube, temporal).run()),
                         asyncio.create_task(elector.keep())]  # fmt: skip
                done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    task.cancel()
                for task in done:
                    if task is not stopping and task.exception() is not None:
                        error = task.exception()
                        log.error("stopping: %s", error)
                        code = 1 if isinstance(error, LostLeadership) else 2
            else:
                acquiring.cancel()
            state["ready"] = False
        health.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await health_task
    return code


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "temporalio.activity"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sys.exit(asyncio.run(serve(BridgeSettings.from_env())))


if __name__ == "__main__":
    main()
