"""`ksquad-bridge`: the CRD bridge process.

Every replica serves the `ksquad-bridge` task queue (resolve_references, mirror_status: both safe to run
anywhere); the replica holding the Lease also reconciles Runs and watches credentials. Health on
`KSQUAD_HEALTH_PORT` (8081): `/healthz` (alive), `/readyz` (serving the task queue, and the API server, Temporal
and the store answer), `/metrics` (crd_bridge.metrics, with the Temporal SDK's).

Settings come from the environment (the chart sets them):
  KSQUAD_TEMPORAL_ADDRESS      Temporal's frontend, host:port (default 127.0.0.1:7233)
  KSQUAD_TEMPORAL_NAMESPACE    Temporal namespace (default: default)
  KSQUAD_TEMPORAL_TLS          true to connect with TLS; KSQUAD_TEMPORAL_API_KEY (Temporal Cloud) implies it
  KSQUAD_TEMPORAL_TLS_CERT_FILE, _KEY_FILE, _CA_FILE, _SERVER_NAME
                               mutual TLS (a changed certificate stops the bridge, to be started again with it)
  KSQUAD_CODEC_KEY_FILE        the payload codec's active key (32 bytes, raw, base64 or hex); unset: in clear
  KSQUAD_CODEC_KEYS            a directory of keys that decrypt too (the codec Secret, mounted)
  KSQUAD_SEAL_KEY_FILE         the key resolutions are sealed with for the worker (required: temporal_client.seal)
  KSQUAD_DATABASE_URL          the store where phase changes are logged for the cluster API's event streams
                               (the worker's); unset: Run status and Events only
  KSQUAD_WATCH_NAMESPACES      the Run namespaces, comma-separated
  KSQUAD_LEASE_NAMESPACE       where the leader's Lease is (KSQUAD_LEASE_NAME, default ksquad-bridge)
  KSQUAD_TASK_QUEUE            where Run workflows are started (default ksquad)
  KSQUAD_NAMESPACE_MAX_CONCURRENT_RUNS   a limit of running Runs per namespace (default none)
  KSQUAD_ALLOWED_IMAGES, KSQUAD_ALLOWED_RUNTIME_CLASSES, KSQUAD_ALLOWED_AGENT_ENDPOINTS
                               what Agents' images, Runs' runtime classes and Agents' endpoints (hosts, host:port,
                               CIDRs) may be, comma-separated; unset: anything
  KSQUAD_ALLOWED_SERVICE_ACCOUNTS, KSQUAD_ALLOWED_PRIORITY_CLASSES, KSQUAD_ALLOWED_TOLERATIONS
                               what a placement's serviceAccountName, priorityClassName and tolerations' taint
                               keys may be, comma-separated; unset: anything
  KSQUAD_HEALTH_PORT           /healthz, /readyz and /metrics (default 8081)
  POD_NAME                     this replica's identity in the Lease
  KUBECONFIG                   the cluster (default: the pod's service account)
"""

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from typing import Any

from temporalio.worker import Worker

import tracing
from crd_bridge.activities import BridgeActivities
from crd_bridge.credentials import CredentialWatcher
from crd_bridge.leader import LeaderElector, LostLeadership
from crd_bridge.runs import RunReconciler
from crd_bridge.settings import BridgeSettings
from crd_bridge.status import RunStatusWriter
from kube import Config, Kube
from kube.probes import Probes, Readiness
from store import Store
from temporal_client.chains import Chains
from temporal_client.connection import codec_from_env, stop_when_changed, temporal_answers, with_signing
from temporal_client.proofs import Signing
from temporal_client.seal import sealer_from_env
from temporal_client.telemetry import Telemetry
from workflows.activity_types import BRIDGE_TASK_QUEUE
from workflows.inbox import Sender

log = logging.getLogger("ksquad.bridge")
SHUTDOWN_SECONDS = 10.0


