"""Work items over HTTP for people, the same routes on the cluster's API and the embedded one: each caller is
authorised by its API (`Authorize`: a SubjectAccessReview on `workitems.ksquad.io` in the namespace on a cluster,
the API token embedded) and writes as itself.

    GET  /items/{namespace}[?state=S&after=ID&limit=N]   the namespace's items, by id          (verb list)
    POST /items/{namespace}            {"id", "title", "body"?, "labels"?}: a new item, open  (verb create)
    GET  /items/{namespace}/{id}       the item                                               (verb get)
    GET  /items/{namespace}/{id}/entries[?after=N][&before=N][&newest=K]   its entries after N (and before N), in
                                       order, a page at a time; with newest, the newest K of them (verb get)
    GET  /items/{namespace}/{id}/events   server-sent events: the item's entries in order (created, comment,
                                       state, artifact); `Last-Event-ID` (or ?after=N) resumes   (verb get)
    POST /items/{namespace}/{id}/comments   {"body"}: a comment                               (verb update)
    POST /items/{namespace}/{id}/state      {"state", "note"?}: open, in-progress, blocked, done (verb update)

Answers: 404 for an unknown item, 409 for an id taken, 422 naming the field for a write the record refuses
(too long, an unknown state, a change the item's state does not allow), 503 when the store does not answer.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agent.callers import ITEM_TOKEN_PREFIX, ItemAccess, verify_item_token
from api.budgets import Budget, OverBudget
from api.errors import error, too_many
from api.streams import (
    KEEPALIVE_SECONDS,
    PAGE,
    RUN_CHECK_SECONDS,
    HeldStream,
    catching_up,
    feeds_of,
    parse_cursor,
    sse,
    stream_budget,
)
from store import (
    MAX_PAGE,
    Author,
    Holder,
    InvalidItemWrite,
    ItemEvent,
    ItemExists,
    ItemNotFound,
    StaleFence,
    Store,
    StoreError,
    WorkItem,
    work_item_key,
)


@dataclass(frozen=True)
class Writer:
    """Who a request writes as: a person, or an agent's attempt under its claim's fence (`holder`, `fence`)."""

    author: Author
    holder: Holder | None = None
    fence: int | None = None
    claim: str | None = (
        None  # the claim `fence` is of (store.work_item_key), None for a Run fenced by attempt
    )


# (request, verb, namespace, item id or None) -> who the caller writes as, or the refusal to send instead.
Authorize = Callable[[Request, str, str, str | None], Awaitable[Writer | Response]]
AGENT_VERBS = frozenset(
    {"get", "update"}
)  # an attempt reads and writes its own item; it lists and creates none


def with_item_tokens(
    store: Store,
    key: bytes | None,
    people: Authorize,
    over_rate: Callable[..., Response | None] | None = None,
) -> Authorize:
    """An API's authorisation, plus an attempt's item token (agent.callers.item_token, made by the worker with
    `key`): that token reads and writes its Run's item alone, as that attempt, while its fence is current. Its
    requests are counted as its Run's (`over_rate`: 429 past their share) before they cost a store query."""

    async def authorize(request: Request, verb: str, namespace: str, item: str | None) -> Writer | Response:
        access = attempt_token(request, key)
        if access is None:
            return await people(request, verb, namespace, item)
        if isinstance(access, Response):
            return access
        if verb not in AGENT_VERBS or (access.namespace, access.item) != (namespace, item):
            return error(
                403,
                f"the token of {access.run} attempt {access.attempt} reaches its work item "
                f"{access.namespace}/{access.item} only",
            )
        refusal = over_rate(person=access.run, namespace=namespace, total="") if over_rate else None
        if refusal is not None:
            return refusal
        writer = await attempt_writer(store, access)
        if writer is None:
            return error(
                409, f"{access.run} attempt {access.attempt} no longer holds {namespace}/{access.item}"
            )
        return writer

    return authorize


def attempt_token(request: Request, key: bytes | None) -> ItemAccess | Response | None:
    """The attempt's token the request carries (agent.callers.item_token, made by the worker with `key`), checked:
    None when it carries none (a person's request), 401 when it is altered, expired or of another key."""
    token = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    if not token.startswith(ITEM_TOKEN_PREFIX):
        return None
    access = verify_item_token(key, token) if key is not None else None
    if access is None:
        return error(
            401, "this attempt's token is not valid here (altered, expired, or made with another key)"
        )
    return access


