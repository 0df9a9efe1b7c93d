"""The embedded stack as the benchmarks and the fault tests use it: `ksquad dev`'s stack in this process (its own
state directory and free ports), an instant agent (the reference agent as one long-lived process, named by an
Agent's `endpoint`, so no sandbox boots per run) and the scripted model answering at once."""

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Literal

import httpx

from activities.agents.callers import ITEM_API_ENV
from agent.callers import ENDPOINT_KEY_ENV, ITEM_KEY_ENV, SANDBOX_KEY_ENV
from dev.binaries import dying_with_parent
from dev.embedded import LOCAL_CREDENTIAL_SECRET
from dev.stack import ENDPOINT_KEY_FILE, ITEM_KEY_FILE, SANDBOX_KEY_FILE, DevOptions, DevStack, dev_stack
from testbed.isolate import free_port
from testbed.postgres import PostgresServer
from testbed.temporal_server import temporal_server
from workflows.status import Phase

NAMESPACE = "bench"
AGENT = "instant"
MODEL = "instant"


def stack_options(
    state_dir: Path, script: dict[str, list[dict[str, Any]]] | None = None, serve_worker: bool = True
) -> DevOptions:
    """`ksquad dev`'s stack on free ports, in `state_dir`, with the scripted model answering `script`."""
    return DevOptions(
        state_dir=state_dir,
        temporal_port=0,
        ui_port=0,
        api_port=0,
        model_port=0,
        model_script={"models": script} if script is not None else None,
        scripted_model=True,
        serve_worker=serve_worker,
    )


TemporalKind = Literal["dev", "production"]


@contextlib.asynccontextmanager
async def temporal_of_kind(kind: TemporalKind, root: Path) -> AsyncIterator[str | None]:
    """Where the stack finds Temporal: None for the embedded dev server (the stack starts it), or the address of
    Temporal's production server on a PostgreSQL of its own (testbed.temporal_server), as the benchmarks compare."""
    if kind == "dev":
        yield None
        return
    postgres = PostgresServer()
    postgres.start()
    try:
        async with temporal_server(postgres, root / "temporal-server") as server:
            yield server.target
    finally:
        postgres.stop()


@contextlib.asynccontextmanager
async def bench_stack(
    state_dir: Path,
    script: dict[str, list[dict[str, Any]]] | None = None,
    serve_worker: bool = True,
    temporal: TemporalKind = "dev",
) -> AsyncIterator[tuple[DevStack, subprocess.Popen[bytes]]]:
    """The embedded stack with the instant agent, on the dev server or on Temporal's production server."""
    async with temporal_of_kind(temporal, state_dir) as address:
        options = dataclasses.replace(
            stack_options(state_dir, script or {MODEL: [{"text": "ok"}]}, serve_worker),
            temporal_address=address,
        )
        async with _with_agent(options) as pair:
            yield pair


@contextlib.asynccontextmanager
async def _with_agent(options: DevOptions) -> AsyncIterator[tuple[DevStack, subprocess.Popen[bytes]]]:
    async with dev_stack(options) as dev:
        agent = await start_agent(dev)
        try:
            yield dev, agent
        finally:
            agent.terminate()
            agent.wait(10)


async def start_agent(dev: DevStack) -> subprocess.Popen[bytes]:
    """The instant agent: a shared endpoint (agent.callers), answering the stack's workers by the endpoint key of
    its state folder, with the local model's key mounted for the namespace its runs come from."""
    port = free_port()
    secrets = dev.state_dir / "agent-secrets"
    (secrets / NAMESPACE / LOCAL_CREDENTIAL_SECRET).mkdir(parents=True, exist_ok=True)
    (secrets / NAMESPACE / LOCAL_CREDENTIAL_SECRET / "apiKey").write_text("ksquad-dev")
    env = {
        **os.environ,
        ENDPOINT_KEY_ENV: str(dev.state_dir / ENDPOINT_KEY_FILE),
        "KSQUAD_SECRETS_DIR": str(secrets),
    }
    agent = subprocess.Popen(
        dying_with_parent([sys.executable, "-m", "agent.server", "--host", "127.0.0.1", "--port", str(port)]),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    async with httpx.AsyncClient() as http:
        for _ in range(200):
            with contextlib.suppress(httpx.TransportError):
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200:
                    break
            await asyncio.sleep(0.05)
    await dev.runs.apply(
        [
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Agent",
                "metadata": {"name": AGENT, "namespace": NAMESPACE},
                "spec": {
                    "modelEndpointRef": "local",
                    "model": MODEL,
                    "endpoint": f"http://127.0.0.1:{port}/",
                },
            }
        ]
    )
    return agent


