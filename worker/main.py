"""`ksquad-worker`: connect to Temporal, the coordination store and (for Kubernetes sandboxes) the cluster,
then serve the ksquad task queue until SIGTERM or Ctrl-C.

Settings come from the environment (the chart sets them):
  KSQUAD_TEMPORAL_ADDRESS      Temporal's frontend, host:port (default 127.0.0.1:7233)
  KSQUAD_TEMPORAL_NAMESPACE    Temporal namespace (default: default)
  KSQUAD_TEMPORAL_TLS          true to connect with TLS; KSQUAD_TEMPORAL_API_KEY (Temporal Cloud) implies it
  KSQUAD_TEMPORAL_TLS_CERT_FILE, _KEY_FILE, _CA_FILE, _SERVER_NAME
                               mutual TLS: the client certificate and key (a changed file stops the worker, to
                               be started again with it), the server's CA and name
  KSQUAD_CODEC_KEY_FILE        the payload codec's active key (32 bytes, raw, base64 or hex); unset: in clear
  KSQUAD_CODEC_KEYS            a directory of keys that decrypt too (the codec Secret, mounted)
  KSQUAD_SEAL_KEY_FILE         the key the bridge seals resolutions with (required: temporal_client.seal)
  KSQUAD_DATABASE_URL          the coordination store: postgresql://... (production) or sqlite:///FILE
  KSQUAD_SANDBOX_CONFIG        the sandbox settings (YAML; the chart's ConfigMap ksquad-sandbox)
  KSQUAD_SANDBOX_TOKEN_KEY_FILE  the key of the attempts' caller tokens (activities.agents.callers: the same on
                               every replica; the chart makes it); unset: a key of this process
  KSQUAD_ENDPOINT_TOKEN_KEY_FILE the key shared with Agent.spec.endpoint agents, to sign their callers' tokens
  KSQUAD_TASK_QUEUE            the task queue served (default ksquad)
  KSQUAD_HEALTH_PORT           /healthz, /readyz (the store and Temporal) and /metrics (default 8082)
  KSQUAD_MAX_CACHED_WORKFLOWS  workflows kept in memory between tasks
  KUBECONFIG                   the cluster (default: the pod's service account)
"""

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.exc import OperationalError

import tracing
from activities.agents import AgentActivities, CallerKeys
from activities.claims import ClaimActivities
from activities.entities import ResumePlaces
from activities.sandboxes import KubernetesSandboxes, LocalSandboxes, SandboxActivities, SandboxSettings
from kube import Config, Kube
from kube.probes import Probes, Readiness
from store import Store, StoreError
from temporal_client.connection import codec_from_env, stop_when_changed, temporal_answers
from temporal_client.seal import sealer_from_env
from temporal_client.telemetry import Telemetry
from worker.registry import build_worker
from worker.settings import Settings

log = logging.getLogger("ksquad.worker")


async def serve(settings: Settings, sandbox_settings: SandboxSettings) -> None:
    sealer = sealer_from_env("ksquad-worker")
    if settings.database_url.startswith("sqlite:///"):
        Path(settings.database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    store = await open_store(settings.database_url)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.close)
        backend: KubernetesSandboxes | LocalSandboxes
        keys = CallerKeys.from_env()  # the sandboxes get hashes of the tokens the agent activity sends
        if sandbox_settings.backend == "kubernetes":
            kube = await stack.enter_async_context(Kube(Config.load()))
            backend = KubernetesSandboxes(kube, sandbox_settings, keys=keys)
            stack.push_async_callback(backend.close)
        else:
            backend = LocalSandboxes(sandbox_settings, keys=keys)
        telemetry = Telemetry()
        stack.push_async_callback(telemetry.aclose)
        client = await settings.temporal.connect(codec_from_env(), telemetry.runtime)
        agents = AgentActivities(store, keys=keys)
        stack.push_async_callback(agents.aclose)
        activities: list[Callable[..., Any]] = [
            *ClaimActivities(store).all(),
            agents.invoke_agent,
            *SandboxActivities(backend).all(),
            ResumePlaces(store).reserve_resume_place,
        ]
        worker = build_worker(
            client,
            settings.task_queue,
            activities,
            max_cached_workflows=settings.max_cached_workflows,
            store=store,
            sealer=sealer,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        log.info(
            "serving task queue %s on %s (namespace %s), store %s, %s sandboxes",
            settings.task_queue,
            settings.temporal.address,
            settings.temporal.namespace,
            store.engine.url.render_as_string(),
            sandbox_settings.backend,
        )
        readiness = Readiness({"store": store.ping, "temporal": lambda: temporal_answers(client)})
        checking = asyncio.create_task(readiness.watch())
        rotation = asyncio.create_task(
            stop_when_changed(settings.temporal.tls_files(), stop, "ksquad-worker")
        )
        probes = Probes(
            settings.health_port, lambda: readiness.ready, readiness.details, telemetry.exposition
        )
        async with probes, worker:  # probes first: a taken health port fails before any task is polled
            await stop.wait()
        checking.cancel()
        rotation.cancel()
    log.info("stopped")


async def open_store(url: str, attempts: int = 30) -> Store:
    """The store, migrated to the newest schema; a database that does not answer yet (PostgreSQL starting, or a
    SQLite file another process is writing) is tried again with backoff before the worker gives up."""
    delay = 0.5
    for attempt in range(1, attempts + 1):
        try:
            return await Store.open(url)
        except (OperationalError, StoreError) as err:
            if attempt == attempts:
                raise
            log.warning("the store does not answer (%s); again in %.1fs", str(err).splitlines()[0], delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="ksquad-worker", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    tracing.configure_or_exit("ksquad-worker")
    # What the imports built lives as long as the process: no garbage collection walks it again, nor does the
    # interpreter's exit (the worker's imports and exit: about a fifth less CPU).
    gc.freeze()
    asyncio.run(serve(Settings.from_env(), SandboxSettings.from_env()))


if __name__ == "__main__":
    main()
