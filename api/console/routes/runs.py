"""The runs list's handlers: the page (filtered by namespace, phase, Team, Agent and person; the newest
MAX_RUNS_SHOWN), its table alone (fetched again when it changed), and the server-sent changes that say when."""

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from api.console.backend import Refused
from api.console.guard import SECURITY_HEADERS, Session, page
from api.console.html import Html
from api.console.pages import runs as pages
from api.console.pages.layout import url
from api.console.routes.context import Console, shell
from api.streams import KEEPALIVE_SECONDS, HeldStream, sse
from store import StoreError

# The newest runs shown; more is a filter's job (the page fetches its table again when it changes).
MAX_RUNS_SHOWN = 200
CHANGE_SECONDS = 2.0  # a runs table is told of changes at most this often


def chosen(request: Request) -> dict[str, str]:
    return {k: request.query_params.get(k, "") for k in ("phase", "team", "agent", "person")}


async def listed_runs(session: Session, request: Request) -> list[dict[str, Any]]:
    namespace = request.query_params.get("namespace") or None
    runs = await session.backend.runs(namespace)
    wanted = chosen(request)
    found = [r for r in runs if pages.matches(r, wanted)]
    return sorted(found, key=lambda r: str(r.get("metadata", {}).get("creationTimestamp", "")), reverse=True)


def shown(runs: list[dict[str, Any]]) -> Html:
    """The newest MAX_RUNS_SHOWN, and a line saying how many more the filters match."""
    table = pages.runs_table(runs[:MAX_RUNS_SHOWN])
    if len(runs) <= MAX_RUNS_SHOWN:
        return table
    return Html(table + pages.more_runs(len(runs), MAX_RUNS_SHOWN))


async def runs_page(request: Request, session: Session) -> Response:
    namespace = request.query_params.get("namespace", "")
    runs = await listed_runs(session, request)
    query = {"namespace": namespace, **chosen(request)}
    body = pages.runs_page(
        shown(runs),
        namespace,
        await session.backend.namespaces(),
        chosen(request),
        url("runs.frag", **query),
        url("runs.changes", namespace=namespace),
    )
    return shell(session, "Runs", body, request)


async def runs_fragment(request: Request, session: Session) -> Response:
    return page(shown(await listed_runs(session, request)))


async def runs_changes(console: Console, request: Request, session: Session) -> Response:
    """Server-sent `change` when the runs table may have changed, looked at every CHANGE_SECONDS (a busy
    namespace costs a tab what polling did, a quiet one nothing); `end` with the reason once the person may no
    longer list those Runs. One of the person's event streams (the streams budget)."""
    namespace = request.query_params.get("namespace") or None
    backend = session.backend
    seen = await backend.runs_version(namespace)  # Refused: before a stream is held
    held = HeldStream(console.streams, backend.viewer.name, namespace or "")  # OverBudget: 429

    async def changes() -> AsyncIterator[bytes]:
        nonlocal seen
        loop = asyncio.get_running_loop()
        last_sent = loop.time()
        yield b"retry: 5000\n\n"
        while not await request.is_disconnected():
            await asyncio.sleep(CHANGE_SECONDS)
            try:
                now = await backend.runs_version(namespace)
            except Refused as err:
                yield sse(None, "end", {"reason": err.message})
                return
            except StoreError as err:
                yield sse(None, "end", {"reason": f"the store does not answer: {err}"})
                return
            if now != seen:
                seen, last_sent = now, loop.time()
                yield sse(None, "change", {})
            elif loop.time() - last_sent > KEEPALIVE_SECONDS:
                last_sent = loop.time()
                yield b": keep-alive\n\n"

    return StreamingResponse(
        held.counted(changes()),
        media_type="text/event-stream",
        headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"},
    )
