"""`ksquad-api`: the cluster's twin of the embedded stack's API, a Deployment of the `ksquad` image.

    POST /codec/encode, /codec/decode     Temporal's remote codec protocol, for the Temporal UI and the temporal CLI
    GET|POST /codec/login                 a form that keeps the shared codec token in a cookie, for a UI that
                                          decodes with `includeCredentials` and has no login of its own
    GET  /runs/{namespace}/{name}/events  server-sent events: the run's phases and agent progress, numbered;
                                          `Last-Event-ID` (or ?after=N) resumes after that event
    GET  /runs/{namespace}/{name}/artifacts/{artifact}   an artifact's content, as the agent made it
    *    /items/{namespace}[/{id}[/events|/comments|/state]]   work items and their entries (api/items.py)
    *    /attempts/checkpoints                an attempt's recorded steps, with its token (api/attempts.py)
    *    /memory/{namespace}/{teams|projects}/{name}[/export|/{id}]   a Team's or a Project's memory (api/memory.py)
    GET  /usage?by=credential|namespace|person|model[&namespace=NS][&since=T][&until=T]   model usage (api/usage.py)
    *    /console/...                         the console for people (api/console/app.py), as each person
    GET|POST /console/signin                  a token sign-in, for a console with no authenticating proxy in front

Who may call what:
- the codec: the shared codec token (`Authorization: Bearer <token>`, or the cookie set by /codec/login), or a
  bearer token the Kubernetes API server accepts (what the Temporal UI passes with `passAccessToken` when it logs
  users in with the same OIDC provider as the cluster) whose user may `get` `runs/codec` in group ksquad.io
  cluster-wide (the chart's ClusterRole `ksquad-codec-decoder`); payloads do not say which Run they belong to;
- a run's events and artifacts: a bearer token the API server accepts, whose user may `get` that Run (a
  SubjectAccessReview): who cannot read a Run cannot read its prompts or answers either;
- work items: a bearer token the API server accepts, whose user may list, create, get or update `workitems` in
  group ksquad.io in the item's namespace (the chart's aggregated roles grant them beside Runs); a person writes
  as that user;
- squad memory: a bearer token the API server accepts, whose user may `get` (read, export) or `update` (add, edit,
  delete) `teams/memory` or `projects/memory` in group ksquad.io for that Team or Project in its namespace (the
  chart's aggregated roles: view reads, edit writes); an attempt's token reads and adds to its Run's own;
- usage: a bearer token the API server accepts, whose user may `list` Runs in the namespace asked (cluster-wide
  when none is);
- the console: the person's own token, from an authenticating proxy (`Authorization: Bearer`) or the token
  sign-in's sealed cookie; the API server answers its Run reads and writes as that person (api/console/cluster.py).
Answers: 401 without credentials (or with ones the API server refuses), 403 when RBAC says no, 404 for a Run
that does not exist, 429 with Retry-After past a budget (api/budgets.py: requests a second, streams, console
requests in flight, refused tokens), 503 when the store or the API server does not answer. Health and metrics are on their own
port (`KSQUAD_HEALTH_PORT`): /healthz, /readyz (the store and the API server), /metrics.

Settings, from the environment (the chart sets them):
  KSQUAD_DATABASE_URL          the worker's store (run events and artifacts)
  KSQUAD_CODEC_KEY_FILE        the codec's active key; KSQUAD_CODEC_KEYS a directory of keys that decrypt too (none:
                               payloads are in clear, and /codec/ answers 404 saying so)
  KSQUAD_CODEC_TOKEN_FILE      the shared codec token (a mounted Secret; read again when it changes)
  KSQUAD_API_UI_ORIGINS        the Temporal UI's origins, comma-separated (CORS for the codec)
  KSQUAD_API_LISTEN_PORT       the API's port (default 8080); KSQUAD_HEALTH_PORT probes and metrics (8081)
  KSQUAD_API_TLS_CERT_FILE, KSQUAD_API_TLS_KEY_FILE   serve HTTPS (the UI sends its access token only to https)
  KSQUAD_API_ITEMS_TLS_CERT_FILE, KSQUAD_API_ITEMS_TLS_KEY_FILE   also serve /items/, /attempts/, /memory/ alone over HTTPS on
                               KSQUAD_API_ITEMS_PORT (default 8443), for sandboxes: their item tokens never
                               cross the network in clear (the chart makes this certificate and gives the worker
                               its CA, which it hands each attempt beside its token)
  KSQUAD_ITEM_TOKEN_KEY_FILE   the key the worker signs attempts' work item tokens with (none: agents get 401)
  KSQUAD_CONSOLE_KEY_FILE      the console's key: its forms' CSRF tokens and the token sign-in's cookie (the same
                               on every replica; the chart makes it). Unset: the console answers 503
  KSQUAD_NAMESPACES            the Run namespaces ksquad serves, comma-separated (the console offers them)
  KSQUAD_TEMPORAL_UI_URL       the Temporal UI's address, for the console's links to a run's workflow
  KSQUAD_TEMPORAL_NAMESPACE    the Temporal namespace of the workflows (default: default)
  KSQUAD_API_STREAMS           event streams open at once: per person,per namespace,total (default 32,256,1024)
  KSQUAD_API_CONSOLE_REQUESTS  console requests in flight: per person,per namespace,total (default 8,64,128)
  KSQUAD_API_REFUSED_TOKENS    refused tokens reviewed: per client a second,burst,total a second (default 2,20,20)
  KSQUAD_API_REQUESTS          requests a second: per person,per namespace,total (default 20,100,400; bursts of 3 s)
  KUBECONFIG                   the cluster (default: the pod's service account)
"""

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount, Route

