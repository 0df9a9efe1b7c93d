"""The embedded default's HTTP API, on loopback: what the `ksquad` CLI talks to.

Who may call it (Guard): a caller with the bearer token in `.ksquad/api.token` (made on first start, mode
0600, read by the CLI), or on /items/, /attempts/ and /memory/ a local agent with its attempt's item token, naming the API by
its loopback host (a Host header of another name is refused: DNS rebinding). A browser page of another origin is refused whatever it sends. Requests that change something carry
`application/json` (no form or text/plain body from a web page gets through without a preflight, which this API
never grants), bodies are at most 4 MiB, and only the signals below are accepted.

The Temporal UI is served through this API, at /ui/ (the dev server's own UI, proxied), so that the UI and the
codec endpoint share an origin and a session cookie: the developer signs in once with the link `ksquad dev`
prints (/ui/signin?token=...), which sets an HttpOnly, SameSite=Strict cookie derived from the token. The codec
endpoint takes the token or that cookie, nothing else: any local process can set an `Origin` header, so an
origin proves nothing about who is asking, and the codec decrypts the history and encrypts inputs.

    POST   /apply                          {"documents": [...]}: store the objects, start new Runs
    GET    /runs[?namespace=NS]            the Runs, as the API server would list them
    GET    /runs/{namespace}/{name}        one Run
    POST   /runs/{namespace}/{name}/cancel|pause|resume   {"reason": "..."}
    DELETE /runs/{namespace}/{name}        cancel, wait for the workflow to end, forget the Run
    GET    /runs/{namespace}/{name}/events server-sent events: phase changes and agent progress, in order;
                                           `Last-Event-ID` (or ?after=N) replays from after that event
    *      /items/{namespace}[/{id}[/events|/comments|/state]]   work items, as the developer (api/items.py)
    *      /attempts/checkpoints           an attempt's recorded steps, with its token (api/attempts.py)
    *      /memory/{namespace}/{teams|projects}/{name}[/export|/{id}]   squad memory, as the developer (api/memory.py)
    GET    /usage?by=...[&namespace=NS][&since=T][&until=T]   model usage summed (api/usage.py)
    POST   /codec/encode, /codec/decode    Temporal's remote codec protocol, for the UI (see `codec_app`)
    GET    /ui/signin?token=TOKEN[&next=/ui/...]   the session cookie for the UI, then to the UI
    *      /ui/...                         the Temporal UI (with the session cookie)
    GET    /console/signin?token=TOKEN     the same session cookie, then to the console
    *      /console/...                    the console (api/console/app.py): with the session cookie; its forms
                                           carry their CSRF token instead of a JSON body

Errors are JSON `{"error": "...", "problems": [...]}`: 400 for a body that is not JSON, not of the shape the
route takes, or an unknown action, 401 without the token (or, for /ui/ and /codec/, the session cookie), 403 for
another origin, 404 for an unknown run or route, 405 for a method the route does not take, 409 for a signal the
run cannot take (it has ended; an answer to a run that asks nothing), 413 for a body too large, 415 for a body
that is not application/json, 421 for another Host, 422 for invalid objects.
"""

import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from temporalio.service import RPCError

from agent.callers import ITEM_TOKEN_PREFIX
from api.attempts import PREFIX as ATTEMPTS_PREFIX
from api.attempts import attempt_routes
from api.codec import codec_app
from api.console.app import console_routes
from api.console.guard import Session, csrf_key_of
from api.console.pages.bare import signin_needed_page
from api.errors import ROUTING_ERRORS, error
from api.items import Writer, item_routes, with_item_tokens
from api.memory import PREFIX as MEMORY_PREFIX
from api.memory import memory_routes, with_attempt_tokens
from api.streams import parse_cursor, stream_events
from api.usage import usage_routes
from dev.console import EmbeddedConsole
from dev.embedded import EmbeddedRuns, RunRefuses, UnknownRun
from store import Author, Store, StoreError
from temporal_client.codec import EncryptionCodec
from workflows.model import InvalidObject
from workflows.signals import USER_SIGNALS, RunSignal
from workflows.status import Phase

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 << 20  # an apply of a thousand Runs is about half a megabyte
UI_PREFIX = "/ui"  # the dev server's UI is started with this public path, and proxied here
CONSOLE_PREFIX = "/console"
SESSION_COOKIE = "ksquad-dev-session"
# Not forwarded either way: they describe one connection, not the request (RFC 9110, 7.6.1).
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)


