"""Squad memory over HTTP (store.memory), the same routes on the cluster's API and the embedded one; `{scope}` is
`teams` or `projects`, `{name}` the Team's or Project's:

    GET    /memory/{namespace}/{scope}/{name}[?q=TEXT&before=ID&limit=N]   entries, newest first   (verb get)
    GET    /memory/{namespace}/{scope}/{name}/export   every entry, oldest first, as JSON lines     (verb get)
    POST   /memory/{namespace}/{scope}/{name}       {"kind": fact|decision|link, "text"}: a new entry  (verb update)
    PUT    /memory/{namespace}/{scope}/{name}/{id}  {"kind", "text"}: a person's edit               (verb update)
    DELETE /memory/{namespace}/{scope}/{name}/{id}  a person deletes an entry                    (verb update)

People are authorised by their API (`Authorize`: a SubjectAccessReview on `teams/memory` or `projects/memory` in
group ksquad.io, in the namespace, for that name, on a cluster; the API token embedded) and write as themselves.
An attempt's agent, with its attempt's token, reads and adds to the memories of its Run's Team and Project alone
(the token names them: the worker reads them from the Run's sealed spec), while its fence is current, as its Run's
attempt for the person who started the Run; it edits and deletes nothing. Answers: 404 for an unknown entry, 409
for a superseded attempt, 422 naming the field, 503 when the store does not answer.
"""

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from api.errors import error
from api.items import Writer, attempt_token, attempt_writer, json_body
from store import (
    MemoryEntry,
    MemoryNotFound,
    MemoryRefused,
    StaleFence,
    Store,
    StoreError,
)
from store.memory import MAX_MEMORY_ENTRIES, MAX_MEMORY_PAGE, MEMORY_SCOPES

PREFIX = "/memory/"
# (request, verb, namespace, scope, name) -> who the caller writes as, or the refusal to send instead.
Authorize = Callable[[Request, str, str, str, str], Awaitable[Writer | Response]]


def with_attempt_tokens(
    store: Store,
    key: bytes | None,
    people: Authorize,
    over_rate: Callable[..., Response | None] | None = None,
) -> Authorize:
    """An API's authorisation of people, plus an attempt's token (agent.callers.item_token): the memories its
    token names, read and added to while its fence is current, as that attempt."""

    async def authorize(
        request: Request, verb: str, namespace: str, scope: str, name: str
    ) -> Writer | Response:
        access = attempt_token(request, key)
        if access is None:
            return await people(request, verb, namespace, scope, name)
        if isinstance(access, Response):
            return access
        if access.namespace != namespace or f"{scope}/{name}" not in access.memory:
            named = ", ".join(access.memory) or "none"
            return error(
                403,
                f"the token of {access.run} attempt {access.attempt} reaches the memories of its Run's Team and "
                f"Project only ({named} in {access.namespace})",
            )
        refusal = over_rate(person=access.run, namespace=namespace, total="") if over_rate else None
        if refusal is not None:
            return refusal
        writer = await attempt_writer(store, access)
        if writer is None:
            return error(
                409, f"{access.run} attempt {access.attempt} (fence {access.fence}) is no longer current"
            )
        return writer

    return authorize


def entry_json(entry: MemoryEntry) -> dict[str, Any]:
    return {
        "id": entry.id,
        "kind": entry.kind,
        "text": entry.text,
        "author": {k: v for k, v in vars(entry.author).items() if v is not None},
        "fence": entry.fence,
        "edited_by": entry.edited_by,
        "created_at": entry.created_at.isoformat(),
        "updated_at": entry.updated_at.isoformat(),
    }


