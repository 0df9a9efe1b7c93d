"""An attempt's checkpoints through the API both stacks serve (api/attempts.py), over real HTTP on PostgreSQL and
SQLite: recorded and read back in order, under the attempt's fence (its work item's claim, or the attempt of a Run
without one), refused with 409 once the fence moved (reads too: the agent's question before a model call), sealed
with the codec's key in the database (a step copied to another Run's rows is refused when read), bounded, and
refused with a reason for a token that is not an attempt's or a step that is not a step. Nothing refused is
written."""

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from starlette.applications import Starlette

from agent.callers import ItemAccess, item_token
from api.attempts import attempt_routes
from api.errors import ROUTING_ERRORS
from store import Holder, Store, work_item_key
from store.checkpoints import MAX_RUN_BYTES
from store.schema import agent_checkpoints
from temporal_client.codec import EncryptionCodec
from testbed.asgi import serving

KEY = b"k" * 32
CODEC = EncryptionCodec(b"c" * 32)
RUN = Holder("uid-fix", "payments/fix", "alice@example.com")
SECRET = "the prompt says: the canary is tangerine"


def token(fence: int, attempt: int = 1, item: str = "PAY-1", uid: str = RUN.uid, key: bytes = KEY) -> str:
    access = ItemAccess("payments", item, RUN.run, uid, attempt, fence, expires=2**40)
    return item_token(key, access)


def as_attempt(bearer: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {bearer}"}


def turn(step: int, text: str) -> dict[str, Any]:
    return {"step": step, "kind": "turn", "data": {"message": {"role": "assistant", "content": text}}}


@pytest.fixture
async def api(store: Store) -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=attempt_routes(store, KEY, CODEC), exception_handlers=ROUTING_ERRORS)
    async with serving(app, host="127.0.0.1") as url, httpx.AsyncClient(base_url=url) as client:
        yield client


async def test_steps_are_recorded_under_the_claims_fence_and_refused_once_it_moved(
    api: httpx.AsyncClient, store: Store
) -> None:
    fence = (await store.claim(work_item_key("payments", "PAY-1"), RUN, 60)).fence
    mine = as_attempt(token(fence))
    recorded = await api.post("/attempts/checkpoints", json={"steps": [turn(1, SECRET)]}, headers=mine)
    assert recorded.status_code == 201, recorded.text
    tool = {"step": 1, "kind": "tool-started", "data": {"id": "c1", "name": "notes"}}
    assert (await api.post("/attempts/checkpoints", json={"steps": [tool]}, headers=mine)).status_code == 201
    assert (await api.post("/attempts/checkpoints", json={"steps": []}, headers=mine)).status_code == 201
    read = await api.get("/attempts/checkpoints", headers=mine)
    assert read.status_code == 200, read.text
    assert [(s["attempt"], s["step"], s["kind"]) for s in read.json()["steps"]] == [
        (1, 1, "turn"),
        (1, 1, "tool-started"),
    ]
    assert read.json()["steps"][0]["data"]["message"]["content"] == SECRET

    await store.fence_bump(work_item_key("payments", "PAY-1"), RUN, fence)  # a cancel, a deadline, a retry
    for answer in (
        await api.get("/attempts/checkpoints", headers=mine),
        await api.post("/attempts/checkpoints", json={"steps": []}, headers=mine),
        await api.post("/attempts/checkpoints", json={"steps": [turn(2, "late")]}, headers=mine),
    ):
        assert answer.status_code == 409, answer.text
        assert (
            "payments/fix attempt 1" in answer.json()["error"]
            and "no longer current" in answer.json()["error"]
        )
    assert len(await store.checkpoints(RUN.uid)) == 2, "the late step was not written"


async def test_a_run_without_a_work_item_is_fenced_by_attempt(api: httpx.AsyncClient, store: Store) -> None:
    await store.begin_attempt(RUN, 1)
    first = as_attempt(token(1, attempt=1, item=""))
    assert (
        await api.post("/attempts/checkpoints", json={"steps": [turn(1, "a")]}, headers=first)
    ).status_code == 201
    await store.begin_attempt(RUN, 2)  # the workflow's fence_attempt: attempt 1 ended
    refused = await api.post("/attempts/checkpoints", json={"steps": [turn(2, "b")]}, headers=first)
    assert refused.status_code == 409, refused.text
    second = as_attempt(token(2, attempt=2, item=""))
    read = await api.get("/attempts/checkpoints", headers=second)
    assert [(s["attempt"], s["data"]["message"]["content"]) for s in read.json()["steps"]] == [(1, "a")], (
        "a retry reads what the attempt before it recorded"
    )