def session_value(token: str) -> str:
    """The UI's session cookie: derived from the token (the cookie never holds the token itself)."""
    return hmac.new(token.encode(), b"ksquad-dev-ui-session", hashlib.sha256).hexdigest()


Handler = Callable[[Request], Awaitable[Response]]


def _errors(handler: Handler) -> Handler:
    """Known failures as JSON with their status; nothing escapes as a bare 500 without a message."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except UnknownRun as err:
            return error(404, str(err))
        except RunRefuses as err:
            return error(409, str(err))
        except InvalidObject as err:
            return error(422, str(err), err.problems)
        except (StoreError, RPCError, RuntimeError) as err:
            return error(503, f"{type(err).__name__}: {err}")

    return wrapped


def api_app(
    runs: EmbeddedRuns,
    store: Store,
    token: str,
    hosts: frozenset[str],
    codec: EncryptionCodec | None = None,
    ui_upstream: str | None = None,
    item_key: bytes | None = None,
    temporal_namespace: str = "default",
) -> "Guard":
    """The API, behind its Guard: `token` for every caller, `hosts` the Host values it answers to, and the
    Temporal UI of `ui_upstream` (the dev server's, started with the public path /ui) served at /ui/. The local
    agents' item tokens are checked with `item_key` (the worker's)."""

    def key(request: Request) -> tuple[str, str]:
        return request.path_params["namespace"], request.path_params["name"]

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    async def as_the_developer(request: Request, verb: str, namespace: str, item: str | None) -> Writer:
        """The Guard let the token's holder in: the developer, who may do anything, as themselves."""
        return Writer(Author(user=runs.user))

    async def as_the_developer_of_memory(
        request: Request, verb: str, namespace: str, scope: str, name: str
    ) -> Writer:
        return Writer(Author(user=runs.user))

    async def the_developer_may(request: Request, namespace: str | None) -> None:
        """Usage: the Guard let the token's holder in (an item token reaches /items/, /attempts/ and /memory/ alone)."""
        return None

    @_errors
    async def apply(request: Request) -> Response:
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        documents = body.get("documents") if isinstance(body, dict) else None
        if not isinstance(documents, list):
            return error(422, 'expected {"documents": [...]}')
        return JSONResponse({"applied": await runs.apply(documents)})

    @_errors
    async def list_runs(request: Request) -> Response:
        items = await runs.objects.of_kind("Run", request.query_params.get("namespace"))
        return JSONResponse({"apiVersion": "v1", "kind": "List", "items": [r.manifest() for r in items]})

    @_errors
    async def get_run(request: Request) -> Response:
        return JSONResponse((await runs.get(*key(request))).manifest())

    @_errors
    async def delete_run(request: Request) -> Response:
        return JSONResponse((await runs.delete(*key(request))).manifest())

    @_errors
    async def signal_run(request: Request) -> Response:
        action = request.path_params["action"]
        if action not in USER_SIGNALS:  # `POST /runs/{ns}/{name}/{action}` sends only these
            return error(400, f"unknown action {action!r}: one of {', '.join(USER_SIGNALS)}")
        fields = await json_body(request) if await request.body() else {}
        if isinstance(fields, Response):
            return fields
        if action == RunSignal.INPUT and not (
            isinstance(fields, dict) and isinstance(fields.get("text"), str)
        ):
            return error(400, 'input needs {"text": "..."}: the answer the agent asked for')
        if not isinstance(fields, dict) or not isinstance(fields.get("reason") or "", str):
            return error(
                400, f'{action} takes {{"reason": "..."}} or no body, got {json.dumps(fields)[:200]}'
            )
        reason = fields.get("reason") or f"ksquad runs {action}"
        args = (
            ()
            if action == RunSignal.RESUME
            else (fields["text"],)
            if action == RunSignal.INPUT
            else (reason,)
        )
        run = await runs.signal(*key(request), RunSignal(action), *args)
        return JSONResponse({"run": f"{run.namespace}/{run.name}", "signal": action})

    @_errors
    async def artifact(request: Request) -> Response:
        run = await runs.get(*key(request))
        name = request.path_params["artifact"]
        found = await store.artifact(run.uid, name)
        if found is None:
            return error(404, f"run {run.namespace}/{run.name} has no artifact {name!r}")
        media_type, content = found
        return Response(content, media_type=media_type or "application/octet-stream")

    @_errors
    async def events(request: Request) -> Response:
        run = await runs.get(*key(request))
        try:
            after = parse_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
        except ValueError as err:
            return error(422, str(err))

        async def ended(_: str | None) -> dict[str, Any] | None:
            current = await runs.objects.get("Run", run.namespace, run.name)
            if current is None or current.uid != run.uid:
                return {"reason": "deleted"}
            phase = Phase((current.status or {}).get("phase", "Pending"))
            return {"phase": phase.value} if phase.terminal else None

        return StreamingResponse(
            stream_events(store, run.uid, after, request.is_disconnected, ended),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    default_page = f"{UI_PREFIX}/" if ui_upstream is not None else f"{CONSOLE_PREFIX}/"

    async def signin(request: Request) -> Response:
        if not hmac.compare_digest(request.query_params.get("token", "").encode(), token.encode()):
            return error(401, "that is not the token in .ksquad/api.token: use the link `ksquad dev` printed")
        after = request.query_params.get("next", "")  # a page of the UI or the console, never another site
        own_page = after.startswith((f"{UI_PREFIX}/", f"{CONSOLE_PREFIX}/")) and not after.startswith("//")
        default = f"{CONSOLE_PREFIX}/" if request.url.path.startswith(CONSOLE_PREFIX) else default_page
        response = RedirectResponse(after if own_page else default, status_code=303)
        response.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="strict", path="/")
        return response

    async def ui(request: Request) -> Response:
        assert ui_upstream is not None
        # The path as sent (raw): a workflow id's "%2F" must reach the UI's API encoded.
        raw_path = request.scope.get("raw_path") or request.url.path.encode()
        url = httpx.URL(f"{ui_upstream}{raw_path.decode('latin-1')}", query=request.url.query.encode())
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        client = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None))
        try:
            upstream = await client.send(
                client.build_request(request.method, url, headers=headers, content=await request.body()),
                stream=True,
            )
        except httpx.TransportError as err:
            await client.aclose()
            return error(502, f"the Temporal UI at {ui_upstream} does not answer: {err}")

        async def body() -> Any:
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()

        answer = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]
        response = StreamingResponse(body(), status_code=upstream.status_code)
        response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer]
        return response

    console = EmbeddedConsole(runs, store, UI_PREFIX if ui_upstream else None, temporal_namespace)

    async def console_session(request: Request) -> Session | Response:
        """The Guard let the developer in (the session cookie, or the token itself)."""
        return Session(console, request.cookies.get(SESSION_COOKIE) or "bearer")

    async def signout(request: Request) -> Response:
        response = HTMLResponse(str(signin_needed_page("Signed out.")))
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    routes = [
        Route("/healthz", healthz),
        Route(f"{CONSOLE_PREFIX}/signin", signin),
        Route(f"{CONSOLE_PREFIX}/signout", signout),
        Route(CONSOLE_PREFIX, lambda _: RedirectResponse(f"{CONSOLE_PREFIX}/", status_code=307)),
        *console_routes(console_session, csrf_key_of(token.encode())),
        Route("/apply", apply, methods=["POST"]),
        Route("/runs", list_runs),
        Route("/runs/{namespace}/{name}", get_run),
        Route("/runs/{namespace}/{name}", delete_run, methods=["DELETE"]),
        Route("/runs/{namespace}/{name}/events", events),
        Route("/runs/{namespace}/{name}/artifacts/{artifact:path}", artifact),
        Route("/runs/{namespace}/{name}/{action:str}", signal_run, methods=["POST"]),
        *item_routes(store, with_item_tokens(store, item_key, as_the_developer)),
        *attempt_routes(store, item_key, codec),
        *memory_routes(store, with_attempt_tokens(store, item_key, as_the_developer_of_memory)),
        *usage_routes(store, the_developer_may),
    ]
    if ui_upstream is not None:
        routes += [
            Route(f"{UI_PREFIX}/signin", signin),
            Route(
                f"{UI_PREFIX}/{{path:path}}", ui, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
            ),
        ]
    app = Starlette(routes=routes, exception_handlers=ROUTING_ERRORS)
    if codec is not None:
        app.mount("/codec", codec_app(codec, frozenset()))  # the UI is of this origin: no CORS
    return Guard(app, token, hosts)


