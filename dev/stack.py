"""`ksquad dev`: the embedded default, everything on one machine and no cluster.

One process supervises:
- Temporal's dev server (state in `.ksquad/temporal.db`, the UI on :8233 with the codec endpoint set);
- the worker on task queue `ksquad` with local sandboxes (the reference agent as a local process per
  attempt) and SQLite as the coordination store (`.ksquad/ksquad.db`);
- the embedded bridge on `ksquad-bridge` (dev.embedded), and the API the CLI talks to (dev.api);
- the model: `OPENAI_BASE_URL` (with `OPENAI_API_KEY`, `OPENAI_MODEL`) when set, else the scripted model.

Payloads are encrypted with the key in `.ksquad/codec.key` (made on first start). Local agents answer only the
worker, which holds `.ksquad/sandbox-token.key` (activities.agents.callers): another local user reaching their
loopback address is refused. An agent you run yourself as an Agent's `endpoint` checks the tokens the worker signs
with `.ksquad/endpoint-token.key` (KSQUAD_ENDPOINT_TOKEN_KEY_FILE). Where everything listens
is written to `.ksquad/dev.json`, which the CLI reads. Ctrl-C (or SIGTERM) stops it cleanly; the next start
picks up every unfinished run where it was, and local agents still working are found again.
"""

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from temporalio.client import Client
from temporalio.worker import Worker

import tracing
from activities.agents import AgentActivities, CallerKeys
from activities.agents.callers import ItemApi
from activities.claims import ClaimActivities
from activities.entities import ResumePlaces
from activities.sandboxes import LocalModel, LocalSandboxes, SandboxActivities, SandboxSettings
from agent.scripted_model import ScriptedModel, build_app
from dev.api import UI_PREFIX, api_app, loopback_names
from dev.devserver import DevServer, ExternalTemporal, preferred_port
from dev.embedded import LOCAL_CREDENTIAL_SECRET, EmbeddedBridge, EmbeddedRuns
from store import Store
from store.objects import ObjectStore
from temporal_client.chains import Chains
from temporal_client.codec import EncryptionCodec, ensure_key_file
from temporal_client.connection import connect, with_signing
from temporal_client.proofs import Signing
from temporal_client.seal import Sealer
from worker.registry import build_worker
from workflows.activity_types import BRIDGE_TASK_QUEUE, WORKER_TASK_QUEUE
from workflows.contract import CredentialRef
from workflows.inbox import Sender

log = logging.getLogger("ksquad.dev")

TEMPORAL_PORT, UI_PORT, API_PORT, MODEL_PORT = 7233, 8233, 8234, 8400
TOKEN_FILE = "api.token"  # the API's and the codec endpoint's bearer token (0600), read by the CLI
SANDBOX_KEY_FILE = "sandbox-token.key"  # the worker's key for its local agents' caller tokens (0600)
ENDPOINT_KEY_FILE = "endpoint-token.key"  # shared with Agent.spec.endpoint agents run on this machine (0600)
ITEM_KEY_FILE = "item-token.key"  # the worker's and the API's: attempts' tokens for their work item (0600)
SCRIPTED_MODEL = "scripted"
# What the scripted model answers, by model name (agent/scripted_model.py has the step format); the demo's
# runs name the last two.
MODEL_SCRIPT: dict[str, Any] = {
    "models": {
        SCRIPTED_MODEL: [
            {
                "delay": 1.0,
                "text": "Fixed: the payment-retry test waited on the wall clock; it now "
                "advances a fake clock, and passed 500 runs in a row.",
            }
        ],
        "demo-rate-limited": [
            {"error": 429, "retry_after": "4"},
            {
                "delay": 0.5,
                "text": "Incident summary: the gateway's connection pool was exhausted "
                "for 12 minutes; retries doubled the load.",
            },
        ],
        "demo-slow": [{"delay": 600, "text": "The ledger migration is done."}],
    }
}


@dataclass
class DevOptions:
    state_dir: Path = Path(".ksquad")
    temporal_port: int = TEMPORAL_PORT
    ui_port: int = UI_PORT
    api_port: int = API_PORT
    model_port: int = MODEL_PORT
    model_script: dict[str, Any] | None = None  # for the scripted model (default MODEL_SCRIPT)
    scripted_model: bool = False  # the scripted model even when OPENAI_BASE_URL is set (the demo)
    serve_worker: bool = True  # False: workers are separate `ksquad-worker` processes (bench.throughput)
    temporal_address: str | None = None  # a Temporal that runs already, instead of the dev server


