"""Temporal's remote codec protocol (`POST /encode`, `POST /decode`, Payloads as protobuf JSON), for the Temporal
UI and `temporal --codec-endpoint`: the same key ring as the workers, so the UI shows inputs, results, summaries
and heartbeats decoded for whoever may see them. CORS answers the configured UI origins only (with credentials:
the UI's `includeCredentials` sends the codec cookie). Who may decode is `authorize`'s to say; without it, anyone
who reaches the app may: serve it behind a guard (the embedded API does)."""

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads

from api.errors import ROUTING_ERRORS
from temporal_client.codec import EncryptionCodec

# A refusal (401, 403...) for a request that may not use the codec, or None to let it through.
Authorize = Callable[[Request], Awaitable[Response | None]]
Transform = Callable[[list[Any]], Awaitable[list[Any]]]


def codec_app(
    codec: EncryptionCodec,
    origins: frozenset[str],
    authorize: Authorize | None = None,
    extra_routes: list[Route] | None = None,
) -> Starlette:
    def cors(request: Request) -> dict[str, str]:
        origin = request.headers.get("origin")
        if origin and origin in origins:
            return {
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Credentials": "true",
                "Access-Control-Allow-Methods": "POST, OPTIONS",
                "Access-Control-Allow-Headers": "Content-Type, X-Namespace, Authorization, Authorization-Extras",
                "Vary": "Origin",
            }
        return {}

    def endpoint(transform: Transform) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            headers = cors(request)
            if request.method == "OPTIONS":
                return Response(status_code=204, headers=headers)  # a preflight carries no credentials
            if authorize is not None and (refusal := await authorize(request)) is not None:
                refusal.headers.update(headers)  # the UI can read why
                return refusal
            try:
                payloads = json_format.Parse(await request.body(), Payloads())
                result = Payloads(payloads=await transform(list(payloads.payloads)))
            except Exception as err:  # a malformed body or a payload of another key: say which
                return JSONResponse(
                    {"error": f"{type(err).__name__}: {err}"}, status_code=400, headers=headers
                )
            return Response(json_format.MessageToJson(result), media_type="application/json", headers=headers)

        return handle

    # The protocol looks only at the path's last part: /decode, or /{namespace}/decode (the CLI's templating).
    routes = [
        Route("/encode", endpoint(codec.encode), methods=["POST", "OPTIONS"]),
        Route("/decode", endpoint(codec.decode_for_display), methods=["POST", "OPTIONS"]),
        Route("/{namespace}/encode", endpoint(codec.encode), methods=["POST", "OPTIONS"]),
        Route("/{namespace}/decode", endpoint(codec.decode_for_display), methods=["POST", "OPTIONS"]),
    ]
    return Starlette(routes=[*(extra_routes or []), *routes], exception_handlers=ROUTING_ERRORS)