async def test_steps_are_ciphertext_in_the_database_and_bound_to_their_run(
    api: httpx.AsyncClient, store: Store
) -> None:
    fence = (await store.claim(work_item_key("payments", "PAY-1"), RUN, 60)).fence
    mine = as_attempt(token(fence))
    assert (
        await api.post("/attempts/checkpoints", json={"steps": [turn(1, SECRET)]}, headers=mine)
    ).status_code == 201
    async with store.engine.connect() as c:
        (payload,) = (await c.execute(sa.select(agent_checkpoints.c.payload))).scalars()
    assert b"tangerine" not in payload and b"binary/encrypted" in payload

    other = Holder("uid-other", "payments/other", "mallory@example.com")
    other_fence = (await store.claim(work_item_key("payments", "PAY-2"), other, 60)).fence
    async with store.engine.begin() as c:  # someone with the database copies the step to their Run
        await c.execute(sa.update(agent_checkpoints).values(run_uid=other.uid, run=other.run))
    theirs = as_attempt(token(other_fence, item="PAY-2", uid=other.uid))
    read = await api.get("/attempts/checkpoints", headers=theirs)
    assert read.status_code == 503 and "another Run" in read.json()["error"], read.text


async def test_bounds_and_bad_requests_are_refused_with_their_reason_and_write_nothing(
    api: httpx.AsyncClient, store: Store
) -> None:
    fence = (await store.claim(work_item_key("payments", "PAY-1"), RUN, 60)).fence
    mine = as_attempt(token(fence))
    for body, status, says in [
        ({"steps": [turn(1, "x" * 300_000)]}, 413, "more than the 262144 a step may hold"),
        ({"steps": [{"step": 1, "kind": "dream", "data": {}}]}, 422, "steps[0].kind: one of turn"),
        ({"steps": [{"step": 0, "kind": "turn", "data": {}}]}, 422, "steps[0].step: a number from 1"),
        ({"steps": [{"step": 1, "kind": "turn"}]}, 422, "a step is {step, kind, data}"),
        ({"steps": "all of them"}, 400, 'send {"steps"'),
        ({"steps": [], "attempt": 2}, 400, 'send {"steps"'),
    ]:
        answer = await api.post("/attempts/checkpoints", json=body, headers=mine)
        assert (answer.status_code, says in answer.json()["error"]) == (status, True), answer.text
    # The Run's own bound, as it stands: 33 steps of ~250 KB fit in its 8 MiB, written three a request; a 34th does not.
    big = "y" * 250_000
    for first in range(1, 34, 3):
        steps = [turn(n, big) for n in range(first, first + 3)]
        assert (
            await api.post("/attempts/checkpoints", json={"steps": steps}, headers=mine)
        ).status_code == 201
    full = await api.post("/attempts/checkpoints", json={"steps": [turn(34, big)]}, headers=mine)
    assert full.status_code == 413 and f"pass the Run's {MAX_RUN_BYTES}" in full.json()["error"], full.text
    assert len(await store.checkpoints(RUN.uid)) == 33


async def test_only_an_attempts_own_valid_token_reaches_its_checkpoints(
    api: httpx.AsyncClient, store: Store
) -> None:
    fence = (await store.claim(work_item_key("payments", "PAY-1"), RUN, 60)).fence
    for headers, says in [
        ({}, "send Authorization: Bearer <the attempt's token"),
        (as_attempt("t-alice"), "send Authorization: Bearer <the attempt's token"),
        (as_attempt(token(fence, key=b"x" * 32)), "not valid here"),
        (as_attempt(token(fence)[:-3] + "AAA"), "not valid here"),
    ]:
        answer = await api.get("/attempts/checkpoints", headers=headers)
        assert answer.status_code == 401 and says in answer.json()["error"], answer.text