@dataclass
class DevStack:
    """A running embedded stack: what `ksquad dev` serves, and what `--demo` drives."""

    state_dir: Path
    server: DevServer
    client: Client
    store: Store
    runs: EmbeddedRuns
    api_url: str
    model_url: str
    scripted: ScriptedModel | None

    @property
    def ui_url(self) -> str:
        """The Temporal UI, served through the API (the dev server's; an external Temporal's UI is its operator's
        to name)."""
        return f"{self.api_url}{UI_PREFIX}/" if self.server.ui_url else "(none: Temporal runs elsewhere)"

    @property
    def ui_signin_url(self) -> str | None:
        """The link that signs the developer's browser in to the UI (and its codec): it holds the API's token."""
        if not self.server.ui_url:
            return None
        token = (self.state_dir / TOKEN_FILE).read_text().strip()
        return f"{self.api_url}{UI_PREFIX}/signin?token={token}"

    @property
    def console_signin_url(self) -> str:
        """The link that signs the developer's browser in to the console: it holds the API's token."""
        token = (self.state_dir / TOKEN_FILE).read_text().strip()
        return f"{self.api_url}/console/signin?token={token}"

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "api": self.api_url,
            "ui": self.ui_url,
            "temporal": self.server.target,
            "model": self.model_url,
            "uiSignIn": self.ui_signin_url,
            "console": f"{self.api_url}/console/",
            "consoleSignIn": self.console_signin_url,
            "temporalUi": self.server.ui_url,  # the dev server's own UI (it decodes nothing: no session there)
            "codecEndpoint": f"{self.api_url}/codec",
            "codecKeyFile": str(self.state_dir / "codec.key"),
            "tokenFile": str(self.state_dir / TOKEN_FILE),
        }


def private_state(state: Path) -> None:
    """The state directory and everything in it readable by this user only: the store holds inputs and outputs in
    clear, the logs what agents said. Files made from now on (by this process and what it starts) are too."""
    os.umask(0o077)
    state.mkdir(parents=True, exist_ok=True)
    for path in (state, *state.rglob("*")):
        with contextlib.suppress(OSError):
            path.chmod(0o700 if path.is_dir() else 0o600)


def ensure_token_file(path: Path) -> str:
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


STREAMS_CUT_AFTER_SECONDS = 1


