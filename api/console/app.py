"""The console's routes, mounted at /console by both APIs: the embedded stack's (dev.api) and the cluster's
(api.cluster). Each route is behind api.console.guard: the API's `Identify` first answers with the signed-in
person's `Session` (their Backend) or with the response to send instead (to the sign-in page, or a refusal); a
POST must come from this origin with the form's CSRF token.

    GET  /console/                              runs, filtered by namespace, phase, Team, Agent and person
    GET  /console/runs.frag?...                 the runs table alone (the page fetches it again when told)
    GET  /console/runs.changes?namespace=NS     server-sent `change` when that table may have changed
    GET  /console/runs/{ns}/{name}              a run: timeline, countdown, progress, artifacts, usage, actions
    GET  /console/runs/{ns}/{name}/events       its events (server-sent; Last-Event-ID resumes)
    GET  /console/runs/{ns}/{name}/artifacts/{artifact}   an artifact, as text or as a download, never as a page
    POST /console/runs/{ns}/{name}/{cancel|pause|resume|input}
    GET  /console/items?namespace=NS            work items; /console/items/{ns}/{id} an item's thread
    POST /console/items/{ns}/{id}/comments      a comment, as the signed-in person
    GET  /console/memory?namespace=NS           Teams and Projects; /console/memory/{ns}/{scope}/{name} a memory
    GET  /console/memory/{ns}/{scope}/{name}/export       its entries as JSON lines
    POST /console/memory/{ns}/{scope}/{name}[/{entry}]   an entry added, or one edited or deleted
    GET  /console/start?namespace=NS, POST /console/start   start a Run from an Agent or a Team
    GET  /console/static/{file}                 the style sheet and the script (no asset is fetched elsewhere)

Each page's handlers are in api.console.routes, its markup in api.console.pages (a module a page in both).
"""

from functools import partial
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from api.budgets import Budget, Limits
from api.console.guard import Guard, Identify
from api.console.routes import items, memory, run, runs, start
from api.console.routes.context import Console
from api.streams import stream_budget

STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {"console.css": "text/css", "console.js": "text/javascript"}
UNBOUNDED = Limits(2**31, 2**31, 2**31)  # the embedded console: one developer


async def static(request: Request) -> Response:
    name = request.path_params["file"]
    if name not in STATIC_TYPES:
        return Response("not found", status_code=404, media_type="text/plain")
    return FileResponse(
        STATIC / name,
        media_type=STATIC_TYPES[name],
        headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
    )


def console_routes(
    identify: Identify, csrf_key: bytes, streams: Budget | None = None, requests: Budget | None = None
) -> list[Route]:
    """The routes above, each behind `identify`; a person's event streams counted in `streams` (the API's own,
    on a cluster), and the requests they have in flight in `requests` (each person's own share: one person's
    tabs polling never make another wait)."""
    streams = streams or stream_budget()
    requests = requests or Budget("console", "console requests", UNBOUNDED)
    console = Console(csrf_key, streams, run.trace_page_template())
    guard = Guard(identify, csrf_key, requests)
    signed_in, posted = guard.signed_in, guard.posted
    return [
        Route("/console/static/{file}", static),
        Route("/console/", signed_in(runs.runs_page)),
        Route("/console/runs.frag", signed_in(runs.runs_fragment)),
        Route("/console/runs.changes", signed_in(partial(runs.runs_changes, console))),
        Route("/console/runs/{namespace}/{name}", signed_in(partial(run.run_page, console))),
        Route("/console/runs/{namespace}/{name}/events", signed_in(partial(run.run_events, console))),
        Route("/console/runs/{namespace}/{name}/artifacts/{artifact:path}", signed_in(run.artifact)),
        Route("/console/runs/{namespace}/{name}/{action}", signed_in(posted(run.act)), methods=["POST"]),
        Route("/console/items", signed_in(items.items_page)),
        Route("/console/items/{namespace}/{item}", signed_in(partial(items.item_page, console))),
        Route(
            "/console/items/{namespace}/{item}/comments", signed_in(posted(items.comment)), methods=["POST"]
        ),
        Route("/console/memory", signed_in(memory.memory_chooser)),
        Route("/console/memory/{namespace}/{scope}/{name}", signed_in(partial(memory.memory_page, console))),
        Route(
            "/console/memory/{namespace}/{scope}/{name}", signed_in(posted(memory.remember)), methods=["POST"]
        ),
        Route("/console/memory/{namespace}/{scope}/{name}/export", signed_in(memory.memory_export)),
        Route(
            "/console/memory/{namespace}/{scope}/{name}/{entry}",
            signed_in(posted(memory.change_memory)),
            methods=["POST"],
        ),
        Route("/console/start", signed_in(partial(start.start_page, console))),
        Route("/console/start", signed_in(posted(partial(start.start, console))), methods=["POST"]),
    ]