def run_docs(prefix: str, count: int, start: int = 0) -> list[dict[str, Any]]:
    return [
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": f"{prefix}-{i:05d}", "namespace": NAMESPACE},
            "spec": {"agents": [AGENT]},
        }
        for i in range(start, start + count)
    ]


async def wait_terminal(dev: DevStack, names: list[str], within: float) -> dict[str, str]:
    """Phase of each run once every one is terminal (or `within` seconds passed)."""
    deadline = time.monotonic() + within
    wanted = set(names)
    while True:
        phases = {
            r.name: (r.status or {}).get("phase", "")
            for r in await dev.runs.objects.of_kind("Run", NAMESPACE)
            if r.name in wanted
        }
        if (
            all(Phase(p).terminal for p in phases.values() if p)
            and len(phases) == len(wanted)
            and all(phases.values())
        ):
            return phases
        if time.monotonic() > deadline:
            return phases
        await asyncio.sleep(0.2)


async def start_workers(
    dev: DevStack, count: int, database_url: str | None = None, ready_within: float = 90
) -> list[subprocess.Popen[bytes]]:
    """`ksquad-worker` processes on the stack's Temporal, codec key and SQLite (or `database_url`): the stack
    itself serves no worker. Returns once each says it is ready (its store and Temporal answer); a worker that
    exits or never gets ready fails the caller with its log (`worker-<n>.log` in the stack's state folder).
    A worker whose health port was taken between `free_port()` and its bind (another process of the machine
    listening on a port the kernel chose) is started again on another port, twice at most."""
    started = [_spawn_worker(dev, database_url) for _ in range(count)]
    workers = []
    async with httpx.AsyncClient() as http:
        for worker, port, log in started:
            deadline = time.monotonic() + ready_within
            respawns = 0
            while True:
                if worker.poll() is not None:
                    output = log.read_text()
                    if "address already in use" in output.lower() and respawns < 2:
                        respawns += 1
                        worker, port, log = _spawn_worker(dev, database_url)
                        continue
                    raise RuntimeError(f"ksquad-worker exited ({worker.returncode}): {output[-3000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"http://127.0.0.1:{port}/readyz", timeout=2)).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"ksquad-worker not ready in {ready_within}s: {log.read_text()[-3000:]}"
                    )
                await asyncio.sleep(0.2)
            workers.append(worker)
    return workers


def _spawn_worker(dev: DevStack, database_url: str | None) -> tuple[subprocess.Popen[bytes], int, Path]:
    port = free_port()
    log = dev.state_dir / f"worker-{len(list(dev.state_dir.glob('worker-*.log')))}.log"
    env = {
        **os.environ,
        "KSQUAD_TEMPORAL_ADDRESS": dev.server.target,
        "KSQUAD_DATABASE_URL": database_url or f"sqlite:///{dev.state_dir / 'ksquad.db'}",
        "KSQUAD_SANDBOX_BACKEND": "local",
        "KSQUAD_CODEC_KEY_FILE": str(dev.state_dir / "codec.key"),
        "KSQUAD_SEAL_KEY_FILE": str(dev.state_dir / "seal.key"),  # the embedded bridge seals with it
        SANDBOX_KEY_ENV: str(dev.state_dir / SANDBOX_KEY_FILE),
        ENDPOINT_KEY_ENV: str(dev.state_dir / ENDPOINT_KEY_FILE),
        "KSQUAD_HEALTH_PORT": str(port),
    }
    if database_url is None:
        # On the stack's own store, attempts reach their work item and checkpoints through the stack's API, as the
        # stack's own worker gives them (a worker on another database's claims has no API that knows them).
        env.update({ITEM_KEY_ENV: str(dev.state_dir / ITEM_KEY_FILE), ITEM_API_ENV: dev.api_url})
    with log.open("ab") as out:
        worker = subprocess.Popen(
            dying_with_parent([sys.executable, "-m", "worker.main"]),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=dev.state_dir,  # its local sandboxes' logs and pid files go in .ksquad/ there, not the checkout's
        )
    return worker, port, log


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def until(
    check: Callable[[], Awaitable[bool]], what: str, within: float = 3600, every: float = 0.2
) -> None:
    deadline = time.monotonic() + within
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {within:.0f}s for {what}")
        await asyncio.sleep(every)
