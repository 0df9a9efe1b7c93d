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
import hashlib
import hmac
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import Counter, Gauge
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

import tracing
from agent.callers import ITEM_KEY_ENV, read_key
from api.attempts import PREFIX as ATTEMPTS_PREFIX
from api.attempts import attempt_routes
from api.budgets import Budget, Limits, OverBudget, Rate, RateLimits, RequestLimits, Tarpit
from api.codec import codec_app
from api.console import pages
from api.console.app import SECURITY_HEADERS, Session, console_routes, csrf_key_of, form_of, same_origin
from api.console.cluster import SESSION_SECONDS, ClusterConsole, RunChanges, SessionSeal
from api.errors import ROUTING_ERRORS, error, too_many
from api.items import Writer, item_routes, with_item_tokens
from api.kubernetes_auth import Access, KubernetesAuth, User
from api.memory import PREFIX as MEMORY_PREFIX
from api.memory import memory_routes, with_attempt_tokens
from api.streams import (
    STREAM_LIMITS,
    HeldStream,
    RunLook,
    parse_cursor,
    run_ending,
    stream_budget,
    stream_events,
)
from api.usage import usage_routes
from kube import ApiError, Config, Kube, TokenFile, Unreachable, path
from kube.probes import Probes, Readiness
from store import Author, Store, StoreError
from temporal_client.connection import codec_from_env
from temporal_client.telemetry import Telemetry

log = logging.getLogger("ksquad.api")
RUN_API = "ksquad.io/v1alpha1"
CODEC_COOKIE = "ksquad-codec"
CONSOLE_COOKIE = "ksquad-console"

REQUESTS = Counter("ksquad_api_requests", "requests to ksquad-api, by route and status", ["route", "code"])
STREAMS = Gauge("ksquad_api_event_streams", "event streams open now")


# Console requests a person has in flight at once (each is one or a few API server calls made as them).
CONSOLE_LIMITS = Limits(per_person=8, per_namespace=64, total=128)
# Tokens the API server refused, reviewed: a flood of made-up tokens from one client stops at its bucket, from
# many at the total, so it never becomes a flood of TokenReviews.
REFUSED_TOKENS = RateLimits(per_client=2, burst=20, total=20)
# Requests a second, once the caller is known (a person, or an attempt by its item token): a console left open in
# many tabs, a script that polls in a loop, are answered 429 past their share, before they cost a store query or an
# API server call, so what one tenant sends cannot slow another's. A console tab polls every 2 s.
REQUEST_RATE = RequestLimits(per_person=20, per_namespace=100, total=400)
# Every 429 is held back a second before it is sent (at most 256 at once): see api.budgets.Tarpit.
TARPIT = Tarpit(seconds=1.0, most=256)


@dataclass
class ApiSettings:
    database_url: str
    codec_token_file: Path | None = None
    ui_origins: frozenset[str] = frozenset()
    port: int = 8080
    health_port: int = 8081
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    items_port: int = 8443
    # With its key: the listener for sandboxes (/items/, /attempts/, /memory/; HTTPS).
    items_tls_cert_file: str | None = None
    items_tls_key_file: str | None = None
    kubeconfig: str | None = None
    item_token_key: bytes | None = (
        None  # the worker's: attempts' tokens for their work item (None: none accepted)
    )
    console_key: bytes | None = None
    namespaces: list[str] = field(default_factory=list)
    temporal_ui_url: str | None = None
    temporal_namespace: str = "default"
    stream_limits: Limits = STREAM_LIMITS
    console_limits: Limits = CONSOLE_LIMITS
    refused_tokens: RateLimits = REFUSED_TOKENS
    requests: RequestLimits = REQUEST_RATE

    @classmethod
    def from_env(cls) -> "ApiSettings":
        env = os.environ
        if not env.get("KSQUAD_DATABASE_URL"):
            raise SystemExit("ksquad-api: set KSQUAD_DATABASE_URL to the worker's store (postgresql://...)")
        token = env.get("KSQUAD_CODEC_TOKEN_FILE")
        return cls(
            database_url=env["KSQUAD_DATABASE_URL"],
            codec_token_file=Path(token) if token else None,
            ui_origins=frozenset(
                o.strip() for o in env.get("KSQUAD_API_UI_ORIGINS", "").split(",") if o.strip()
            ),
            port=int(env.get("KSQUAD_API_LISTEN_PORT", "8080")),
            health_port=int(env.get("KSQUAD_HEALTH_PORT", "8081")),
            tls_cert_file=env.get("KSQUAD_API_TLS_CERT_FILE") or None,
            tls_key_file=env.get("KSQUAD_API_TLS_KEY_FILE") or None,
            items_port=int(env.get("KSQUAD_API_ITEMS_PORT", "8443")),
            items_tls_cert_file=env.get("KSQUAD_API_ITEMS_TLS_CERT_FILE") or None,
            items_tls_key_file=env.get("KSQUAD_API_ITEMS_TLS_KEY_FILE") or None,
            kubeconfig=env.get("KUBECONFIG") or None,
            item_token_key=read_key(env[ITEM_KEY_ENV]) if env.get(ITEM_KEY_ENV) else None,
            console_key=read_key(env["KSQUAD_CONSOLE_KEY_FILE"])
            if env.get("KSQUAD_CONSOLE_KEY_FILE")
            else None,
            namespaces=[n.strip() for n in env.get("KSQUAD_NAMESPACES", "").split(",") if n.strip()],
            temporal_ui_url=env.get("KSQUAD_TEMPORAL_UI_URL") or None,
            temporal_namespace=env.get("KSQUAD_TEMPORAL_NAMESPACE") or "default",
            **budgets_from_env(env),
        )


