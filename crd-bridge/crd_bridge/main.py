"""`ksquad-bridge`: the CRD bridge process.

Every replica serves the `ksquad-bridge` task queue (resolve_references, mirror_status: both safe to run
anywhere); the replica holding the Lease also reconciles Runs and watches credentials. Health on
`KSQUAD_HEALTH_PORT` (8081): `/healthz` (alive), `/readyz` (serving the task queue).
"""

import asyncio
import logging
import signal
import sys
from typing import Any

from temporalio.worker import Worker

from crd_bridge.activities import BridgeActivities
from crd_bridge.credentials import CredentialWatcher
from crd_bridge.leader import LeaderElector, LostLeadership
from crd_bridge.runs import RunReconciler
from crd_bridge.settings import BridgeSettings
from kube import Config, Kube
from kube.probes import Probes
from workflows.activity_types import BRIDGE_TASK_QUEUE
from workflows.client import codec_from_env, connect

log = logging.getLogger("ksquad.bridge")


async def serve(settings: BridgeSettings) -> int:
    state = {"ready": False, "leader": False}

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    probes = Probes(settings.health_port, lambda: state["ready"], lambda: {"leader": state["leader"]})
    async with Kube(Config.load(settings.kubeconfig)) as kube, probes:
        temporal = await connect(settings.temporal_address, settings.temporal_namespace,
                                 api_key=settings.temporal_api_key, tls=settings.temporal_tls,
                                 codec=codec_from_env())  # fmt: skip
        bridge = BridgeActivities(kube, settings.identity, settings.namespace_max_concurrent_runs)
        worker = Worker(temporal, task_queue=BRIDGE_TASK_QUEUE, activities=bridge.all())
        code = 0
        async with worker:
            state["ready"] = True
            elector = LeaderElector(kube, settings.lease_namespace, settings.lease_name, settings.identity)
            stopping: asyncio.Task[Any] = asyncio.create_task(stop.wait())
            acquiring = asyncio.create_task(elector.acquire())
            await asyncio.wait([stopping, acquiring], return_when=asyncio.FIRST_COMPLETED)
            if acquiring.done():
                state["leader"] = True
                reconciler = RunReconciler(kube, temporal, settings, bridge)
                tasks: list[asyncio.Task[Any]] = [
                    asyncio.create_task(reconciler.run()),
                    asyncio.create_task(CredentialWatcher(kube, temporal, settings.watch_namespaces).run()),
                    asyncio.create_task(elector.keep()),
                ]
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
    return code


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "temporalio.activity"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sys.exit(asyncio.run(serve(BridgeSettings.from_env())))


if __name__ == "__main__":
    main()