@contextlib.asynccontextmanager
async def http_server(app: Any, port: int) -> AsyncIterator[None]:
    server = uvicorn.Server(
        uvicorn.Config(
            tracing.TracedHttp(app),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="off",
            # An open event stream (`ksquad runs watch`, the console) would hold Ctrl-C back until it ends, while
            # the worker goes on: streams are cut after this long, and their clients resume with Last-Event-ID.
            timeout_graceful_shutdown=STREAMS_CUT_AFTER_SECONDS,
        )
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it could not start
            raise RuntimeError(f"the HTTP server on 127.0.0.1:{port} stopped at start")
        await asyncio.sleep(0.02)
    try:
        yield
    finally:
        # uvicorn raises a signal that stopped it again when it is done, and no atexit handler runs after that.
        await asyncio.to_thread(tracing.flush)
        server.should_exit = True
        await task


@contextlib.asynccontextmanager
async def dev_stack(options: DevOptions) -> AsyncIterator[DevStack]:
    tracing.configure_or_exit("ksquad-dev")  # the OTEL_* variables; its local sandboxes' agents inherit them
    state = options.state_dir
    private_state(state)
    codec = EncryptionCodec(ensure_key_file(state / "codec.key"))
    sealer = Sealer.for_embedded(state / "seal.key")  # the bridge's resolutions, as the worker checks them
    token = ensure_token_file(state / TOKEN_FILE)
    api_port = preferred_port(options.api_port)
    api_url = f"http://127.0.0.1:{api_port}"
    # Held bound until the API serves on it: Temporal's dev server, started meanwhile, takes random free ports
    # of its own (HTTP, metrics, its services) and once took this one ("address already in use").
    api_reservation = socket.socket()
    api_reservation.setsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
    )  # as the API's own listener binds it
    api_reservation.bind(("127.0.0.1", api_port))
    server = (
        ExternalTemporal(address=options.temporal_address)
        if options.temporal_address
        else DevServer(
            db_file=state / "temporal.db",
            log_file=state / "temporal.log",
            port=preferred_port(options.temporal_port),
            ui_port=preferred_port(options.ui_port),
            # The UI is served through the API (dev.api): one origin with the codec endpoint and its session.
            extra_args=["--ui-public-path", UI_PREFIX, "--ui-codec-endpoint", f"{api_url}/codec"],
        )
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(api_reservation.close)
        await stack.enter_async_context(server)
        # The embedded stack plays the bridge: the signals it sends (users' pauses and answers) carry its proof.
        client = with_signing(await connect(server.target, codec=codec), sealer, Signing(Sender.BRIDGE))
        store = await Store.open(f"sqlite:///{state / 'ksquad.db'}")
        stack.push_async_callback(store.close)

        scripted: ScriptedModel | None = None
        if os.environ.get("OPENAI_BASE_URL") and not options.scripted_model:
            model_url, api_key = os.environ["OPENAI_BASE_URL"], os.environ.get("OPENAI_API_KEY", "")
            model_name = os.environ.get("OPENAI_MODEL")
        else:
            scripted = ScriptedModel()
            scripted.load(options.model_script or MODEL_SCRIPT)
            model_port = preferred_port(options.model_port)
            await stack.enter_async_context(http_server(build_app(scripted), model_port))
            model_url, api_key, model_name = f"http://127.0.0.1:{model_port}/v1", "ksquad-dev", SCRIPTED_MODEL
        local_model = LocalModel(
            model_url, CredentialRef(secret_name=LOCAL_CREDENTIAL_SECRET, key="apiKey"), api_key
        )
        # Kept across restarts: a restarted stack still reaches the local agents of attempts in flight.
        item_key = ensure_key_file(state / ITEM_KEY_FILE)
        keys = CallerKeys(
            ensure_key_file(state / SANDBOX_KEY_FILE),
            ensure_key_file(state / ENDPOINT_KEY_FILE),
            ItemApi(api_url, item_key),  # local agents reach their work item through this stack's API
        )
        sandboxes = LocalSandboxes(
            SandboxSettings(backend="local"), local_model, log_dir=state / "sandboxes", keys=keys
        )
        agents = AgentActivities(store, keys=keys)
        stack.push_async_callback(agents.aclose)
        objects = ObjectStore(store)
        bridge = EmbeddedBridge(objects, model_url, model_name, sealer, Chains(client))
        worker = build_worker(
            client,
            WORKER_TASK_QUEUE,
            [
                *ClaimActivities(store).all(),
                agents.invoke_agent,
                *SandboxActivities(sandboxes).all(),
                ResumePlaces(store).reserve_resume_place,
            ],
            store=store,
            sealer=sealer,
        )
        if options.serve_worker:
            await stack.enter_async_context(worker)
        await stack.enter_async_context(Worker(client, task_queue=BRIDGE_TASK_QUEUE, activities=bridge.all()))
        runs = EmbeddedRuns(objects, client, WORKER_TASK_QUEUE, sealer)
        app = api_app(
            runs, store, token, loopback_names(api_port), codec, server.ui_url, item_key, server.namespace
        )
        api_reservation.close()
        await stack.enter_async_context(http_server(app, api_port))
        dev = DevStack(state, server, client, store, runs, api_url, model_url, scripted)
        info_file = state / "dev.json"
        # Whole or not at all: the CLI (and a watcher) may read it the moment it exists.
        written = info_file.with_suffix(".json.tmp")
        written.write_text(json.dumps(dev.info(), indent=2) + "\n")
        written.replace(info_file)
        stack.callback(info_file.unlink, missing_ok=True)
        yield dev


async def serve(options: DevOptions) -> int:
    t0 = time.monotonic()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with dev_stack(options) as dev:
        resumed = await dev.runs.resume_unfinished()
        print(f"ksquad dev is up in {time.monotonic() - t0:.1f}s (state in {dev.state_dir}/)")
        for label, value in (
            ("console", dev.console_signin_url),
            ("Temporal UI", dev.ui_signin_url or dev.ui_url),
            ("Temporal", dev.server.target),
            ("API", dev.api_url),
            ("model", dev.model_url + ("" if dev.scripted is None else " (scripted)")),
        ):
            print(f"  {label + ':':<13}{value}")
        if resumed:
            print(f"  {resumed} unfinished run(s) picked up where they were")
        print("Apply runs with `ksquad run -f examples/fix-flaky-tests.yaml`; Ctrl-C stops.", flush=True)
        await stop.wait()
        print("stopping (unfinished runs go on at the next start)", flush=True)
    return 0