async def serve(settings: BridgeSettings) -> int:
    state = {"serving": False, "leader": False}
    sealer = sealer_from_env("ksquad-bridge")

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async with contextlib.AsyncExitStack() as resources:
        kube = await resources.enter_async_context(Kube(Config.load(settings.kubeconfig)))
        store = await Store.open(settings.database_url) if settings.database_url else None
        if store is not None:
            resources.push_async_callback(store.close)
        telemetry = Telemetry()
        resources.push_async_callback(telemetry.aclose)
        # The signals it sends (users' pauses and answers, credential rotations) carry its proof.
        temporal = with_signing(
            await settings.temporal.connect(codec_from_env(), telemetry.runtime),
            sealer,
            Signing(Sender.BRIDGE),
        )
        rotation = asyncio.create_task(
            stop_when_changed(settings.temporal.tls_files(), stop, "ksquad-bridge")
        )
        resources.push_async_callback(_cancel, rotation)

        async def api_server_answers() -> bool:
            await kube.get("/version")
            return True

        checks = {"kubernetes": api_server_answers, "temporal": lambda: temporal_answers(temporal)}
        if store is not None:
            checks["store"] = store.ping
        readiness = Readiness(checks)
        await readiness.check()
        resources.push_async_callback(_cancel, asyncio.create_task(readiness.watch()))
        probes = Probes(
            settings.health_port,
            lambda: state["serving"] and readiness.ready,
            lambda: {**readiness.details(), "leader": state["leader"]},
            telemetry.exposition,
        )
        await resources.enter_async_context(probes)
        status = RunStatusWriter(kube, settings.identity, store)
        bridge = BridgeActivities(
            kube, status, settings.namespace_max_concurrent_runs, settings.allow, sealer, Chains(temporal)
        )
        worker = Worker(temporal, task_queue=BRIDGE_TASK_QUEUE, activities=bridge.all())
        code = 0
        serving = asyncio.create_task(worker.run())
        try:
            state["serving"] = True
            elector = LeaderElector(kube, settings.lease_namespace, settings.lease_name, settings.identity)
            stopping: asyncio.Task[Any] = asyncio.create_task(stop.wait())
            acquiring = asyncio.create_task(elector.acquire())
            await asyncio.wait([stopping, acquiring], return_when=asyncio.FIRST_COMPLETED)
            if acquiring.done():
                state["leader"] = status.watching = True
                reconciler = RunReconciler(kube, temporal, settings, status, sealer)
                tasks: list[asyncio.Task[Any]] = [
                    asyncio.create_task(reconciler.run()),
                    asyncio.create_task(CredentialWatcher(kube, temporal, settings.watch_namespaces).run()),
                    asyncio.create_task(elector.keep()),
                ]
                done, _ = await asyncio.wait([stopping, *tasks], return_when=asyncio.FIRST_COMPLETED)
                for task in tasks:
                    task.cancel()
                await asyncio.wait(
                    tasks, timeout=SHUTDOWN_SECONDS
                )  # each has stopped acting, or ended itself
                state["leader"] = status.watching = False
                for task in done:
                    if task is not stopping and task.exception() is not None:
                        error = task.exception()
                        log.error("stopping: %s", error)
                        code = 1 if isinstance(error, LostLeadership) else 2
                if code != 1:  # stopped acting: the standby may act now (a lost Lease is not ours to give)
                    await elector.release()
            else:
                acquiring.cancel()
        finally:
            state["serving"] = False
            await _stop_worker(worker, serving, code)
    return code


async def _cancel(task: "asyncio.Task[None]") -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _stop_worker(worker: Worker, serving: "asyncio.Task[None]", code: int) -> None:
    """Stop serving activities, bounded: a bridge that lost its lease must stop acting now, and an activity
    stuck on an unreachable API server must not keep the process (and its stale leadership) alive. Past the
    bound the process exits at once; its Deployment starts a fresh one."""
    try:
        await asyncio.wait_for(worker.shutdown(), SHUTDOWN_SECONDS)
        await asyncio.wait_for(serving, SHUTDOWN_SECONDS)
    except TimeoutError:
        log.error("the bridge's Temporal worker did not stop within %.0fs: exiting now", SHUTDOWN_SECONDS)
        logging.shutdown()
        os._exit(code or 2)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="ksquad-bridge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "temporalio.activity"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    tracing.configure_or_exit("ksquad-bridge")
    # What the imports built lives as long as the process: no garbage collection walks it again, nor does the
    # interpreter's exit (the worker's imports and exit: about a fifth less CPU).
    gc.freeze()
    sys.exit(asyncio.run(serve(BridgeSettings.from_env())))


if __name__ == "__main__":
    main()
