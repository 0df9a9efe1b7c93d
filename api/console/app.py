"""The console's routes, mounted at /console by both APIs: the embedded stack's (dev.api) and the cluster's
(api.cluster). Each request is first given to the API's `Identify`, which answers with the signed-in person's
`Session` (their Backend) or with the response to send instead (to the sign-in page, or a refusal).

    GET  /console/                              runs, filtered by namespace, phase, Team, Agent and person
    GET  /console/runs.frag?...                 the runs table alone (the page fetches it again when told)
    GET  /console/runs.changes?namespace=NS     server-sent `change` when that table may have changed
    GET  /console/runs/{ns}/{name}              a run: timeline, countdown, progress, artifacts, usage, actions
    GET  /console/runs/{ns}/{name}/events       its events (server-sent; Last-Event-ID resumes)
    GET  /console/runs/{ns}/{name}/artifacts/{artifact}   an artifact, as text or as a download, never as a page
    POST /console/runs/{ns}/{name}/{cancel|pause|resume|input}
    GET  /console/items?namespace=NS            work items; /console/items/{ns}/{id} an item's thread
    POST /console/items/{ns}/{id}/comments      a comment, as the signed-in person
    GET  /console/start?namespace=NS, POST /console/start   start a Run from an Agent or a Team
    GET  /console/static/{file}                 the style sheet and the script (no asset is fetched elsewhere)

Every page is rendered on the server with everything escaped (api.console.html), under a Content-Security-Policy
that allows this origin's script and style only (no inline script, no other host, no framing). Every POST carries
the form's CSRF token (an HMAC of the sign-in, under the console's key) and, when the browser says where it came
from (Origin, Sec-Fetch-Site), comes from this origin.
"""

import asyncio
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

import tracing
from api.budgets import Budget, Limits, OverBudget
from api.console import pages
from api.console.backend import Backend, Refused
from api.console.html import Html
from api.memory import entry_json as memory_entry_json
from api.streams import (
    KEEPALIVE_SECONDS,
    HeldStream,
    RunLook,
    parse_cursor,
    run_ending,
    sse,
    stream_budget,
    stream_events,
)
from store import InvalidItemWrite, ItemNotFound, MemoryNotFound, MemoryRefused, StoreError
from store.memory import MAX_MEMORY_ENTRIES, MEMORY_SCOPES
from workflows.signals import RunSignal
from workflows.status import not_waiting_for_input

