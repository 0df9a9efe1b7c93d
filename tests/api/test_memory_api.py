"""Squad memory over HTTP (api/memory.py). On ksquad-api against the real API server, with the chart's own
aggregated roles: a person bound to the built-in `edit` role adds, searches, edits, exports and deletes a Team's
memory entries, as themselves; one bound to `view` reads them and is refused every write, naming the grant; one with
neither reads nothing. With attempts' tokens (the embedded API, SQLite): an attempt adds to its own Run's Team's
memory as its Run's attempt, is refused another Team's, is refused edits and deletes, and once its fence moved is
refused with 409 and writes nothing."""

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request

from agent.callers import ItemAccess, item_token
from api.errors import ROUTING_ERRORS
from api.items import Writer
from api.memory import memory_routes, with_attempt_tokens
from store import Author, Holder, Store, work_item_key
from testbed import chart
from testbed.asgi import serving
from testbed.controlplane import ControlPlane
from tests.api.test_cluster_api_limits import Api, served  # noqa: F401 (fixture)

KEY = b"k" * 32


def bound_to(cluster: ControlPlane, namespace: str, role: str) -> str:
    """A token of a new ServiceAccount bound to the built-in ClusterRole `role` in `namespace`."""
    account = f"{role}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        account,
        f"--clusterrole={role}",
        f"--serviceaccount={namespace}:{account}",
        "-n",
        namespace,
    )
    return cluster.kubectl("create", "token", account, "-n", namespace).stdout.strip()


def aggregated(cluster: ControlPlane, namespace: str, role: str, verb: str) -> None:
    """Wait until the aggregation controller has given the built-in role the chart's grant."""
    account = f"system:serviceaccount:{namespace}:probe"
    for _ in range(300):
        asked = cluster.kubectl(
            "auth",
            "can-i",
            verb,
            "teams",
            "--subresource=memory",
            "--as",
            account,
            "-n",
            namespace,
            check=False,
        )
        if asked.stdout.strip() == "yes":
            return
        time.sleep(0.2)
    raise AssertionError(f"the built-in {role} role never got {verb} teams/memory")


async def test_view_reads_a_teams_memory_and_only_edit_writes_it(
    ksquad_cluster: ControlPlane,
    namespace: str,
    served: Api,  # noqa: F811
) -> None:
    # The chart's aggregated roles, as a release of its own would make them (a release namespace of this test's:
    # the shared cluster's installed chart keeps its own), removed afterwards.
    docs = chart.render({"namespaces": [namespace]}, namespace=f"mem-{uuid.uuid4().hex[:6]}")
    roles = [d for d in docs if d["kind"] == "ClusterRole" and "workitems" in d["metadata"]["name"]]
    ksquad_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(roles))
    try:
        await people_keep_a_teams_memory(ksquad_cluster, namespace, served)
    finally:
        for role in roles:
            ksquad_cluster.kubectl("delete", "clusterrole", role["metadata"]["name"], check=False)


