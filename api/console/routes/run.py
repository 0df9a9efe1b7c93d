"""A run's handlers: its page (timeline, progress, actions and why not, links to its workflow and traces), its
events (server-sent; Last-Event-ID resumes), its artifacts (as text or a download, never as a page of this
origin), and the actions (cancel, pause, resume, answer) the person may take on it now."""

import logging
import os
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

import tracing
from api.console.backend import Refused
from api.console.guard import SECURITY_HEADERS, Session
from api.console.pages import run as pages
from api.console.pages.layout import TERMINAL, url
from api.console.routes.context import Console, shell
from api.streams import HeldStream, RunLook, parse_cursor, run_ending, stream_events
from workflows.signals import RunSignal
from workflows.status import not_waiting_for_input

log = logging.getLogger("ksquad.console")
PROGRESS_SHOWN = 200  # a run's newest progress lines on its page (the stream appends what comes after)
# An artifact is shown as text, or downloaded; never rendered by the browser as a page of this origin.
ARTIFACT_HEADERS = {
    "Content-Security-Policy": "sandbox; default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}
TEXT_TYPES = re.compile(r"^(text/[\w.+-]+|application/(json|yaml|x-yaml|[\w.+-]+\+json|[\w.+-]+\+xml|xml))$")


def run_refusals(run: dict[str, Any], may_patch: str | None) -> dict[str, str | None]:
    """Why each action cannot be taken now (None: it can): the person's rights first, then the run's state."""
    status = run.get("status") if isinstance(run.get("status"), dict) else {}
    assert isinstance(status, dict)
    phase = str(status.get("phase") or "Pending")
    paused_by_hand = phase == "Paused" and status.get("pauseReason") == "Manual"
    ended = f"the run has ended ({phase})" if phase in TERMINAL else None
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


async def run_page(console: Console, request: Request, session: Session) -> Response:
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
        [(n, tracing.trace_url(console.trace_page, uid, n)) for n in range(1, attempts + 1)]
        if console.trace_page
        else []
    )
    body = pages.run_page(
        run,
        phases,
        progress,
        run_refusals(run, may_patch),
        console.csrf(session),
        backend.temporal_url(str(workflow.get("id") or f"{namespace}/{name}")),
        newest[-1].seq if newest else 0,
        traces,
    )
    return shell(session, f"Run {namespace}/{name}", body, request)


async def run_events(console: Console, request: Request, session: Session) -> Response:
    namespace, name = request.path_params["namespace"], request.path_params["name"]
    backend = session.backend
    run = await backend.run(namespace, name)
    uid = str(run["metadata"]["uid"])
    try:
        after = parse_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
    except ValueError as err:
        raise Refused(422, str(err)) from None
    held = HeldStream(console.streams, backend.viewer.name, namespace)  # OverBudget: 429

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
    return RedirectResponse(url("runs", namespace, name, done=action), status_code=303)
