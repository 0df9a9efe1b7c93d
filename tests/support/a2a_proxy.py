"""A proxy in front of a real A2A agent that loses what a test says is lost on the way."""

import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def dropping_cancels(upstream: str) -> Starlette:
    """A proxy to an A2A agent on which every CancelTask is lost (503, never forwarded); the card names the proxy,
    so the worker, which follows a card only on its endpoint, talks to the agent through it."""
    http = httpx.AsyncClient(base_url=upstream, timeout=None)
    dropped: list[str] = []

    async def forward(request: Request) -> Response:
        body = await request.body()
        if body and json.loads(body).get("method") == "CancelTask":
            dropped.append(json.loads(body)["params"].get("id", ""))
            return JSONResponse({"error": "lost on the way"}, status_code=503)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        sent = await http.send(
            http.build_request(request.method, request.url.path, content=body, headers=headers), stream=True
        )
        if request.url.path.endswith("agent-card.json"):
            card = (
                (await sent.aread()).decode().replace(upstream.rstrip("/"), str(request.base_url).rstrip("/"))
            )
            return Response(card, status_code=sent.status_code, media_type="application/json")
        return StreamingResponse(
            sent.aiter_raw(), status_code=sent.status_code, headers=dict(sent.headers), background=None
        )

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    app.state.dropped = dropped
    return app