def memory_routes(store: Store, authorize: Authorize) -> list[Route]:
    Handler = Callable[[Request, Writer, str, str, str], Awaitable[Response]]

    def guarded(
        verb: str, handler: Handler, people_only: bool = False
    ) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            params = request.path_params
            namespace, scope, name = params["namespace"], params["scope"], params["name"]
            if scope not in MEMORY_SCOPES:
                return error(404, f"no memory of {scope!r}: a Team's (teams) or a Project's (projects)")
            try:
                writer = await authorize(request, verb, namespace, scope, name)
                if isinstance(writer, Response):
                    return writer
                if people_only and writer.holder is not None:
                    return error(403, "an agent adds to its squad's memory; it edits and deletes nothing")
                return await handler(request, writer, namespace, scope, name)
            except MemoryNotFound as err:
                return error(404, str(err))
            except MemoryRefused as err:
                return error(422, str(err), [str(err)])
            except StaleFence as err:
                return error(409, f"this attempt is no longer current: {err}")
            except StoreError as err:
                return error(503, f"the store does not answer: {err}")

        return wrapped

    async def entry_fields(request: Request) -> dict[str, str] | Response:
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        if (
            not isinstance(body, dict)
            or set(body) - {"kind", "text"}
            or not isinstance(body.get("text"), str)
        ):
            return error(
                422, 'send {"kind": "fact" | "decision" | "link", "text": "..."}', ["text: required"]
            )
        kind = body.get("kind", "fact")
        if not isinstance(kind, str):
            return error(422, "kind: a string", ["kind: fact, decision or link"])
        return {"kind": kind, "text": body["text"]}

    def entry_id(request: Request) -> int | Response:
        text = request.path_params["entry"]
        return int(text) if text.isdigit() else error(404, f"no entry {text[:40]!r}: entries are numbered")

    async def read(request: Request, _writer: Writer, namespace: str, scope: str, name: str) -> Response:
        query = request.query_params
        limit, before = query.get("limit", "100"), query.get("before", "0")
        if not (limit.isdigit() and 1 <= int(limit) <= MAX_MEMORY_PAGE):
            return error(422, f"limit: a number of entries from 1 to {MAX_MEMORY_PAGE} (got {limit[:40]!r})")
        if not before.isdigit():
            return error(422, f"before: an entry's number (got {before[:40]!r})")
        found = await store.memory(namespace, scope, name, query.get("q", "")[:200], int(before), int(limit))
        return JSONResponse({"entries": [entry_json(e) for e in found]})

    async def export(request: Request, _writer: Writer, namespace: str, scope: str, name: str) -> Response:
        found = await store.memory(namespace, scope, name, limit=MAX_MEMORY_ENTRIES)
        lines = [
            json.dumps({"namespace": namespace, "scope": scope, "name": name, **entry_json(e)}) + "\n"
            for e in reversed(found)
        ]
        filename = f"{namespace}-{scope}-{name}-memory.jsonl"
        return StreamingResponse(
            iter(lines),
            media_type="application/x-ndjson",
            headers={"Content-Disposition": f'attachment; filename="{filename}"'},
        )

    async def add(request: Request, writer: Writer, namespace: str, scope: str, name: str) -> Response:
        fields = await entry_fields(request)
        if isinstance(fields, Response):
            return fields
        entry = await store.remember(
            namespace,
            scope,
            name,
            fields["kind"],
            fields["text"],
            writer.author,
            writer.holder,
            writer.fence,
            writer.claim,
        )
        return JSONResponse(entry_json(entry), status_code=201)

    async def edit(request: Request, writer: Writer, namespace: str, scope: str, name: str) -> Response:
        number = entry_id(request)
        if isinstance(number, Response):
            return number
        fields = await entry_fields(request)
        if isinstance(fields, Response):
            return fields
        entry = await store.edit_memory(
            namespace, scope, name, number, fields["kind"], fields["text"], writer.author.user or ""
        )
        return JSONResponse(entry_json(entry))

    async def delete(request: Request, writer: Writer, namespace: str, scope: str, name: str) -> Response:
        number = entry_id(request)
        if isinstance(number, Response):
            return number
        await store.forget_memory_entry(namespace, scope, name, number)
        return Response(status_code=204)

    base = "/memory/{namespace}/{scope}/{name}"
    return [
        Route(base, guarded("get", read), methods=["GET"]),
        Route(base, guarded("update", add), methods=["POST"]),
        Route(f"{base}/export", guarded("get", export), methods=["GET"]),
        Route(f"{base}/{{entry}}", guarded("update", edit, people_only=True), methods=["PUT"]),
        Route(f"{base}/{{entry}}", guarded("update", delete, people_only=True), methods=["DELETE"]),
    ]
