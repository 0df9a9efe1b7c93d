"""Work items' handlers: a namespace's list, an item's page (its thread, the newest ENTRIES_SHOWN entries first,
older ones a link away; the Runs that worked it), and a comment, as the signed-in person."""

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from api.console.backend import Refused
from api.console.guard import Session
from api.console.pages import items as pages
from api.console.pages.layout import url
from api.console.routes.context import Console, shell
from api.streams import parse_cursor

ENTRIES_SHOWN = 200  # an item's newest entries on its page (older ones: ?before=<seq>)


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


async def item_page(console: Console, request: Request, session: Session) -> Response:
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
            r for r in await backend.runs(namespace) if (r.get("spec") or {}).get("workItemRef") == item_id
        ]
    except Refused:
        runs = []  # who may read the item but not the namespace's Runs sees the thread alone
    body = pages.item_page(
        item,
        entries,
        runs,
        console.csrf(session),
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
    return RedirectResponse(url("items", namespace, item_id, done="comment"), status_code=303)