log = logging.getLogger("ksquad.console")
STATIC = Path(__file__).parent / "static"
STATIC_TYPES = {"console.css": "text/css", "console.js": "text/javascript"}
MAX_FORM_BYTES = 256 << 10
DONE = {
    "cancel": "Cancel sent",
    "pause": "Pause sent",
    "resume": "Resume sent",
    "input": "Answer sent",
    "comment": "Comment added",
    "remembered": "Entry added",
    "saved": "Entry saved",
    "forgotten": "Entry deleted",
    "created": "Run created",
}
# The newest runs shown; more is a filter's job (the page fetches its table again when it changes).
MAX_RUNS_SHOWN = 200
MEMORY_SHOWN = 200  # a memory's newest entries on its page; search or export for the rest
CHANGE_SECONDS = 2.0  # a runs table is told of changes at most this often
ENTRIES_SHOWN = 200  # an item's newest entries on its page (older ones: ?before=<seq>)
PROGRESS_SHOWN = 200  # a run's newest progress lines on its page (the stream appends what comes after)
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
# An artifact is shown as text, or downloaded; never rendered by the browser as a page of this origin.
ARTIFACT_HEADERS = {
    "Content-Security-Policy": "sandbox; default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
TEXT_TYPES = re.compile(r"^(text/[\w.+-]+|application/(json|yaml|x-yaml|[\w.+-]+\+json|[\w.+-]+\+xml|xml))$")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a Kubernetes object name (DNS subdomain)
INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")


@dataclass
class Session:
    """A signed-in person: their backend, and what identifies the sign-in (its CSRF tokens derive from it)."""

    backend: Backend
    key: str


# The API's part: who sent this request (a Session), or what to answer instead (to the sign-in page, a 401).
Identify = Callable[[Request], Awaitable["Session | Response"]]


def page(body: Html, status: int = 200) -> HTMLResponse:
    return HTMLResponse(str(body), status_code=status, headers=SECURITY_HEADERS)


def refused(err: Refused) -> HTMLResponse:
    return page(pages.refusal_page(err.status, err.message, err.problems), err.status)


def csrf_key_of(console_key: bytes) -> bytes:
    """The key the forms' tokens are made with, derived from the console's key (which also seals cookies)."""
    return hmac.new(console_key, b"ksquad-console-csrf", hashlib.sha256).digest()


def csrf_token(key: bytes, sign_in: str) -> str:
    """The forms' token for one sign-in (`Session.key`): an HMAC under the console's key."""
    return hmac.new(key, f"console-csrf:{sign_in}".encode(), hashlib.sha256).hexdigest()


def same_origin(request: Request) -> bool:
    """What the browser says of where a POST comes from, when it says it: this origin only."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    # the host the browser asked for: this server's, or the proxy's in front of it that says so
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")} - {None}
    return urlsplit(origin).netloc in hosts


async def form_of(request: Request) -> dict[str, str] | Response:
    """The POSTed form (application/x-www-form-urlencoded, at most MAX_FORM_BYTES), first value of each field."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return page(
            pages.refusal_page(415, f"send the console's forms as they are (got {kind or 'none'})", []), 415
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return page(pages.refusal_page(413, f"the form is larger than {MAX_FORM_BYTES} bytes", []), 413)
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        return page(pages.refusal_page(400, "the form is not UTF-8", []), 400)
    return {k: v[0] for k, v in fields.items()}


def parse_inputs(text: str) -> dict[str, str]:
    """`name=value` lines (blank lines skipped); Refused (422) naming the line that is not."""
    inputs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        name = name.strip()
        if not sep or not INPUT_NAME.match(name):
            raise Refused(
                422,
                f"inputs, line {number}: write name=value, the name of letters, digits, '_', '-' or '.' "
                f"(got {line[:80]!r})",
                [f"spec.inputs: line {number}"],
            )
        inputs[name] = value.strip()
    return inputs


def run_refusals(run: dict[str, Any], may_patch: str | None) -> dict[str, str | None]:
    """Why each action cannot be taken now (None: it can): the person's rights first, then the run's state."""
    status = run.get("status") if isinstance(run.get("status"), dict) else {}
    assert isinstance(status, dict)
    phase = str(status.get("phase") or "Pending")
    paused_by_hand = phase == "Paused" and status.get("pauseReason") == "Manual"
    ended = f"the run has ended ({phase})" if phase in pages.TERMINAL else None
    return {
        "cancel": may_patch or ended or ("it is being cancelled" if phase == "Cancelling" else None),
        "pause": may_patch
        or ended
        or ("it is paused already" if phase == "Paused" else None)
        or ("it is being cancelled" if phase == "Cancelling" else None),
        "resume": may_patch
        or ended
        or (None if paused_by_hand else "only a run paused by hand resumes by hand"),
        "input": may_patch or not_waiting_for_input(status),
    }


UNBOUNDED = Limits(2**31, 2**31, 2**31)  # the embedded console: one developer


def trace_page_template() -> str | None:
    """The trace UI's page of one trace (KSQUAD_TRACE_URL, "{trace_id}" in it; the chart's tracing.traceUrl), or
    None. Only an http(s) URL becomes a link."""
    template = os.environ.get(tracing.TRACE_URL_ENV, "").strip()
    if not template:
        return None
    if not template.startswith(("https://", "http://")) or "{trace_id}" not in template:
        log.warning(
            "%s=%r is no http(s) URL with {trace_id} in it: no trace links", tracing.TRACE_URL_ENV, template
        )
        return None
    return template


def console_routes(
    identify: Identify, csrf_key: bytes, streams: Budget | None = None, requests: Budget | None = None
) -> list[Route]:
    """The routes above, each behind `identify`; a person's event streams counted in `streams` (the API's own,
    on a cluster), and the requests they have in flight in `requests` (each person's own share: one person's
    tabs polling never make another wait)."""
    streams = streams or stream_budget()
    requests = requests or Budget("console", "console requests", UNBOUNDED)
    trace_page = trace_page_template()

    Handler = Callable[[Request, Session], Awaitable[Response]]

    def signed_in(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            session = await identify(request)
            if isinstance(session, Response):
                return session
            named = [
                ("namespace", request.path_params.get("namespace")),
                ("name", request.path_params.get("name")),
                ("namespace", request.query_params.get("namespace")),
            ]
            for field, value in named:
                if value and not NAME.match(value):
                    why = f"{field} {value[:80]!r} is not a Kubernetes name"
                    return refused(Refused(422, why, [f"metadata.{field}"]))
            person = session.backend.viewer.name
            where = request.path_params.get("namespace") or request.query_params.get("namespace") or ""
            try:
                # A namespace's share is spent only by who may read its Runs (RBAC, cached): naming a namespace
                # one may not read spends one's own share and the total, never that namespace's.
                if where and await session.backend.may("list", "runs", where) is not None:
                    where = ""
                with requests.held(person, where):
                    return await handler(request, session)
            except OverBudget as err:
                answer = refused(Refused(429, str(err)))
                answer.headers["Retry-After"] = str(err.retry_after)
                return answer
            except Refused as err:
                return refused(err)
            except ItemNotFound as err:
                return refused(Refused(404, str(err)))
            except InvalidItemWrite as err:
                return refused(Refused(422, str(err), [f"{err.field}: {err}"]))
            except MemoryNotFound as err:
                return refused(Refused(404, str(err)))
            except MemoryRefused as err:
                return refused(Refused(422, str(err), [str(err)]))
            except StoreError as err:
                return refused(Refused(503, f"the store does not answer: {err}"))

        return wrapped

    def posted(handler: Callable[[Request, Session, dict[str, str]], Awaitable[Response]]) -> Handler:
        async def wrapped(request: Request, session: Session) -> Response:
            if not same_origin(request):
                return refused(Refused(403, "a console form is accepted only from the console's own pages"))
            form = await form_of(request)
            if isinstance(form, Response):
                return form
            if not hmac.compare_digest(
                form.get("csrf", "").encode(), csrf_token(csrf_key, session.key).encode()
            ):
                return refused(
                    Refused(403, "this form is stale or was not made by the console for you: reload the page")
                )
            return await handler(request, session, form)

        return wrapped

    def shell(session: Session, title: str, body: Html, request: Request, problem: str = "") -> Response:
        viewer = session.backend.viewer
        # what the last action did, by its code: a link cannot put words of its own on the page
        flash = DONE.get(request.query_params.get("done", ""), "")
        return page(pages.layout(title, viewer.name, viewer.how, body, flash, problem))

    def chosen(request: Request) -> dict[str, str]:
        return {k: request.query_params.get(k, "") for k in ("phase", "team", "agent", "person")}

    async def listed_runs(session: Session, request: Request) -> list[dict[str, Any]]:
        namespace = request.query_params.get("namespace") or None
        runs = await session.backend.runs(namespace)
        wanted = chosen(request)
        found = [r for r in runs if pages.matches(r, wanted)]
        return sorted(
            found, key=lambda r: str(r.get("metadata", {}).get("creationTimestamp", "")), reverse=True
        )

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
            pages.url("runs.frag", **query),
            pages.url("runs.changes", namespace=namespace),
        )
        return shell(session, "Runs", body, request)

    async def runs_fragment(request: Request, session: Session) -> Response:
        return page(shown(await listed_runs(session, request)))

    async def runs_changes(request: Request, session: Session) -> Response:
        """Server-sent `change` when the runs table may have changed, looked at every CHANGE_SECONDS (a busy
        namespace costs a tab what polling did, a quiet one nothing); `end` with the reason once the person may no
        longer list those Runs. One of the person's event streams (the streams budget)."""
        namespace = request.query_params.get("namespace") or None
        backend = session.backend
        seen = await backend.runs_version(namespace)  # Refused: before a stream is held
        held = HeldStream(streams, backend.viewer.name, namespace or "")  # OverBudget: 429

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

    async def run_page(request: Request, session: Session) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        backend = session.backend
        run = await backend.run(namespace, name)
        uid = str(run.get("metadata", {}).get("uid", ""))
        # Every phase (a run has tens), the newest progress, and the stream from the newest event on.
        phases = await backend.store.events(uid, kind="phase") if uid else []
        newest = await backend.store.events(uid, limit=PROGRESS_SHOWN, newest=True) if uid else []
        progress = [e for e in newest if e.kind != "phase"]
        if uid:
            # Read again after the log: the bridge writes a phase to the status before it logs it, so a status read
            # now is at least as new as the stream's starting point. Read only before, a phase logged in between
            # was past the stream's start yet absent from the page, which then showed the phase before until the
            # next one (a run followed live missed its Running).
            again = await backend.run(namespace, name)
            if str(again.get("metadata", {}).get("uid", "")) == uid:
                run = again
        may_patch = await backend.may("patch", "runs", namespace, name)
        workflow = (run.get("status") or {}).get("workflow") or {}
        attempts = int((run.get("status") or {}).get("attempt") or 0)
        traces = (
            [(n, tracing.trace_url(trace_page, uid, n)) for n in range(1, attempts + 1)] if trace_page else []
        )
        body = pages.run_page(
            run,
            phases,
            progress,
            run_refusals(run, may_patch),
            csrf_token(csrf_key, session.key),
            backend.temporal_url(str(workflow.get("id") or f"{namespace}/{name}")),
            newest[-1].seq if newest else 0,
            traces,
        )
        return shell(session, f"Run {namespace}/{name}", body, request)

    async def run_events(request: Request, session: Session) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        backend = session.backend
        run = await backend.run(namespace, name)
        uid = str(run["metadata"]["uid"])
        try:
            after = parse_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
        except ValueError as err:
            raise Refused(422, str(err)) from None
        held = HeldStream(streams, backend.viewer.name, namespace)  # OverBudget: 429

        async def look() -> RunLook | None:
            try:
                current = await backend.run(namespace, name)
            except Refused as err:
                if err.status in (401, 403):
                    return RunLook(None, "", forbidden=True)
                return RunLook(None, "") if err.status == 404 else None
            status = current.get("status")
            phase = str(status.get("phase") or "") if isinstance(status, dict) else ""
            return RunLook(str(current.get("metadata", {}).get("uid", "")), phase)

        chunks = stream_events(backend.store, uid, after, request.is_disconnected, run_ending(uid, look))
        return StreamingResponse(
            held.counted(chunks),
            media_type="text/event-stream",
            headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"},
        )

    async def artifact(request: Request, session: Session) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        wanted = request.path_params["artifact"]
        run = await session.backend.run(namespace, name)
        found = await session.backend.store.artifact(str(run["metadata"]["uid"]), wanted)
        if found is None:
            raise Refused(404, f"run {namespace}/{name} has no artifact {wanted!r}")
        media_type, content = found
        kind = (media_type or "").split(";")[0].strip().lower()
        if TEXT_TYPES.match(kind) or not kind:
            try:
                text = content.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None:
                return Response(text, media_type="text/plain; charset=utf-8", headers=ARTIFACT_HEADERS)
        filename = re.sub(r"[^A-Za-z0-9._-]", "_", wanted.rsplit("/", 1)[-1]) or "artifact"
        return Response(
            content,
            media_type="application/octet-stream",
            headers={**ARTIFACT_HEADERS, "Content-Disposition": f'attachment; filename="{filename}"'},
        )

    async def act(request: Request, session: Session, form: dict[str, str]) -> Response:
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        action = request.path_params["action"]
        if action not in ("cancel", "pause", "resume", "input"):
            raise Refused(404, f"no action {action!r}: cancel, pause, resume or input")
        backend = session.backend
        run = await backend.run(namespace, name)
        rights = await backend.may("patch", "runs", namespace, name)
        if rights:
            raise Refused(403, f"cannot {action} {namespace}/{name}: {rights}")
        why = run_refusals(run, None)[action]
        if why:
            raise Refused(409, f"cannot {action} {namespace}/{name}: {why}")
        text = form.get("text", "") if action == "input" else form.get("reason", "")
        if action == "input" and not text.strip():
            raise Refused(422, "the answer is empty: write what the agent asked for", ["text: required"])
        await backend.signal(namespace, name, RunSignal(action), text)
        return RedirectResponse(pages.url("runs", namespace, name, done=action), status_code=303)

    async def items_page(request: Request, session: Session) -> Response:
        backend = session.backend
        namespaces = await backend.namespaces()
        namespace = request.query_params.get("namespace") or (namespaces[0] if len(namespaces) == 1 else "")
        items = []
        if namespace:
            why = await backend.may("list", "workitems", namespace)
            if why:
                raise Refused(403, why)
            items = await backend.store.items(namespace, limit=500)
        return shell(session, "Work items", pages.items_page(namespace, namespaces, items), request)

    async def item_page(request: Request, session: Session) -> Response:
        namespace, item_id = request.path_params["namespace"], request.path_params["item"]
        backend = session.backend
        why = await backend.may("get", "workitems", namespace, item_id)
        if why:
            raise Refused(403, why)
        item = await backend.store.item(namespace, item_id)
        try:
            before = parse_cursor(request.query_params.get("before")) or None
        except ValueError as err:
            raise Refused(422, str(err).replace("Last-Event-ID", "before")) from None
        # The newest entries first (the ones people come for), a page at a time: older ones a link away.
        entries = await backend.store.item_events(
            namespace, item_id, before=before, limit=ENTRIES_SHOWN, newest=True
        )
        older = entries[0].seq if len(entries) == ENTRIES_SHOWN and entries[0].seq > 1 else None
        try:
            runs = [
                r
                for r in await backend.runs(namespace)
                if (r.get("spec") or {}).get("workItemRef") == item_id
            ]
        except Refused:
            runs = []  # who may read the item but not the namespace's Runs sees the thread alone
        body = pages.item_page(
            item,
            entries,
            runs,
            csrf_token(csrf_key, session.key),
            await backend.may("update", "workitems", namespace, item_id),
            older,
        )
        return shell(session, f"Item {namespace}/{item_id}", body, request)

    async def comment(request: Request, session: Session, form: dict[str, str]) -> Response:
        namespace, item_id = request.path_params["namespace"], request.path_params["item"]
        backend = session.backend
        why = await backend.may("update", "workitems", namespace, item_id)
        if why:
            raise Refused(403, why)
        text = form.get("body", "")
        if not text.strip():
            raise Refused(422, "the comment is empty", ["body: required"])
        await backend.store.comment(namespace, item_id, text, backend.author(), None, None)
        return RedirectResponse(pages.url("items", namespace, item_id, done="comment"), status_code=303)

    async def memory_chooser(request: Request, session: Session) -> Response:
        backend = session.backend
        namespaces = await backend.namespaces()
        namespace = request.query_params.get("namespace") or (namespaces[0] if len(namespaces) == 1 else "")
        squads: list[tuple[str, str]] = []
        if namespace:
            for scope in MEMORY_SCOPES:
                squads += [(scope, o["metadata"]["name"]) for o in await backend.objects(scope, namespace)]
        return shell(session, "Squad memory", pages.memory_chooser(namespace, namespaces, squads), request)

    async def memory_allowed(session: Session, request: Request, verb: str) -> tuple[str, str, str]:
        params = request.path_params
        namespace, scope, name = params["namespace"], params["scope"], params["name"]
        if scope not in MEMORY_SCOPES:
            raise Refused(404, f"no memory of {scope!r}: a Team's (teams) or a Project's (projects)")
        why = await session.backend.may(verb, f"{scope}/memory", namespace, name)
        if why:
            raise Refused(403, why)
        return namespace, scope, name

    async def memory_page(request: Request, session: Session) -> Response:
        namespace, scope, name = await memory_allowed(session, request, "get")
        query = request.query_params.get("q", "")[:200]
        entries = await session.backend.store.memory(namespace, scope, name, query, limit=MEMORY_SHOWN)
        refusal = await session.backend.may("update", f"{scope}/memory", namespace, name)
        body = pages.memory_page(
            namespace, scope, name, entries, query, csrf_token(csrf_key, session.key), refusal
        )
        return shell(session, f"Memory of {name}", body, request)

    async def memory_export(request: Request, session: Session) -> Response:
        namespace, scope, name = await memory_allowed(session, request, "get")
        found = await session.backend.store.memory(namespace, scope, name, limit=MAX_MEMORY_ENTRIES)
        lines = "".join(
            json.dumps({"namespace": namespace, "scope": scope, "name": name, **memory_entry_json(e)}) + "\n"
            for e in reversed(found)
        )
        disposition = f'attachment; filename="{namespace}-{scope}-{name}-memory.jsonl"'
        return Response(
            lines, media_type="application/x-ndjson", headers={"Content-Disposition": disposition}
        )

    async def remember(request: Request, session: Session, form: dict[str, str]) -> Response:
        namespace, scope, name = await memory_allowed(session, request, "update")
        await session.backend.store.remember(
            namespace, scope, name, form.get("kind", "fact"), form.get("text", ""), session.backend.author()
        )
        return RedirectResponse(
            pages.url("memory", namespace, scope, name, done="remembered"), status_code=303
        )

    async def change_memory(request: Request, session: Session, form: dict[str, str]) -> Response:
        namespace, scope, name = await memory_allowed(session, request, "update")
        entry = request.path_params["entry"]
        if not entry.isdigit():
            raise Refused(404, f"no entry {entry[:40]!r}: entries are numbered")
        store, editor = session.backend.store, session.backend.author().user or ""
        if form.get("do") == "delete":
            await store.forget_memory_entry(namespace, scope, name, int(entry))
            done = "forgotten"
        else:
            await store.edit_memory(
                namespace, scope, name, int(entry), form.get("kind", "fact"), form.get("text", ""), editor
            )
            done = "saved"
        return RedirectResponse(pages.url("memory", namespace, scope, name, done=done), status_code=303)

    async def start_form(
        request: Request, session: Session, values: dict[str, str] | None = None, problem: str = ""
    ) -> Response:
        backend = session.backend
        namespaces = await backend.namespaces()
        namespace = (
            (values or {}).get("namespace")
            or request.query_params.get("namespace")
            or (namespaces[0] if len(namespaces) == 1 else "")
        )
        agents: list[str] = []
        teams: list[str] = []
        refusal = None
        if namespace:
            refusal = await backend.may("create", "runs", namespace)
            agents = sorted(str(a["metadata"]["name"]) for a in await backend.objects("agents", namespace))
            teams = sorted(str(t["metadata"]["name"]) for t in await backend.objects("teams", namespace))
        body = pages.start_page(
            namespace, namespaces, agents, teams, csrf_token(csrf_key, session.key), values or {}, refusal
        )
        return shell(session, "Start a run", body, request, problem)

    async def start_page(request: Request, session: Session) -> Response:
        return await start_form(request, session)

    async def start(request: Request, session: Session, form: dict[str, str]) -> Response:
        namespace = form.get("namespace", "")
        kind, _, target = form.get("target", "").partition(":")
        try:
            if not NAME.match(namespace):
                raise Refused(422, f"namespace {namespace!r} is not a namespace name", ["metadata.namespace"])
            if kind not in ("agent", "team") or not target:
                raise Refused(422, "choose an Agent or a Team to start the run with", ["spec.agents"])
            name = form.get("name", "").strip() or f"{target}-{secrets.token_hex(3)}"[:63]
            if not NAME.match(name):
                raise Refused(
                    422,
                    f"run name {name!r}: lower-case letters, digits, '-' and '.', starting and ending with a "
                    "letter or digit",
                    ["metadata.name"],
                )
            spec: dict[str, Any] = {"agents": [target]} if kind == "agent" else {"teamRef": target}
            inputs = parse_inputs(form.get("inputs", ""))
            if inputs:
                spec["inputs"] = inputs
            if form.get("workItemRef", "").strip():
                spec["workItemRef"] = form["workItemRef"].strip()
            manifest = {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Run",
                "metadata": {"name": name, "namespace": namespace},
                "spec": spec,
            }
            await session.backend.create_run(manifest)
        except Refused as err:
            detail = f"{err.message}" + (f" ({'; '.join(err.problems)})" if err.problems else "")
            return await start_form(request, session, form, problem=detail)
        return RedirectResponse(pages.url("runs", namespace, name, done="created"), status_code=303)

    async def static(request: Request) -> Response:
        name = request.path_params["file"]
        if name not in STATIC_TYPES:
            return Response("not found", status_code=404, media_type="text/plain")
        return FileResponse(
            STATIC / name,
            media_type=STATIC_TYPES[name],
            headers={"X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"},
        )

    return [
        Route("/console/static/{file}", static),
        Route("/console/", signed_in(runs_page)),
        Route("/console/runs.frag", signed_in(runs_fragment)),
        Route("/console/runs.changes", signed_in(runs_changes)),
        Route("/console/runs/{namespace}/{name}", signed_in(run_page)),
        Route("/console/runs/{namespace}/{name}/events", signed_in(run_events)),
        Route("/console/runs/{namespace}/{name}/artifacts/{artifact:path}", signed_in(artifact)),
        Route("/console/runs/{namespace}/{name}/{action}", signed_in(posted(act)), methods=["POST"]),
        Route("/console/items", signed_in(items_page)),
        Route("/console/items/{namespace}/{item}", signed_in(item_page)),
        Route("/console/items/{namespace}/{item}/comments", signed_in(posted(comment)), methods=["POST"]),
        Route("/console/memory", signed_in(memory_chooser)),
        Route("/console/memory/{namespace}/{scope}/{name}", signed_in(memory_page)),
        Route("/console/memory/{namespace}/{scope}/{name}", signed_in(posted(remember)), methods=["POST"]),
        Route("/console/memory/{namespace}/{scope}/{name}/export", signed_in(memory_export)),
        Route(
            "/console/memory/{namespace}/{scope}/{name}/{entry}",
            signed_in(posted(change_memory)),
            methods=["POST"],
        ),
        Route("/console/start", signed_in(start_page)),
        Route("/console/start", signed_in(posted(start)), methods=["POST"]),
    ]
