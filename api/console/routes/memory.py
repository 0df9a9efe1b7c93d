"""Squad memory's handlers: the namespace's Teams and Projects, one's memory (the newest MEMORY_SHOWN, or those
holding a search), its export (JSON lines), and adding, editing and deleting entries, as who may."""

import json

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from api.console.backend import Refused
from api.console.guard import Session
from api.console.pages import memory as pages
from api.console.pages.layout import url
from api.console.routes.context import Console, shell
from api.memory import entry_json as memory_entry_json
from store.memory import MAX_MEMORY_ENTRIES, MEMORY_SCOPES

MEMORY_SHOWN = 200  # a memory's newest entries on its page; search or export for the rest


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


async def memory_page(console: Console, request: Request, session: Session) -> Response:
    namespace, scope, name = await memory_allowed(session, request, "get")
    query = request.query_params.get("q", "")[:200]
    entries = await session.backend.store.memory(namespace, scope, name, query, limit=MEMORY_SHOWN)
    refusal = await session.backend.may("update", f"{scope}/memory", namespace, name)
    body = pages.memory_page(namespace, scope, name, entries, query, console.csrf(session), refusal)
    return shell(session, f"Memory of {name}", body, request)


async def memory_export(request: Request, session: Session) -> Response:
    namespace, scope, name = await memory_allowed(session, request, "get")
    found = await session.backend.store.memory(namespace, scope, name, limit=MAX_MEMORY_ENTRIES)
    lines = "".join(
        json.dumps({"namespace": namespace, "scope": scope, "name": name, **memory_entry_json(e)}) + "\n"
        for e in reversed(found)
    )
    disposition = f'attachment; filename="{namespace}-{scope}-{name}-memory.jsonl"'
    return Response(lines, media_type="application/x-ndjson", headers={"Content-Disposition": disposition})


async def remember(request: Request, session: Session, form: dict[str, str]) -> Response:
    namespace, scope, name = await memory_allowed(session, request, "update")
    await session.backend.store.remember(
        namespace, scope, name, form.get("kind", "fact"), form.get("text", ""), session.backend.author()
    )
    return RedirectResponse(url("memory", namespace, scope, name, done="remembered"), status_code=303)


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
    return RedirectResponse(url("memory", namespace, scope, name, done=done), status_code=303)