async def people_keep_a_teams_memory(ksquad_cluster: ControlPlane, namespace: str, served: Api) -> None:  # noqa: F811
    editor, viewer = bound_to(ksquad_cluster, namespace, "edit"), bound_to(ksquad_cluster, namespace, "view")
    outsider = bound_to(ksquad_cluster, "default", "view")
    ksquad_cluster.kubectl("create", "serviceaccount", "probe", "-n", namespace)
    ksquad_cluster.kubectl(
        "create",
        "rolebinding",
        "probe",
        "--clusterrole=edit",
        f"--serviceaccount={namespace}:probe",
        "-n",
        namespace,
    )
    aggregated(ksquad_cluster, namespace, "edit", "update")
    memory = f"/memory/{namespace}/teams/payments-squad"

    async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:

        def as_(token: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token}"}

        added = await http.post(
            memory,
            json={"kind": "decision", "text": "Freeze the clock in payment tests"},
            headers=as_(editor),
        )
        assert added.status_code == 201, added.text
        entry = added.json()
        assert entry["author"]["user"].startswith(f"system:serviceaccount:{namespace}:edit-"), entry
        await http.post(memory, json={"text": "The retry test reads the wall clock"}, headers=as_(editor))

        read = await http.get(memory, headers=as_(viewer))
        assert read.status_code == 200, read.text
        assert [e["text"] for e in read.json()["entries"]] == [
            "The retry test reads the wall clock",
            "Freeze the clock in payment tests",
        ], "newest first"
        found = await http.get(memory, params={"q": "FREEZE"}, headers=as_(viewer))
        assert [e["id"] for e in found.json()["entries"]] == [entry["id"]], "searched by text, any case"

        for method, path, body in [
            ("POST", memory, {"text": "a viewer's note"}),
            ("PUT", f"{memory}/{entry['id']}", {"kind": "fact", "text": "changed"}),
            ("DELETE", f"{memory}/{entry['id']}", None),
        ]:
            refused = await http.request(method, path, json=body, headers=as_(viewer))
            assert refused.status_code == 403, refused.text
            assert "may not update teams/memory.ksquad.io payments-squad" in refused.json()["error"]
        stranger = await http.get(memory, headers=as_(outsider))
        assert stranger.status_code == 403 and "may not get teams/memory" in stranger.json()["error"]

        edited = await http.put(
            f"{memory}/{entry['id']}",
            json={"kind": "decision", "text": "Freeze the clock, always"},
            headers=as_(editor),
        )
        assert edited.status_code == 200 and edited.json()["edited_by"] == entry["author"]["user"], (
            edited.text
        )
        exported = await http.get(f"{memory}/export", headers=as_(viewer))
        assert exported.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in exported.text.splitlines()]
        assert [(e["namespace"], e["name"], e["text"]) for e in lines] == [
            (namespace, "payments-squad", "Freeze the clock, always"),
            (namespace, "payments-squad", "The retry test reads the wall clock"),
        ], "oldest first, every entry"
        assert (await http.delete(f"{memory}/{entry['id']}", headers=as_(editor))).status_code == 204
        assert len((await http.get(memory, headers=as_(viewer))).json()["entries"]) == 1


@pytest.fixture
async def attempts_api(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, Store]]:
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")

    async def developer(request: Request, verb: str, namespace: str, scope: str, name: str) -> Writer:
        return Writer(Author(user="dev@example.com"))

    app = Starlette(
        routes=memory_routes(store, with_attempt_tokens(store, KEY, developer)),
        exception_handlers=ROUTING_ERRORS,
    )
    async with serving(app, host="127.0.0.1") as url, httpx.AsyncClient(base_url=url) as http:
        yield http, store
    await store.close()


async def test_an_attempt_adds_to_its_own_squads_memory_while_current_and_nothing_else(
    attempts_api: tuple[httpx.AsyncClient, Store],
) -> None:
    http, store = attempts_api
    run = Holder("uid-fix", "payments/fix", "alice@example.com")
    fence = (await store.claim(work_item_key("payments", "PAY-1"), run, 60)).fence
    access = ItemAccess("payments", "PAY-1", run.run, run.uid, 1, fence, 2**40, memory=("teams/squad",))
    mine = {"Authorization": f"Bearer {item_token(KEY, access)}"}

    added = await http.post(
        "/memory/payments/teams/squad", json={"kind": "fact", "text": "CI runs on arm64"}, headers=mine
    )
    assert added.status_code == 201, added.text
    assert added.json()["author"] == {
        "user": "alice@example.com",
        "run": "payments/fix",
        "run_uid": "uid-fix",
        "attempt": 1,
    }
    assert added.json()["fence"] == fence
    for method, path, status, says in [
        (
            "GET",
            "/memory/payments/teams/others",
            403,
            "reaches the memories of its Run's Team and Project only",
        ),
        ("POST", "/memory/other-ns/teams/squad", 403, "only (teams/squad in payments)"),
        ("PUT", f"/memory/payments/teams/squad/{added.json()['id']}", 403, "edits and deletes nothing"),
        ("DELETE", f"/memory/payments/teams/squad/{added.json()['id']}", 403, "edits and deletes nothing"),
    ]:
        refused = await http.request(
            method, path, json={"text": "x"} if method in ("POST", "PUT") else None, headers=mine
        )
        assert (refused.status_code, says in refused.json()["error"]) == (status, True), refused.text

    await store.fence_bump(work_item_key("payments", "PAY-1"), run, fence)
    late = await http.post(
        "/memory/payments/teams/squad", json={"text": "written after the fence moved"}, headers=mine
    )
    assert late.status_code == 409 and "no longer current" in late.json()["error"], late.text
    assert [e.text for e in await store.memory("payments", "teams", "squad")] == ["CI runs on arm64"]