async def json_body(request: Request) -> Any:
    """The body as JSON, or a 400 that says what is wrong with it."""
    try:
        return json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as err:
        return error(400, f"the body is not JSON: {err}")


def bearer_matches(request: Request, token: str) -> bool:
    """The request carries `Authorization: Bearer <token>` (compared in constant time)."""
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def loopback_names(port: int) -> frozenset[str]:
    """The Host values a request to a loopback server on `port` may carry (and the origins of its pages)."""
    return frozenset(f"{host}:{port}" for host in ("127.0.0.1", "localhost", "[::1]"))


class Guard:
    """ASGI middleware: who may call the API (see the module's docstring)."""

    def __init__(self, app: Any, token: str, hosts: frozenset[str]) -> None:
        self.app = app
        self.token = token
        self.hosts = hosts
        self.own_origins = frozenset(f"http://{host}" for host in hosts)
        self.session = session_value(token)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self.refuse(request)
        if refusal is None and request.method in ("POST", "PUT", "PATCH", "DELETE"):
            refusal, body = await self._bounded_body(request, receive)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            log.warning(
                "refused %s %s from origin %s: %s",
                request.method,
                request.url.path,
                request.headers.get("origin", "-"),
                refusal.status_code,
            )
        await (refusal or self.app)(scope, receive, send)

    def refuse(self, request: Request) -> Response | None:
        if request.headers.get("host") not in self.hosts:
            return error(
                421,
                f"this API answers only as {', '.join(sorted(self.hosts))} (Host: "
                f"{request.headers.get('host')!r})",
            )
        if request.url.path == "/healthz":
            return None
        origin = request.headers.get("origin")
        if origin is not None and origin not in self.own_origins:
            return error(403, f"requests from pages of {origin} are refused")
        path = request.url.path
        if path in (f"{UI_PREFIX}/signin", f"{CONSOLE_PREFIX}/signin", f"{CONSOLE_PREFIX}/signout"):
            return None  # it checks the token it is given; signing out needs nothing
        if path.startswith(f"{CONSOLE_PREFIX}/static/") or path == CONSOLE_PREFIX:
            return None  # the console's style sheet and script: the same for everyone
        console = path.startswith(f"{CONSOLE_PREFIX}/")
        in_session = path.startswith(
            (f"{UI_PREFIX}/", "/codec/", f"{CONSOLE_PREFIX}/")
        ) and hmac.compare_digest(request.cookies.get(SESSION_COOKIE, "").encode(), self.session.encode())
        # An attempt's item token (agent.callers.item_token) goes on to the item and attempt routes, which check it.
        item_token = path.startswith(("/items/", ATTEMPTS_PREFIX, MEMORY_PREFIX)) and request.headers.get(
            "authorization", ""
        ).startswith(f"Bearer {ITEM_TOKEN_PREFIX}")
        if not in_session and not item_token and not bearer_matches(request, self.token):
            if path.startswith(f"{UI_PREFIX}/"):
                return error(401, "sign in first with the link `ksquad dev` printed (/ui/signin?token=...)")
            if console:
                return HTMLResponse(str(signin_needed_page()), status_code=401)
            return error(401, "send Authorization: Bearer <the token in .ksquad/api.token>")
        if path.startswith(f"{UI_PREFIX}/") or console:
            return None  # the UI's own requests, as it sends them; the console checks its forms' CSRF tokens
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        sends_body = request.method in ("POST", "PUT", "PATCH") or int(
            request.headers.get("content-length") or 0
        )
        if sends_body and request.method != "OPTIONS" and kind != "application/json":
            return error(415, f"send the body as application/json (got {kind or 'no Content-Type'})")
        return None

    async def _bounded_body(self, request: Request, receive: Any) -> tuple[Response | None, bytes]:
        too_large = error(413, f"the body is larger than {MAX_BODY_BYTES} bytes")
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            return too_large, b""
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return too_large, b""
            chunks.append(chunk)
            if not message.get("more_body"):
                return None, b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI receive that gives the body read already, then what the connection says (a disconnect)."""
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if sent:
            message: dict[str, Any] = await receive()
            return message
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