async def attempt_writer(store: Store, access: ItemAccess) -> Writer | None:
    """Who the attempt writes as while its fence is current (its work item's claim, or the attempt of a Run without
    one), for the person who started the Run (the claim's; else its progress events': the token names nobody);
    None once it is fenced off."""
    holder = Holder(uid=access.uid, run=access.run, triggered_by=None)
    if access.item:
        ref: str | None = work_item_key(access.namespace, access.item)
        assert ref is not None
        claim = await store.claim_of(ref)
        if claim is None or (claim[0].uid, claim[1]) != (access.uid, access.fence):
            return None
        person = claim[0].triggered_by
    else:
        ref = None
        if not await store.fence_is_current(holder, access.fence, None):
            return None
        person = await store.triggered_by_of(access.uid)
    author = Author(user=person, run=access.run, run_uid=access.uid, attempt=access.attempt)
    return Writer(author, Holder(uid=access.uid, run=access.run, triggered_by=person), access.fence, ref)


Handler = Callable[[Request], Awaitable[Response]]
MAX_BODY_BYTES = 256 * 1024  # a comment or an item's body is at most 64 KiB of text (store.work_items)


def item_json(item: WorkItem) -> dict[str, Any]:
    found = asdict(item)
    found.update(
        labels=list(item.labels),
        created_at=item.created_at.isoformat(),
        updated_at=item.updated_at.isoformat(),
    )
    return found


def entry_json(entry: ItemEvent) -> dict[str, Any]:
    return {
        "seq": entry.seq,
        "kind": entry.kind,
        "body": entry.body,
        "data": entry.data,
        "author": {k: v for k, v in asdict(entry.author).items() if v is not None},
        "fence": entry.fence,
        "at": entry.at.isoformat(),
    }


