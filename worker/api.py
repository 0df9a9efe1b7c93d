"""The embedded default's HTTP API, on loopback: what the `ksquad` CLI talks to.

    POST   /apply                          {"documents": [...]}: store the objects, start new Runs
    GET    /runs[?namespace=NS]            the Runs, as the API server would list them
    GET    /runs/{namespace}/{name}        one Run
    POST   /runs/{namespace}/{name}/cancel|pause|resume   {"reason": "..."}
    DELETE /runs/{namespace}/{name}        cancel, wait for the workflow to end, forget the Run
    GET    /runs/{namespace}/{name}/events server-sent events: phase changes and agent progress, in order;
                                           `Last-Event-ID` (or ?after=N) replays from after that event
    POST   /codec/encode, /codec/decode    Temporal's remote codec protocol, for the UI (see `codec_app`)

Errors are JSON `{"error": "...", "problems": [...]}` with 404 for an unknown run, 422 for invalid input.
"""

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.service import RPCError

from activities.store import Store, StoreError
from worker.embedded import EmbeddedRuns, UnknownRun
from workflows.codec import EncryptionCodec
from workflows.model import InvalidObject
from workflows.status import Phase

log = logging.getLogger(__name__)
SSE_POLL_SECONDS = 0.2
SSE_KEEPALIVE_SECONDS = 15.0


def error(status: int, message: str, problems: list[str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "problems": problems or []}, status_code=status)


Handler = Callable[[Request], Awaitable[Response]]


def _errors(handler: Handler) -> Handler:
    """Known failures as JSON with their status; nothing escapes as a bare 500 without a message."""

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except UnknownRun as err:
            return error(404, str(err))
        except InvalidObject as err:
            return error(422, str(err), err.problems)
        except (StoreError, RPCError, RuntimeError) as err:
            return error(503, f"{type(err).__name__}: {err}")

    return wrapped


def api_app(runs: EmbeddedRuns, store: Store, codec: EncryptionCodec | None = None,
            codec_origins: tuple[str, ...] = (), codec_token: str | None = None) -> Starlette:  # fmt: skip
    def key(request: Request) -> tuple[str, str]:
        return request.path_params["namespace"], request.path_params["name"]

    async def healthz(_: Request) -> Response:
        return JSONResponse({"ok": True})

    @_errors
    async def apply(request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            return error(422, "the body is not JSON")
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
        body = await request.json() if await request.body() else {}
        reason = (body or {}).get("reason") or f"ksquad runs {action}"
        args = () if action == "resume" else (reason,)
        run = await runs.signal(*key(request), action, *args)
        return JSONResponse({"run": f"{run.namespace}/{run.name}", "signal": action})

    @_errors
    async def events(request: Request) -> Response:
        run = await runs.get(*key(request))
        cursor = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
        try:
            after = int(cursor)
        except ValueError:
            return error(422, f"Last-Event-ID must be an event number (got {cursor!r})")
        return StreamingResponse(
            _stream(runs, store, run.namespace, run.name, run.uid, after, request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    routes = [
        Route("/healthz", healthz),
        Route("/apply", apply, methods=["POST"]),
        Route("/runs", list_runs),
        Route("/runs/{namespace}/{name}", get_run),
        Route("/runs/{namespace}/{name}", delete_run, methods=["DELETE"]),
        Route("/runs/{namespace}/{name}/events", events),
        Route("/runs/{namespace}/{name}/{action:str}", signal_run, methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    if codec is not None:
        app.mount("/codec", codec_app(codec, codec_origins, codec_token))
    return app


def sse(event_id: int | None, event: str, data: Any) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n".encode()


async def _stream(runs: EmbeddedRuns, store: Store, namespace: str, name: str, uid: str, after: int,
                  request: Request) -> AsyncIterator[bytes]:  # fmt: skip
    """The run's events after `after`, then new ones as they come; `end` once the run finished and every
    event was sent (or the Run was deleted)."""
    loop = asyncio.get_running_loop()
    last_sent = loop.time()
    while not await request.is_disconnected():
        for event in await store.events(uid, after):
            after = event.seq
            last_sent = loop.time()
            yield sse(event.seq, event.kind, {"seq": event.seq, "kind": event.kind, "message": event.message,
                                              "data": event.data, "attempt": event.attempt,
                                              "at": event.at.isoformat()})  # fmt: skip
        run = await runs.objects.get("Run", namespace, name)
        if run is None or run.uid != uid:
            yield sse(None, "end", {"reason": "deleted"})
            return
        phase = Phase((run.status or {}).get("phase", "Pending"))
        if phase.terminal and not await store.events(uid, after, limit=1):
            yield sse(None, "end", {"phase": phase.value})
            return
        if loop.time() - last_sent > SSE_KEEPALIVE_SECONDS:
            last_sent = loop.time()
            yield b": keep-alive\n\n"
        await asyncio.sleep(SSE_POLL_SECONDS)


def codec_app(codec: EncryptionCodec, origins: tuple[str, ...], token: str | None) -> Starlette:
    """Temporal's remote codec protocol (`POST /encode`, `POST /decode`, Payloads as protobuf JSON), for the
    Temporal UI and `temporal --codec-endpoint`.

    Who may decode: a caller with the bearer token (`.ksquad/codec.token` in the embedded default), or a
    browser page served from one of `origins` (the UI: the browser enforces Origin; this is a loopback
    convenience for one user's machine, not an access control for a shared cluster, where the UI's own
    authentication must front it)."""

    def cors(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin and origin in origins:
            return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Credentials": "true",
                    "Access-Control-Allow-Methods": "POST, OPTIONS",
                    "Access-Control-Allow-Headers": "Content-Type, X-Namespace, Authorization", "Vary": "Origin"}  # fmt: skip
        return {}

    def allowed(request: Request) -> bool:
        if token is not None and request.headers.get("authorization") == f"Bearer {token}":
            return True
        return request.headers.get("origin") in origins

    def endpoint(transform: Callable[[list[Any]], Awaitable[list[Any]]]) -> Handler:
        async def handle(request: Request) -> Response:
            headers = cors(request)
            if request.method == "OPTIONS":
                return Response(status_code=204, headers=headers)
            if not allowed(request):
                return JSONResponse({"error": "not allowed to use the codec: send Authorization: Bearer <token>"},
                                    status_code=401, headers=headers)  # fmt: skip
            try:
                payloads = json_format.Parse(await request.body(), Payloads())
                result = Payloads(payloads=await transform(list(payloads.payloads)))
            except Exception as err:  # a malformed body or a payload of another key: say which
                return JSONResponse(
                    {"error": f"{type(err).__name__}: {err}"}, status_code=400, headers=headers
                )
            return Response(json_format.MessageToJson(result), media_type="application/json", headers=headers)

        return handle

    return Starlette(routes=[
        Route("/encode", endpoint(codec.encode), methods=["POST", "OPTIONS"]),
        Route("/decode", endpoint(codec.decode), methods=["POST", "OPTIONS"]),
    ])  # fmt: skip