def budgets_from_env(env: Any) -> dict[str, Any]:
    """The chart's api.budgets, from KSQUAD_API_STREAMS, KSQUAD_API_CONSOLE_REQUESTS, KSQUAD_API_REFUSED_TOKENS,
    KSQUAD_API_REQUESTS."""
    found: dict[str, Any] = {}
    for setting, field_name, kind in (
        ("KSQUAD_API_STREAMS", "stream_limits", Limits),
        ("KSQUAD_API_CONSOLE_REQUESTS", "console_limits", Limits),
        ("KSQUAD_API_REFUSED_TOKENS", "refused_tokens", RateLimits),
        ("KSQUAD_API_REQUESTS", "requests", RequestLimits),
    ):
        if env.get(setting):
            try:
                found[field_name] = kind.parse(env[setting], setting)
            except ValueError as err:
                raise SystemExit(f"ksquad-api: {err}") from None
    return found


@dataclass
class Caller:
    """Who sent a request: a Kubernetes user (by bearer token), or the holder of the shared codec token."""

    user: User | None = None
    codec_token: bool = False
    refusal: Response | None = field(default=None, repr=False)


def codec_session(token: str) -> str:
    """The codec cookie's value: derived from the shared token (a stolen cookie is not the token), and changed
    with it."""
    return hmac.new(token.encode(), b"ksquad-codec-session", hashlib.sha256).hexdigest()


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def cluster_api(
    store: Store, kube: Kube, auth: KubernetesAuth, settings: ApiSettings, codec: Any
) -> Starlette:
    shared = TokenFile(settings.codec_token_file) if settings.codec_token_file else None
    secure_cookie = bool(settings.tls_cert_file)
    streams = stream_budget(settings.stream_limits)
    refused_tokens = Rate("refused-tokens", "tokens the API server refused", settings.refused_tokens.bounds())
    requests = Rate("requests", "requests", settings.requests.bounds())

    def over_rate(**keys: str) -> Response | None:
        """429 when a caller (`person=`: a person, or an attempt's run), a namespace they may act in
        (`namespace=`), or all together (`total=""`) have sent their share of requests."""
        try:
            requests.take(**keys)
        except OverBudget as err:
            return too_many(str(err), err.retry_after)
        return None

    async def codec_token_matches(given: str | None) -> bool:
        if shared is None or not given:
            return False
        expected = (await shared.authorization() or "").removeprefix("Bearer ")
        return hmac.compare_digest(given.encode(), expected.encode())

    async def codec_session_matches(given: str | None) -> bool:
        if shared is None or not given:
            return False
        expected = (await shared.authorization() or "").removeprefix("Bearer ")
        return bool(expected) and hmac.compare_digest(given.encode(), codec_session(expected).encode())

    async def kubernetes_user(request: Request, counted: bool = True) -> Caller:
        """Who sent the request, by its bearer token; a request `counted` is one of their requests a second
        (a stream's own re-check of its reader is not)."""
        token = bearer(request)
        if token is None:
            return Caller(refusal=error(401, "send Authorization: Bearer <a token the cluster accepts>"))
        client = request.client.host if request.client else ""
        fresh = not auth.knows(token)
        try:
            if fresh:
                # Taken before the review (parallel requests cannot all pass a check made before any counted),
                # given back when the token is accepted: a client whose tokens keep being refused waits, unreviewed.
                refused_tokens.take(client=client, total="")
            user = await auth.user(token)
        except OverBudget as err:
            return Caller(refusal=too_many(str(err), err.retry_after))
        except (ApiError, Unreachable) as err:
            if fresh:
                refused_tokens.give_back(client=client, total="")
            return Caller(refusal=error(503, f"the Kubernetes API server did not review the token: {err}"))
        if user is None:
            return Caller(refusal=error(401, "the Kubernetes API server does not accept this token"))
        if fresh:
            refused_tokens.give_back(client=client, total="")
        if counted:  # the person now; the namespace once they may act in it (`may`): no one spends another's
            refusal = over_rate(person=user.name, total="")
            if refusal is not None:
                return Caller(refusal=refusal)
        return Caller(user=user)

    async def may(caller: Caller, access: Access) -> Response | None:
        assert caller.user is not None
        try:
            if await auth.allowed(caller.user, access):
                return over_rate(namespace=access.namespace) if access.namespace else None
        except PermissionError as err:
            return error(503, str(err))
        what = f"{access.resource}/{access.subresource}" if access.subresource else access.resource
        where = f" in namespace {access.namespace}" if access.namespace else " cluster-wide"
        target = f" {access.name}" if access.name else ""
        return error(403, f"{caller.user.name} may not {access.verb} {what}.{access.group}{target}{where}")

    async def authorize_codec(request: Request) -> Response | None:
        token = bearer(request)
        if await codec_token_matches(token) or await codec_session_matches(request.cookies.get(CODEC_COOKIE)):
            return None
        if token is None:
            return error(
                401,
                "send the codec token (Authorization: Bearer, or sign in at /codec/login for the cookie), or a "
                "token the cluster accepts",
            )
        caller = await kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        return await may(caller, Access("get", "runs", subresource="codec"))

    async def login_form(request: Request) -> Response:
        return HTMLResponse(
            "<!doctype html><title>ksquad codec</title><form method=post action='/codec/login'>"
            "<label>Codec token <input type=password name=token autocomplete=off></label>"
            "<button>Sign in</button></form><p>The Temporal UI then decodes through this endpoint "
            "(its codec settings: this endpoint, with <em>include cross-origin credentials</em>).</p>"
        )

    async def login(request: Request) -> Response:
        form = await request.form()
        token = form.get("token")
        if not isinstance(token, str) or not await codec_token_matches(token):
            return error(401, "that is not the codec token")
        response = RedirectResponse("/codec/login?signed-in=1", status_code=303)
        # HttpOnly: no page script reads it; Lax: sent by the UI's fetch from the same site, not by other sites;
        # Secure whenever the browser came over HTTPS (this server's TLS, or an ingress's, which says so in
        # X-Forwarded-Proto); the value is derived from the token, never the token itself.
        https = secure_cookie or request.headers.get("x-forwarded-proto", "").lower() == "https"
        response.set_cookie(
            CODEC_COOKIE,
            codec_session(token),
            path="/codec",
            httponly=True,
            samesite="lax",
            secure=https,
            max_age=43200,
        )
        return response

    async def run_for(request: Request, verb: str = "get") -> tuple[dict[str, Any] | None, Response | None]:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        caller = await kubernetes_user(request)
        if caller.refusal is not None:
            return None, caller.refusal
        refusal = await may(caller, Access(verb, "runs", namespace=namespace, name=name))
        if refusal is not None:
            return None, refusal
        try:
            run: dict[str, Any] = await kube.get(path(RUN_API, "runs", namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None, error(404, f'run "{namespace}/{name}" not found')
            return None, error(503, f"reading run {namespace}/{name}: {err}")
        except Unreachable as err:
            return None, error(503, f"the Kubernetes API server does not answer: {err}")
        return run, None

    async def events(request: Request) -> Response:
        run, refusal = await run_for(request)
        if refusal is not None:
            return refusal
        assert run is not None
        try:
            after = parse_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
        except ValueError as err:
            return error(422, str(err))
        meta = run["metadata"]
        reader = (await kubernetes_user(request, counted=False)).user
        assert reader is not None  # run_for let them in
        try:
            held = HeldStream(streams, reader.name, meta["namespace"])
        except OverBudget as err:
            return too_many(str(err), err.retry_after)
        url = path(RUN_API, "runs", meta["namespace"], meta["name"])
        may_read = Access("get", "runs", namespace=meta["namespace"], name=meta["name"])

        async def look() -> RunLook | None:
            # As the reader: their token still accepted, their rights still there (decisions are cached for
            # seconds), so a reader whose RoleBinding went stops reading within seconds.
            caller = await kubernetes_user(request, counted=False)
            if caller.user is None:  # refused (401), or not reviewed now (look again later)
                assert caller.refusal is not None
                return RunLook(None, "", forbidden=True) if caller.refusal.status_code == 401 else None
            try:
                if not await auth.allowed(caller.user, may_read):
                    return RunLook(None, "", forbidden=True)
            except PermissionError:
                return None  # the API server did not answer: look again later
            try:
                current = await kube.get(url)
            except ApiError as err:
                return RunLook(None, "") if err.status == 404 else None
            except Unreachable:
                return None  # look again later; the stream goes on
            return RunLook(current["metadata"]["uid"], _phase(current))

        ended = run_ending(meta["uid"], look)

        async def body() -> Any:
            STREAMS.inc()
            try:
                chunks = stream_events(store, meta["uid"], after, request.is_disconnected, ended)
                async for chunk in held.counted(chunks):
                    yield chunk
            finally:
                STREAMS.dec()

        return StreamingResponse(
            body(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def artifact(request: Request) -> Response:
        run, refusal = await run_for(request)
        if refusal is not None:
            return refusal
        assert run is not None
        name = request.path_params["artifact"]
        try:
            found = await store.artifact(run["metadata"]["uid"], name)
        except StoreError as err:
            return error(503, f"the store does not answer: {err}")
        if found is None:
            return error(
                404, f"run {run['metadata']['namespace']}/{run['metadata']['name']} has no artifact {name!r}"
            )
        media_type, content = found
        return Response(content, media_type=media_type or "application/octet-stream")

    async def no_codec(request: Request) -> Response:
        return error(404, "no codec is configured (codec.keySecret): workflow payloads are in clear")

    login_routes = [Route("/login", login_form, methods=["GET"]), Route("/login", login, methods=["POST"])]
    codec_routes = (
        codec_app(codec, settings.ui_origins, authorize_codec, login_routes)
        if codec is not None
        else Starlette(
            exception_handlers=ROUTING_ERRORS,
            routes=[Route("/{rest:path}", no_codec, methods=["GET", "POST", "OPTIONS"])],
        )
    )

    async def people(request: Request, verb: str, namespace: str, item: str | None) -> Writer | Response:
        caller = await kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        assert caller.user is not None
        refusal = await may(caller, Access(verb, "workitems", namespace=namespace, name=item or ""))
        return refusal or Writer(Author(user=caller.user.name))

    async def people_of_memory(
        request: Request, verb: str, namespace: str, scope: str, name: str
    ) -> Writer | Response:
        caller = await kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        assert caller.user is not None
        refusal = await may(caller, Access(verb, scope, namespace=namespace, name=name, subresource="memory"))
        return refusal or Writer(Author(user=caller.user.name))

    async def usage_reader(request: Request, namespace: str | None) -> Response | None:
        caller = await kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        return await may(caller, Access("list", "runs", namespace=namespace or ""))

    console = console_app(store, kube, auth, settings, over_rate, streams)

    return Starlette(
        exception_handlers=ROUTING_ERRORS,
        routes=[
            *console,
            *(
                Route(r.path, counted("items", r.endpoint), methods=r.methods)
                for r in item_routes(
                    store, with_item_tokens(store, settings.item_token_key, people, over_rate), streams
                )
            ),
            *(
                Route(r.path, counted("attempts", r.endpoint), methods=r.methods)
                for r in attempt_routes(store, settings.item_token_key, codec, over_rate)
            ),
            *(
                Route(r.path, counted("memory", r.endpoint), methods=r.methods)
                for r in memory_routes(
                    store, with_attempt_tokens(store, settings.item_token_key, people_of_memory, over_rate)
                )
            ),
            Route("/runs/{namespace}/{name}/events", counted("events", events)),
            Route("/runs/{namespace}/{name}/artifacts/{artifact:path}", counted("artifact", artifact)),
            *(Route(r.path, counted("usage", r.endpoint)) for r in usage_routes(store, usage_reader)),
            Mount("/codec", codec_routes),
        ],
    )


def console_app(
    store: Store,
    kube: Kube,
    auth: KubernetesAuth,
    settings: ApiSettings,
    over_rate: Callable[..., Response | None],
    streams: Budget,
) -> list[Route]:
    """The console's routes, each person's calls made with their own token (api/console/cluster.py); a person's
    requests a second (`over_rate`) and event streams (`streams`) counted with those they send the API."""
    if settings.console_key is None:

        async def no_console(request: Request) -> Response:
            return error(503, "the console has no key (KSQUAD_CONSOLE_KEY_FILE; the chart makes one)")

        return [Route("/console{rest:path}", no_console, methods=["GET", "POST"])]
    seal = SessionSeal(settings.console_key)
    csrf_key = csrf_key_of(settings.console_key)
    https = bool(settings.tls_cert_file)
    run_changes = RunChanges(kube, settings.namespaces)  # one watch a namespace, for every person's tabs

    def token_of(request: Request) -> tuple[str | None, str]:
        """The person's token and how it came: from the proxy (Authorization), or the sign-in's cookie."""
        token = bearer(request)
        if token:
            return token, "your Kubernetes identity, from the proxy"
        opened = seal.open(request.cookies.get(CONSOLE_COOKIE, ""))
        return opened, "your Kubernetes identity, signed in with a token"

    async def console_session(request: Request) -> Session | Response:
        token, how = token_of(request)
        if token is None:
            return RedirectResponse("/console/signin", status_code=303)
        try:
            user = await auth.user(token)
        except (ApiError, Unreachable) as err:
            return HTMLResponse(
                str(
                    pages.refusal_page(503, f"the Kubernetes API server did not review the token: {err}", [])
                ),
                status_code=503,
                headers=SECURITY_HEADERS,
            )
        if user is None:
            answer = HTMLResponse(
                str(pages.signin_page("the Kubernetes API server does not accept this token (expired?)")),
                status_code=401,
                headers=SECURITY_HEADERS,
            )
            answer.delete_cookie(CONSOLE_COOKIE, path="/console")
            return answer
        # The person's share only: the console acts as them on the API server, which alone says whether they may
        # act in the namespace they name, so no namespace's share is spent on their word.
        refusal = over_rate(person=user.name, total="")
        if refusal is not None:
            return refusal
        backend = ClusterConsole(
            kube.acting_as(token),
            auth,
            user,
            store,
            settings.namespaces,
            settings.temporal_ui_url,
            settings.temporal_namespace,
            how,
            run_changes,
        )
        return Session(backend, hashlib.sha256(token.encode()).hexdigest())

    async def signin_form(request: Request) -> Response:
        return HTMLResponse(str(pages.signin_page()), headers=SECURITY_HEADERS)

    async def signin(request: Request) -> Response:
        if not same_origin(request):
            return error(403, "sign in from the console's own page")
        form = await form_of(request)
        if isinstance(form, Response):
            return form
        token = form.get("token", "").strip()
        try:
            user = await auth.user(token) if token else None
        except (ApiError, Unreachable) as err:
            return error(503, f"the Kubernetes API server did not review the token: {err}")
        if user is None:
            return HTMLResponse(
                str(pages.signin_page("the Kubernetes API server does not accept this token")),
                status_code=401,
                headers=SECURITY_HEADERS,
            )
        response = RedirectResponse("/console/", status_code=303)
        secure = https or request.headers.get("x-forwarded-proto", "").lower() == "https"
        response.set_cookie(
            CONSOLE_COOKIE,
            seal.seal(token),
            path="/console",
            httponly=True,
            samesite="strict",
            secure=secure,
            max_age=SESSION_SECONDS,
        )
        return response

    async def signout(request: Request) -> Response:
        response = HTMLResponse(str(pages.signin_page("Signed out.")), headers=SECURITY_HEADERS)
        response.delete_cookie(CONSOLE_COOKIE, path="/console")
        return response

    return [
        Route("/console", lambda _: RedirectResponse("/console/", status_code=307)),
        Route("/console/signin", signin_form),
        Route("/console/signin", signin, methods=["POST"]),
        Route("/console/signout", signout),
        *(
            Route(r.path, counted("console", r.endpoint), methods=r.methods)
            for r in console_routes(
                console_session,
                csrf_key,
                streams,
                Budget("console", "console requests", settings.console_limits),
            )
        ),
    ]


def counted(
    route: str, handler: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        response = await handler(request)
        REQUESTS.labels(route, str(response.status_code)).inc()
        if response.status_code == 429:
            await TARPIT.hold(int(response.headers.get("retry-after", "1")))
        return response

    return wrapped


def _phase(run: dict[str, Any]) -> str:
    return str((run.get("status") or {}).get("phase") or "")


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
    try:
        asyncio.run(serve(ApiSettings.from_env()))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
