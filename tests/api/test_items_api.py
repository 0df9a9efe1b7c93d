"""The work item routes both APIs serve (api/items.py), over real HTTP on a SQLite store: people's writes as
themselves, the authoriser's refusals passed on, every bad request refused with its reason and nothing written,
an item's entries streamed with Last-Event-ID, and an attempt's item token: its own item only, while its fence
holds, never altered, expired or of another key."""

import asyncio
import base64
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from activities.agents.callers import CallerKeys
from agent.callers import ItemAccess, item_token
from agent.contract import WorkItemAccess
from agent.work_item import WorkItemError, comment, read_item
from api.cluster import items_only
from api.errors import ROUTING_ERRORS, error
from api.items import MAX_BODY_BYTES, Writer, item_routes, with_item_tokens
from store import Author, Holder, Store, work_item_key
from testbed.asgi import serving
from testbed.pki import Pki
from workflows.contract import RunIdentity

# Tokens to users, and what each may do: bob reads but may not write.
USERS = {"t-alice": "alice@example.com", "t-bob": "bob@example.com"}
READ_ONLY = {"bob@example.com"}


async def authorize(request: Request, verb: str, namespace: str, item: str | None) -> Writer | Response:
    who = USERS.get(request.headers.get("authorization", "").removeprefix("Bearer "))
    if who is None:
        return error(401, "who are you?")
    if who in READ_ONLY and verb not in ("get", "list"):
        return error(403, f"{who} may not {verb} workitems.ksquad.io in namespace {namespace}")
    return Writer(Author(user=who))