import tracing
from api.attempts import PREFIX as ATTEMPTS_PREFIX
from api.attempts import attempt_routes
from api.cluster_callers import Callers, counted
from api.cluster_codec import codec_routes
from api.cluster_console import console_app
from api.cluster_runs import run_routes
from api.cluster_settings import ApiSettings
from api.errors import ROUTING_ERRORS, error
from api.items import item_routes, with_item_tokens
from api.kubernetes_auth import KubernetesAuth
from api.memory import PREFIX as MEMORY_PREFIX
from api.memory import memory_routes, with_attempt_tokens
from api.streams import stream_budget
from api.usage import usage_routes
from kube import Config, Kube
from kube.probes import Probes, Readiness
from store import Store
from temporal_client.connection import codec_from_env
from temporal_client.telemetry import Telemetry

log = logging.getLogger("ksquad.api")


def cluster_api(
    store: Store, kube: Kube, auth: KubernetesAuth, settings: ApiSettings, codec: Any
) -> Starlette:
    """The routes in the table above, from their parts: the callers' checks and bounds (api/cluster_callers.py),
    the codec's door (api/cluster_codec.py), a Run's events and artifacts (api/cluster_runs.py), the console
    (api/cluster_console.py), and the routes shared with the embedded API; each answer counted by route."""
    streams = stream_budget(settings.stream_limits)
    callers = Callers(auth, settings.refused_tokens, settings.requests)
    codec_mount = codec_routes(codec, settings, callers)
    console = console_app(store, kube, auth, settings, callers.over_rate, streams)

    return Starlette(
        exception_handlers=ROUTING_ERRORS,
        routes=[
            *console,
            *(
                Route(r.path, counted("items", r.endpoint), methods=r.methods)
                for r in item_routes(
                    store,
                    with_item_tokens(store, settings.item_token_key, callers.people, callers.over_rate),
                    streams,
                )
            ),
            *(
                Route(r.path, counted("attempts", r.endpoint), methods=r.methods)
                for r in attempt_routes(store, settings.item_token_key, codec, callers.over_rate)
            ),
            *(
                Route(r.path, counted("memory", r.endpoint), methods=r.methods)
                for r in memory_routes(
                    store,
                    with_attempt_tokens(
                        store, settings.item_token_key, callers.people_of_memory, callers.over_rate
                    ),
                )
            ),
            *run_routes(store, kube, callers, streams),
            *(Route(r.path, counted("usage", r.endpoint)) for r in usage_routes(store, callers.usage_reader)),
            Mount("/codec", codec_mount),
        ],
    )


SANDBOX_PATHS = ("/items/", ATTEMPTS_PREFIX, MEMORY_PREFIX)


def items_only(app: Any) -> Any:
    """The API as sandboxes reach it: /items/, /attempts/ and /memory/ alone (an attempt's token reaches nothing else); any
    other path is 404, before it is routed, so this listener is no way to the console, the codec or a run's
    artifacts."""

    async def serve_items(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(SANDBOX_PATHS):
            await error(404, "only /items/, /attempts/ and /memory/ are served on this port")(
                scope, receive, send
            )
            return
        await app(scope, receive, send)

    return serve_items


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield  # the process handles its signals itself


def listening(app: Any, port: int, cert_file: str | None, key_file: str | None) -> _Server:
    config = uvicorn.Config(
        app,
        host="0.0.0.0",
        port=port,
        log_level="warning",
        lifespan="off",
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
    )
    return _Server(config)


async def serve(settings: ApiSettings) -> None:
    codec = codec_from_env()  # None: payloads are in clear, /codec/ says so (404) and the rest is served
    store = await Store.open(settings.database_url, migrate=False)
    telemetry = Telemetry()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(store.close)
        stack.push_async_callback(telemetry.aclose)
        kube = await stack.enter_async_context(Kube(Config.load(settings.kubeconfig)))

        async def api_server_answers() -> bool:
            await kube.get("/version")
            return True

        readiness = Readiness({"store": store.ping, "kubernetes": api_server_answers})
        await readiness.check()
        checking = asyncio.create_task(readiness.watch())
        app = cluster_api(store, kube, KubernetesAuth(kube), settings, codec)
        servers = [
            listening(tracing.TracedHttp(app), settings.port, settings.tls_cert_file, settings.tls_key_file)
        ]
        if settings.items_tls_cert_file and settings.items_tls_key_file:
            sandboxes = tracing.TracedHttp(items_only(app))
            servers.append(
                listening(
                    sandboxes, settings.items_port, settings.items_tls_cert_file, settings.items_tls_key_file
                )
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with Probes(
            settings.health_port, lambda: readiness.ready, readiness.details, telemetry.exposition
        ):
            serving = [asyncio.create_task(server.serve()) for server in servers]
            log.info(
                "serving on :%d%s (health :%d), %s",
                settings.port,
                f", items for sandboxes on :{settings.items_port} (HTTPS)" if len(servers) > 1 else "",
                settings.health_port,
                f"codec key ring {codec.ring.ids}" if codec else "no codec (payloads in clear)",
            )
            await asyncio.wait(
                [*serving, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED
            )
            for server in servers:
                server.should_exit = True
            await asyncio.gather(*serving)
        checking.cancel()


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(
        prog="ksquad-api", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    tracing.configure_or_exit("ksquad-api")
    # What the imports built lives as long as the process: no garbage collection walks it again, nor does the
    # interpreter's exit (the worker's imports and exit: about a fifth less CPU).
    gc.freeze()
    try:
        asyncio.run(serve(ApiSettings.from_env()))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