async def json_body(request: Request, limit: int = MAX_BODY_BYTES) -> Any:
    """The body as JSON, or the refusal: 415 unless sent as application/json, 413 past `limit` bytes (read no
    further), 400 for what is not JSON. The media type is not a formality: behind an authenticating proxy that
    adds the person's token from its cookie, another site's form could post here as them; a browser sends
    application/json across sites only after a CORS preflight, which this API never answers."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        return error(415, f"send the body as application/json (got {kind or 'no Content-Type'})")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return error(413, f"the body is larger than {limit} bytes")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        return error(400, f"the body is not JSON: {err}")


def item_routes(store: Store, authorize: Authorize, streams: Budget | None = None) -> list[Route]:
    """The routes above; their event streams counted in `streams` (the API's, with its Runs' streams)."""
    streams = streams or stream_budget()

    def guarded(verb: str, handler: Callable[[Request, Writer], Awaitable[Response]]) -> Handler:
        async def wrapped(request: Request) -> Response:
            namespace = request.path_params["namespace"]
            try:
                writer = await authorize(request, verb, namespace, request.path_params.get("item"))
                if isinstance(writer, Response):
                    return writer
                return await handler(request, writer)
            except ItemNotFound as err:
                return error(404, str(err))
            except ItemExists as err:
                return error(409, str(err))
            except InvalidItemWrite as err:
                return error(422, str(err), [f"{err.field}: {err}"])
            except StaleFence as err:
                return error(409, str(err))
            except StoreError as err:
                return error(503, f"the store does not answer: {err}")

        return wrapped

    async def fields(request: Request, *names: str) -> dict[str, Any] | Response:
        body = await json_body(request)
        if isinstance(body, Response):
            return body
        if not isinstance(body, dict):
            return error(400, "the body must be a JSON object")
        unknown = sorted(set(body) - set(names))
        if unknown:
            return error(400, f"unknown fields {unknown}: this route takes {', '.join(names)}")
        wrong = [n for n in names if n in body and n != "labels" and not isinstance(body[n], str)]
        if wrong or not isinstance(body.get("labels", []), list):
            return error(
                400, f"{(wrong or ['labels'])[0]} has the wrong type", [f"{n}: a string" for n in wrong]
            )
        return body

    async def list_items(request: Request, _writer: Writer) -> Response:
        query = request.query_params
        text = query.get("limit", "100")
        if not (text.isdigit() and 1 <= int(text) <= MAX_PAGE):
            return error(422, f"limit: a number of items from 1 to {MAX_PAGE} (got {text[:40]!r})")
        limit = int(text)
        items = await store.items(
            request.path_params["namespace"],
            state=query.get("state"),
            after=query.get("after", ""),
            limit=limit,
        )
        return JSONResponse({"items": [item_json(i) for i in items]})

    async def create_item(request: Request, writer: Writer) -> Response:
        body = await fields(request, "id", "title", "body", "labels")
        if isinstance(body, Response):
            return body
        if "id" not in body or "title" not in body:
            return error(422, "an item needs an id and a title", ["id: required", "title: required"])
        if not all(isinstance(label, str) for label in body.get("labels", [])):
            return error(400, "labels must be strings")
        item = await store.create_item(
            request.path_params["namespace"],
            body["id"],
            title=body["title"],
            body=body.get("body", ""),
            labels=tuple(body.get("labels", [])),
            created_by=writer.author.user or "",
        )
        return JSONResponse(item_json(item), status_code=201)

    async def get_item(request: Request, _writer: Writer) -> Response:
        item = await store.item(request.path_params["namespace"], request.path_params["item"])
        return JSONResponse(item_json(item))

    async def comment(request: Request, writer: Writer) -> Response:
        body = await fields(request, "body")
        if isinstance(body, Response):
            return body
        entry = await store.comment(
            request.path_params["namespace"],
            request.path_params["item"],
            body.get("body", ""),
            writer.author,
            writer.holder,
            writer.fence,
        )
        return JSONResponse(entry_json(entry), status_code=201)

    async def set_state(request: Request, writer: Writer) -> Response:
        body = await fields(request, "state", "note")
        if isinstance(body, Response):
            return body
        entry = await store.set_item_state(
            request.path_params["namespace"],
            request.path_params["item"],
            body.get("state", ""),
            writer.author,
            writer.holder,
            writer.fence,
            note=body.get("note", ""),
        )
        return JSONResponse(entry_json(entry), status_code=201)

    async def entries(request: Request, _writer: Writer) -> Response:
        namespace, item_id = request.path_params["namespace"], request.path_params["item"]
        await store.item(namespace, item_id)  # 404 for an unknown item, not an empty page
        query = request.query_params
        try:
            after = parse_cursor(query.get("after"))
            before = parse_cursor(query.get("before")) or None
        except ValueError as err:
            return error(422, str(err).replace("Last-Event-ID", "after and before"))
        newest = query.get("newest")
        if newest is not None and not (newest.isdigit() and 1 <= int(newest) <= MAX_PAGE):
            return error(422, f"newest: a number of entries from 1 to {MAX_PAGE} (got {newest[:40]!r})")
        found = await store.item_events(
            namespace,
            item_id,
            after,
            limit=int(newest) if newest else MAX_PAGE,
            before=before,
            newest=newest is not None,
        )
        return JSONResponse({"entries": [entry_json(e) for e in found]})

    async def events(request: Request, writer: Writer) -> Response:
        namespace, item_id = request.path_params["namespace"], request.path_params["item"]
        await store.item(namespace, item_id)  # 404 before a stream starts
        try:
            after = parse_cursor(request.headers.get("last-event-id") or request.query_params.get("after"))
        except ValueError as err:
            return error(422, str(err))
        try:
            held = HeldStream(streams, writer.author.user or "", namespace)
        except OverBudget as err:
            return too_many(str(err), err.retry_after)

        async def still_allowed() -> bool:
            # Asked again as the reader (their token, their rights, an attempt's claim): gone, the stream ends.
            return not isinstance(await authorize(request, "get", namespace, item_id), Response)

        entries = stream_entries(store, namespace, item_id, after, request.is_disconnected, still_allowed)
        return StreamingResponse(
            held.counted(entries),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return [
        Route("/items/{namespace}", guarded("list", list_items)),
        Route("/items/{namespace}", guarded("create", create_item), methods=["POST"]),
        Route("/items/{namespace}/{item}", guarded("get", get_item)),
        Route("/items/{namespace}/{item}/entries", guarded("get", entries)),
        Route("/items/{namespace}/{item}/events", guarded("get", events)),
        Route("/items/{namespace}/{item}/comments", guarded("update", comment), methods=["POST"]),
        Route("/items/{namespace}/{item}/state", guarded("update", set_state), methods=["POST"]),
    ]


async def stream_entries(
    store: Store,
    namespace: str,
    item_id: str,
    after: int,
    disconnected: Callable[[], Awaitable[bool]],
    still_allowed: Callable[[], Awaitable[bool]],
) -> AsyncIterator[bytes]:
    """The item's entries after `after`, then new ones as they come, until the client goes (an item never ends)
    or the reader may read it no more (asked every RUN_CHECK_SECONDS; then `end` with reason forbidden)."""
    loop = asyncio.get_running_loop()
    last_sent = last_check = loop.time()

    async def read(after: int) -> list[ItemEvent]:
        return await store.item_events(namespace, item_id, after, limit=PAGE)

    key = work_item_key(namespace, item_id)
    async for entries in catching_up(key, after, read, feeds_of(store)[1], disconnected):
        if loop.time() - last_check >= RUN_CHECK_SECONDS:
            last_check = loop.time()
            if not await still_allowed():
                yield sse(None, "end", {"reason": "forbidden"})
                return
        for entry in entries:
            last_sent = loop.time()
            yield sse(entry.seq, entry.kind, entry_json(entry))
        if loop.time() - last_sent > KEEPALIVE_SECONDS:
            last_sent = loop.time()
            yield b": keep-alive\n\n"