ITEM_KEY = b"k" * 32  # the worker's and the API's


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
async def api(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    routes = item_routes(store, with_item_tokens(store, ITEM_KEY, authorize))
    app = Starlette(routes=routes, exception_handlers=ROUTING_ERRORS)
    async with (
        serving(app, host="127.0.0.1") as url,
        httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer t-alice"}) as client,
    ):
        yield client


async def test_people_create_comment_and_close_items_as_themselves(api: httpx.AsyncClient) -> None:
    created = await api.post(
        "/items/payments", json={"id": "PAY-1", "title": "Flaky retry test", "labels": ["ci"]}
    )
    assert created.status_code == 201, created.text
    assert (created.json()["state"], created.json()["created_by"]) == ("open", "alice@example.com")
    bob = {"Authorization": "Bearer t-bob"}
    assert (await api.post("/items/payments/PAY-1/comments", json={"body": "seen it too"})).status_code == 201
    refused = await api.post("/items/payments/PAY-1/comments", json={"body": "me too"}, headers=bob)
    assert refused.status_code == 403 and "may not update workitems" in refused.json()["error"]
    assert (
        await api.post("/items/payments/PAY-1/state", json={"state": "done", "note": "fixed"})
    ).status_code == 201
    item = (await api.get("/items/payments/PAY-1", headers=bob)).json()
    assert (item["state"], item["last_seq"], item["labels"]) == ("done", 3, ["ci"])
    listed = (await api.get("/items/payments?state=done", headers=bob)).json()["items"]
    assert [i["item_id"] for i in listed] == ["PAY-1"]
    assert (await api.get("/items/other-team")).json() == {"items": []}


@pytest.mark.parametrize(
    ("method", "url", "body", "status", "words"),
    [
        ("POST", "/items/payments", {"id": "PAY-2"}, 422, "an item needs an id and a title"),
        ("POST", "/items/payments", {"id": "PAY 2", "title": "t"}, 422, "id: "),
        ("POST", "/items/payments", {"id": "PAY-2", "title": "x" * 600}, 422, "title: 600 characters"),
        (
            "POST",
            "/items/payments",
            {"id": "PAY-2", "title": "t", "owner": "x"},
            400,
            "unknown fields ['owner']",
        ),
        ("POST", "/items/payments", {"id": 7, "title": "t"}, 400, "id has the wrong type"),
        ("POST", "/items/payments", {"id": "PAY-1", "title": "again"}, 409, "exists in namespace payments"),
        (
            "POST",
            "/items/payments/PAY-1/comments",
            {"body": "x" * (64 * 1024 + 1)},
            422,
            "body: 65537 characters",
        ),
        ("POST", "/items/payments/PAY-1/comments", {"body": "  "}, 422, "body: must not be empty"),
        ("POST", "/items/payments/PAY-1/state", {"state": "closed"}, 422, "not one of open, in-progress"),
        ("POST", "/items/payments/PAY-1/state", {"state": "open"}, 422, "PAY-1 is open: it can go to"),
        (
            "POST",
            "/items/payments/NOPE/comments",
            {"body": "hi"},
            404,
            "no work item NOPE in namespace payments",
        ),
        ("GET", "/items/payments/NOPE", None, 404, "no work item NOPE"),
        ("GET", "/items/payments/PAY-1/events?after=-1", None, 422, "Last-Event-ID must be an event number"),
        ("GET", "/items/payments?limit=many", None, 422, "limit: a number of items from 1 to 500"),
    ],
)
async def test_a_bad_request_is_refused_with_its_reason_and_writes_nothing(
    api: httpx.AsyncClient, method: str, url: str, body: Any, status: int, words: str
) -> None:
    await api.post("/items/payments", json={"id": "PAY-1", "title": "Flaky retry test"})
    answer = await api.request(method, url, json=body)
    assert answer.status_code == status and words in answer.json()["error"] + str(
        answer.json()["problems"]
    ), answer.text
    item = (await api.get("/items/payments/PAY-1")).json()
    assert (item["title"], item["state"], item["last_seq"]) == ("Flaky retry test", "open", 1)
    assert [i["item_id"] for i in (await api.get("/items/payments")).json()["items"]] == ["PAY-1"]


async def test_a_body_too_large_or_not_json_is_refused_before_it_is_read_whole(
    api: httpx.AsyncClient,
) -> None:
    await api.post("/items/payments", json={"id": "PAY-1", "title": "t"})
    as_json = {"Content-Type": "application/json"}
    huge = await api.post(
        "/items/payments/PAY-1/comments", content=b"[" * (MAX_BODY_BYTES + 1), headers=as_json
    )
    assert huge.status_code == 413
    garbled = await api.post("/items/payments/PAY-1/comments", content=b"{body: hi}", headers=as_json)
    assert garbled.status_code == 400 and "not JSON" in garbled.json()["error"]
    unauthenticated = await api.get("/items/payments", headers={"Authorization": ""})
    assert unauthenticated.status_code == 401


async def test_another_sites_form_cannot_write_an_item_even_with_the_persons_token(
    api: httpx.AsyncClient,
) -> None:
    # Behind an authenticating proxy, the person's token is added to whatever their browser sends, and a form on
    # another site can post text/plain that parses as JSON; only a same-origin script (or a CORS preflight this
    # API never answers) can send application/json.
    await api.post("/items/payments", json={"id": "PAY-1", "title": "t"})
    forged = {"Content-Type": "text/plain", "Origin": "https://attacker.invalid"}
    for url, body in [
        ("/items/payments/PAY-1/comments", b'{"body":"x","y":"="}'),
        ("/items/payments/PAY-1/state", b'{"state":"done","y":"="}'),
        ("/items/payments", b'{"id":"PAY-2","title":"t","y":"="}'),
    ]:
        answer = await api.post(url, content=body, headers=forged)
        assert answer.status_code == 415 and "application/json" in answer.json()["error"], answer.text
    item = (await api.get("/items/payments/PAY-1")).json()
    assert (item["state"], item["last_seq"]) == ("open", 1)
    assert [i["item_id"] for i in (await api.get("/items/payments")).json()["items"]] == ["PAY-1"]


async def test_an_items_entries_stream_in_order_and_resume_after_the_last_seen(
    api: httpx.AsyncClient,
) -> None:
    await api.post("/items/payments", json={"id": "PAY-1", "title": "t"})
    await api.post("/items/payments/PAY-1/comments", json={"body": "first"})

    async def read(headers: dict[str, str], count: int) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        async with api.stream("GET", "/items/payments/PAY-1/events", headers=headers) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
                    if len(events) == count:
                        return events
        return events

    assert [(e["seq"], e["kind"]) for e in await read({}, 2)] == [(1, "created"), (2, "comment")]
    reader = asyncio.create_task(read({"Last-Event-ID": "2"}, 1))
    await asyncio.sleep(0.5)
    await api.post("/items/payments/PAY-1/comments", json={"body": "while you watched"})
    (later,) = await asyncio.wait_for(reader, 10)
    assert (later["seq"], later["body"], later["author"]) == (
        3,
        "while you watched",
        {"user": "alice@example.com"},
    )


def attempt_token(
    fence: int, attempt: int = 1, item: str = "PAY-1", key: bytes = ITEM_KEY, expires: float = 0
) -> str:
    access = ItemAccess(
        namespace="payments",
        item=item,
        run="payments/fix-pay-1",
        uid="uid-fix",
        attempt=attempt,
        fence=fence,
        expires=int(expires or time.time() + 600),
    )
    return f"Bearer {item_token(key, access)}"


async def test_an_attempts_token_reads_and_writes_its_item_alone_while_its_fence_holds(
    api: httpx.AsyncClient, store: Store
) -> None:
    await api.post("/items/payments", json={"id": "PAY-1", "title": "Flaky retry test"})
    await api.post("/items/payments", json={"id": "PAY-2", "title": "Someone else's"})
    run = Holder("uid-fix", "payments/fix-pay-1", "alice@example.com")
    first = await store.claim(work_item_key("payments", "PAY-1"), run, 60)
    agent = {"Authorization": attempt_token(first.fence)}
    assert (await api.get("/items/payments/PAY-1", headers=agent)).json()["title"] == "Flaky retry test"
    wrote = await api.post(
        "/items/payments/PAY-1/comments", json={"body": "attempt 1: it races"}, headers=agent
    )
    assert wrote.status_code == 201, wrote.text
    assert wrote.json()["author"] == {
        "user": "alice@example.com",
        "run": "payments/fix-pay-1",
        "run_uid": "uid-fix",
        "attempt": 1,
    }
    assert wrote.json()["fence"] == first.fence
    for method, url in (
        ("GET", "/items/payments/PAY-2"),
        ("POST", "/items/payments/PAY-2/comments"),
        ("GET", "/items/payments"),
        ("POST", "/items/payments"),
    ):
        refused = await api.request(method, url, json={"body": "x"}, headers=agent)
        assert refused.status_code == 403, (method, url, refused.text)
        assert "reaches its work item payments/PAY-1 only" in refused.json()["error"]

    # The workflow fenced the first attempt off and the retry claimed: the first attempt's token is stale.
    await store.fence_bump(work_item_key("payments", "PAY-1"), run, first.fence)
    retry = await store.claim(work_item_key("payments", "PAY-1"), run, 60)
    stale = await api.post("/items/payments/PAY-1/comments", json={"body": "late words"}, headers=agent)
    assert stale.status_code == 409 and "no longer holds payments/PAY-1" in stale.json()["error"]
    assert (await api.get("/items/payments/PAY-1", headers=agent)).status_code == 409, "nor reads it"
    second = {"Authorization": attempt_token(retry.fence, attempt=2)}
    entries = (await api.get("/items/payments/PAY-1/entries", headers=second)).json()["entries"]
    assert [e["body"] for e in entries] == ["Flaky retry test", "attempt 1: it races"], (
        "the retry reads attempt 1"
    )
    assert (
        await api.post("/items/payments/PAY-1/state", json={"state": "done"}, headers=second)
    ).status_code == 201


async def test_a_token_altered_expired_or_made_with_another_key_is_refused(
    api: httpx.AsyncClient, store: Store
) -> None:
    await api.post("/items/payments", json={"id": "PAY-1", "title": "t"})
    run = Holder("uid-fix", "payments/fix-pay-1", "alice@example.com")
    fence = (await store.claim(work_item_key("payments", "PAY-1"), run, 60)).fence
    genuine = attempt_token(fence)
    head, body, signature = genuine.split(".")
    forged_body = body[:-2] + ("AA" if body[-2:] != "AA" else "BB")
    for token in (
        f"{head}.{forged_body}.{signature}",
        attempt_token(fence, key=b"x" * 32),
        attempt_token(fence, expires=time.time() - 3600),
    ):
        refused = await api.get("/items/payments/PAY-1", headers={"Authorization": token})
        assert refused.status_code == 401 and "not valid here" in refused.json()["error"], refused.text
    assert (await api.get("/items/payments/PAY-1/entries")).json()["entries"][-1]["kind"] == "created"


async def test_a_reader_gets_an_items_newest_entries_a_page_at_a_time(api: httpx.AsyncClient) -> None:
    """What people read first is the newest: `newest=K` answers the last K entries, in order, in one request, and
    `before` pages back; a number out of range is refused naming it."""
    assert (await api.post("/items/ns", json={"id": "LONG-1", "title": "long"})).status_code == 201
    for i in range(30):
        assert (await api.post("/items/ns/LONG-1/comments", json={"body": f"c{i}"})).status_code == 201
    newest = (await api.get("/items/ns/LONG-1/entries?newest=5")).json()["entries"]
    assert [e["body"] for e in newest] == ["c25", "c26", "c27", "c28", "c29"]
    older = (await api.get(f"/items/ns/LONG-1/entries?newest=5&before={newest[0]['seq']}")).json()["entries"]
    assert [e["body"] for e in older] == ["c20", "c21", "c22", "c23", "c24"]
    for bad in ("0", "501", "-1", "x", "9" * 40):
        refused = await api.get(f"/items/ns/LONG-1/entries?newest={bad}")
        assert refused.status_code == 422 and refused.json()["error"].startswith("newest:"), refused.text
    refused = await api.get("/items/ns/LONG-1/entries?before=99999999999999999999999")
    assert refused.status_code == 422 and "before" in refused.json()["error"], refused.text


@pytest.mark.parametrize("limit", ["0", "-5", "501", "x", "9" * 400])
async def test_a_list_page_out_of_range_is_refused_naming_it(api: httpx.AsyncClient, limit: str) -> None:
    """A page is 1 to 500 items: a negative one is no "everything" (SQLite reads LIMIT -5 as no limit)."""
    refused = await api.get(f"/items/ns?limit={limit}")
    assert refused.status_code == 422 and refused.json()["error"].startswith("limit:"), refused.text


async def test_sandboxes_read_their_item_over_tls_trusting_the_ca_the_worker_hands_them_and_nothing_else(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ksquad-api's listener for sandboxes (api.cluster.items_only, HTTPS): the worker reads its CA file and hands
    the CA with each attempt's token; the agent reads its item trusting that CA alone. A certificate of another CA
    (a public one included) gets no token; any path but /items/ is 404 on that listener."""
    ours, theirs = Pki(tmp_path / "ours"), Pki(tmp_path / "theirs")
    served = ours.issue("items", "ksquad-api", server=True)
    app = Starlette(
        routes=item_routes(store, with_item_tokens(store, ITEM_KEY, authorize)),
        exception_handlers=ROUTING_ERRORS,
    )
    async with serving(items_only(app), host="127.0.0.1", tls=(served.cert, served.key)) as url:
        async with httpx.AsyncClient(
            base_url=url, verify=ssl.create_default_context(cafile=ours.ca)
        ) as person:
            alice = {"Authorization": "Bearer t-alice"}
            created = await person.post(
                "/items/payments", json={"id": "PAY-1", "title": "Flaky"}, headers=alice
            )
            assert created.status_code == 201, created.text
            for path in (
                "/console/",
                "/codec/encode",
                "/runs/payments/fix/events",
                "/usage",
                "/items/../console/",
            ):
                refused = await person.get(path, headers=alice)
                assert refused.status_code == 404, (path, refused.text)
                assert (
                    refused.json()["error"] == "only /items/, /attempts/ and /memory/ are served on this port"
                )
        run = Holder("uid-fix", "payments/fix-pay-1", "alice@example.com")
        fence = (await store.claim(work_item_key("payments", "PAY-1"), run, 60)).fence
        monkeypatch.setenv("KSQUAD_ITEM_TOKEN_KEY_FILE", str(_key_file(tmp_path)))
        monkeypatch.setenv("KSQUAD_ITEM_API_URL", url)
        monkeypatch.setenv("KSQUAD_ITEM_API_CA_FILE", str(ours.ca))
        monkeypatch.setenv("KSQUAD_SANDBOX_TOKEN_KEY_FILE", str(_key_file(tmp_path)))
        identity = RunIdentity(
            namespace="payments",
            name="fix-pay-1",
            uid="uid-fix",
            attempt=1,
            fence=fence,
            work_item_ref="PAY-1",
        )
        granted = CallerKeys.from_env().work_item_access(identity)
        assert granted is not None and granted["ca"] == ours.ca.read_text()
        access = WorkItemAccess.model_validate(granted)
        state, prompt = await read_item(access)
        assert state == "open" and "Flaky" in prompt
        await comment(access, "read over TLS")
        for other_ca, why in (
            (theirs.ca.read_text(), "CERTIFICATE_VERIFY_FAILED"),
            (None, "CERTIFICATE_VERIFY_FAILED"),  # the image's public trust store: no public CA signed it
            ("not a certificate", "no PEM certificate"),
        ):
            with pytest.raises(WorkItemError, match=why):
                await comment(access.model_copy(update={"ca": other_ca}), "to whom?")
    entries = await store.item_events("payments", "PAY-1")
    assert [e.body for e in entries if e.kind == "comment"] == ["read over TLS"], "nothing else was written"


def _key_file(tmp_path: Path) -> Path:
    key = tmp_path / "item-token.key"
    key.write_text(base64.b64encode(ITEM_KEY).decode())
    return key
