"""The console of ksquad-api (api.cluster) on loopback against the real API server and a real store, without a
browser: who a person is (the proxy's bearer token, or the token sign-in's sealed cookie), and that what they read
and do reaches the API server as them (its audit log names them), so RBAC, not the console, decides; what they may
not do the page refuses with the reason, and a request forged in their session changes nothing."""

import asyncio
import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from api.budgets import Limits
from api.cluster import cluster_api
from api.cluster_console import CONSOLE_COOKIE
from api.cluster_settings import CONSOLE_LIMITS, ApiSettings
from api.console.guard import csrf_key_of, csrf_token
from api.kubernetes_auth import KubernetesAuth
from api.streams import STREAM_LIMITS
from kube import Config, Kube
from store import Holder, PhaseRecord, Store
from testbed.asgi import serving
from testbed.controlplane import ControlPlane

KEY = os.urandom(32)


@dataclass
class Served:
    url: str
    store: Store


@pytest.fixture
async def served(ksquad_cluster: ControlPlane, namespace: str, tmp_path: Path) -> AsyncIterator[Served]:
    settings = ApiSettings(
        database_url=f"sqlite:///{tmp_path / 'store.db'}", console_key=KEY, namespaces=[namespace]
    )
    store = await Store.open(settings.database_url)
    async with (
        Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as kube,
        serving(cluster_api(store, kube, KubernetesAuth(kube), settings, None)) as url,
    ):
        yield Served(url, store)
    await store.close()


@pytest.fixture
def api(served: Served) -> str:
    return served.url


def person(cluster: ControlPlane, namespace: str, run_verbs: str, item_verbs: str) -> tuple[str, str]:
    """A ServiceAccount standing for a person: `run_verbs` on Runs, read on Agents and Teams, `item_verbs` on work
    items (no object of the API server: what ksquad-api asks it about). Its user name and token."""
    name = f"p-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    rules = [
        {"apiGroups": ["ksquad.io"], "resources": ["runs"], "verbs": run_verbs.split(",")},
        {"apiGroups": ["ksquad.io"], "resources": ["agents", "teams"], "verbs": ["get", "list"]},
        {"apiGroups": ["ksquad.io"], "resources": ["workitems"], "verbs": item_verbs.split(",")},
    ]
    apply(
        cluster,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": namespace},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    )
    token = cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()
    return f"system:serviceaccount:{namespace}:{name}", token


def apply(cluster: ControlPlane, *docs: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def make_run(cluster: ControlPlane, namespace: str, name: str) -> None:
    """A Run for the console to read and act on (its Agent need not exist)."""
    apply(
        cluster,
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Run",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"agents": ["a"]},
        },
    )


def form_token(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, f"no form on the page: {html[:2000]}"
    return found.group(1)


def audited(cluster: ControlPlane, verb: str, name: str) -> set[str]:
    """Who the API server says made `verb` on Run `name`."""
    users = set()
    for line in cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if ref.get("resource") == "runs" and event.get("verb") == verb and ref.get("name") == name:
            users.add(event["user"]["username"])
    return users


async def test_a_person_behind_the_proxy_reads_and_acts_as_themselves(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    cluster = ksquad_cluster
    editor, token = person(cluster, namespace, "get,list,watch,create,patch", "get,list,update")
    apply(
        cluster,
        {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": "Agent",
            "metadata": {"name": "fixer", "namespace": namespace},
            "spec": {"model": "m"},
        },
    )
    elsewhere = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", elsewhere)
    make_run(cluster, elsewhere, "not-yours")
    proxy = {"Authorization": f"Bearer {token}"}  # what the authenticating proxy adds to each request
    async with httpx.AsyncClient(base_url=api, headers=proxy, timeout=30) as http:
        start = await http.get(f"/console/start?namespace={namespace}")
        assert (
            start.status_code == 200 and f'Signed in as <strong data-testid="viewer">{editor}' in start.text
        )
        assert "agent:fixer" in start.text
        made = await http.post(
            "/console/start",
            data={
                "csrf": form_token(start.text),
                "namespace": namespace,
                "target": "agent:fixer",
                "name": "from-console",
                "inputs": "task=fix it",
            },
        )
        assert made.status_code == 303, made.text
        assert made.headers["location"] == f"/console/runs/{namespace}/from-console?done=created"
        run = json.loads(cluster.kubectl("get", "run", "from-console", "-n", namespace, "-o", "json").stdout)
        assert run["spec"] == {"agents": ["fixer"], "inputs": {"task": "fix it"}}
        assert audited(cluster, "create", "from-console") == {editor}, "created by the person, not ksquad-api"

        listed = await http.get("/console/")
        assert "from-console" in listed.text and "not-yours" not in listed.text, (
            "only what RBAC lets them list"
        )

        page = await http.get(f"/console/runs/{namespace}/from-console")
        # Forged in the session of a person who may cancel (so only the console's guard can refuse): a form token
        # guessed, another session's, none; and a good one posted from another origin. Nothing is written.
        other = csrf_token(csrf_key_of(KEY), hashlib.sha256(b"another session").hexdigest())
        for data, headers, says in (
            ({"csrf": "guess"}, {}, "was not made by the console for you"),
            ({"csrf": other}, {}, "was not made by the console for you"),
            ({}, {}, "was not made by the console for you"),
            (
                {"csrf": form_token(page.text)},
                {"Origin": "https://evil.example"},
                "accepted only from the console",
            ),
        ):
            forged = await http.post(
                f"/console/runs/{namespace}/from-console/cancel",
                data={**data, "reason": "x"},
                headers=headers,
            )
            assert forged.status_code == 403 and says in forged.text, (data, headers, forged.text)
        run = json.loads(cluster.kubectl("get", "run", "from-console", "-n", namespace, "-o", "json").stdout)
        assert "ksquad.io/cancel-requested" not in (run["metadata"].get("annotations") or {})
        cancelled = await http.post(
            f"/console/runs/{namespace}/from-console/cancel",
            data={"csrf": form_token(page.text), "reason": "changed my mind"},
        )
        assert cancelled.status_code == 303, cancelled.text
        run = json.loads(cluster.kubectl("get", "run", "from-console", "-n", namespace, "-o", "json").stdout)
        assert run["metadata"]["annotations"]["ksquad.io/cancel-requested"] == "changed my mind"
        assert audited(cluster, "patch", "from-console") == {editor}


async def test_a_reader_sees_and_is_refused_with_the_reason_and_a_forged_request_changes_nothing(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    cluster = ksquad_cluster
    viewer, token = person(cluster, namespace, "get,list,watch", "get,list")
    make_run(cluster, namespace, "watched")
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        signed = await http.post("/console/signin", data={"token": token})
        assert signed.status_code == 303, signed.text
        cookie = signed.cookies[CONSOLE_COOKIE]
        assert token not in cookie
        page = await http.get(f"/console/runs/{namespace}/watched")
        assert page.status_code == 200, page.text
        assert f"{viewer} may not patch runs.ksquad.io watched in namespace {namespace}" in page.text
        assert 'name="csrf"' not in page.text, "no form for what they may not do"
        start = await http.get(f"/console/start?namespace={namespace}")
        assert f"{viewer} may not create runs.ksquad.io in namespace {namespace}" in start.text

        # forged: a well-made form token for this very session (it is never shown them); the API server refuses
        forged = csrf_token(csrf_key_of(KEY), hashlib.sha256(token.encode()).hexdigest())
        cancel = await http.post(f"/console/runs/{namespace}/watched/cancel", data={"csrf": forged})
        assert cancel.status_code == 403 and "may not patch" in cancel.text, cancel.text
        create = await http.post(
            "/console/start",
            data={"csrf": forged, "namespace": namespace, "target": "agent:a", "name": "by-viewer"},
        )
        assert "forbidden" in create.text.lower(), create.text
    assert cluster.kubectl("get", "run", "by-viewer", "-n", namespace, check=False).returncode != 0
    run = json.loads(cluster.kubectl("get", "run", "watched", "-n", namespace, "-o", "json").stdout)
    assert "ksquad.io/cancel-requested" not in (run["metadata"].get("annotations") or {})


async def test_a_sign_in_cookie_that_was_altered_or_a_token_the_cluster_refuses_signs_in_no_one(
    api: str,
) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        refused = await http.post("/console/signin", data={"token": "not-a-token"})
        assert refused.status_code == 401 and "does not accept this token" in refused.text
        http.cookies.set(CONSOLE_COOKIE, "A" * 80, path="/console")
        bounced = await http.get("/console/")
        assert bounced.status_code == 303 and bounced.headers["location"] == "/console/signin"
        headers = (await http.get("/console/signin")).headers
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"


async def test_without_a_console_key_the_console_says_so(
    ksquad_cluster: ControlPlane, tmp_path: Path
) -> None:
    settings = ApiSettings(database_url=f"sqlite:///{tmp_path / 'store.db'}")
    store = await Store.open(settings.database_url)
    async with (
        Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as kube,
        serving(cluster_api(store, kube, KubernetesAuth(kube), settings, None)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        answer = await http.get("/console/")
    await store.close()
    assert answer.status_code == 503 and "KSQUAD_CONSOLE_KEY_FILE" in answer.json()["error"]


async def test_a_long_runs_page_shows_its_newest_progress_and_a_reader_whose_rights_go_loses_its_stream(
    ksquad_cluster: ControlPlane, namespace: str, served: Served
) -> None:
    cluster = ksquad_cluster
    viewer, token = person(cluster, namespace, "get,list,watch", "get,list")
    make_run(cluster, namespace, "chatty")
    run = json.loads(cluster.kubectl("get", "run", "chatty", "-n", namespace, "-o", "json").stdout)
    uid = run["metadata"]["uid"]
    # An agent that reported 600 lines: the page shows the newest, and its stream starts after the last.
    running = PhaseRecord(1, "attempt 1: running", {"phase": "Running", "reason": "Started"}, 1)
    await served.store.append_phase_events(uid, f"{namespace}/chatty", [running])
    holder = Holder(uid, f"{namespace}/chatty")
    item = f"{namespace}/chatty-item"
    claim = await served.store.claim(item, holder, 600)

    async def say(text: str) -> int:
        return await served.store.append_event(holder, claim.fence, 1, "status", text, work_item_ref=item)

    for line in range(600):
        last = await say(f"line {line}")
    auth = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=served.url, timeout=30, headers=auth) as http:
        page = await http.get(f"/console/runs/{namespace}/chatty")
        assert page.status_code == 200, page.text
        assert f"/console/runs/{namespace}/chatty/events?after={last}" in page.text
        assert "line 599</li>" in page.text and "line 400</li>" in page.text
        assert "line 399</li>" not in page.text, "the newest progress is shown, not the oldest"
        assert "attempt 1: running" in page.text, "every phase is on the timeline"

        # A name that would climb to another API path is refused before any call is made as the person (the
        # audit log records who reads Secrets and Runs: testbed.controlplane.AUDIT_POLICY).
        runs_read = person_requests(cluster, viewer, "list", "runs")
        listed = await http.get("/console/", params={"namespace": namespace})
        assert listed.status_code == 200, listed.text
        assert person_requests(cluster, viewer, "list", "runs") > runs_read, (
            "the audit log records the person's reads"
        )
        climbing = "../../../../api/v1/namespaces/kube-system/secrets#"
        refused = await http.get("/console/", params={"namespace": climbing})
        assert refused.status_code == 422 and "is not a Kubernetes name" in refused.text, refused.text
        assert not [
            line
            for line in cluster.audit_log.read_text().splitlines()
            if '"secrets"' in line and viewer in line
        ], "a console request reached the secrets as the person"

        # The stream ends when the person may no longer read the Run, however much the agent still says.
        async def talk() -> None:
            while True:
                await say("still talking")
                await asyncio.sleep(0.2)

        talking = asyncio.create_task(talk())
        ending: dict[str, Any] | None = None
        try:
            async with (
                asyncio.timeout(60),
                http.stream("GET", f"/console/runs/{namespace}/chatty/events?after={last}") as stream,
            ):
                assert stream.status_code == 200
                cluster.kubectl("delete", "rolebinding", viewer.rsplit(":", 1)[1], "-n", namespace)
                kind = ""
                async for text in stream.aiter_lines():
                    if text.startswith("event:"):
                        kind = text.removeprefix("event:").strip()
                    elif kind == "end" and text.startswith("data:"):
                        ending = json.loads(text.removeprefix("data:"))
        finally:
            talking.cancel()
        assert ending == {"reason": "forbidden"}, "the stream went on after the person's rights went"
        gone = await http.get(f"/console/runs/{namespace}/chatty")
        assert gone.status_code == 403, gone.text


async def test_a_persons_event_streams_are_counted_across_the_console_and_the_api(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    cluster = ksquad_cluster
    _, token = person(cluster, namespace, "get,list,watch", "get,list")
    make_run(cluster, namespace, "followed")
    auth = {"Authorization": f"Bearer {token}"}
    console_url = f"/console/runs/{namespace}/followed/events"
    api_url = f"/runs/{namespace}/followed/events"
    async with (
        httpx.AsyncClient(base_url=api, timeout=30, headers=auth) as http,
        contextlib.AsyncExitStack() as streams,
    ):
        for i in range(STREAM_LIMITS.per_person):
            opened = await streams.enter_async_context(http.stream("GET", api_url if i % 2 else console_url))
            assert opened.status_code == 200
        from_console = await http.get(console_url)
        assert from_console.status_code == 429 and "event streams open already" in from_console.text
        from_api = await http.get(api_url)
        assert from_api.status_code == 429, from_api.text


async def test_one_persons_console_requests_do_not_make_another_wait(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    """Each person has their own share of the console's requests in flight: one person's many tabs refreshing
    at once are refused past theirs (429, Retry-After), and another person is answered all the while."""
    cluster = ksquad_cluster
    _, busy = person(cluster, namespace, "get,list,watch", "get,list")
    _, other = person(cluster, namespace, "get,list,watch", "get,list")
    for i in range(5):
        make_run(cluster, namespace, f"listed-{i}")
    fragment = f"/console/runs.frag?namespace={namespace}"
    async with (
        httpx.AsyncClient(base_url=api, timeout=60, headers={"Authorization": f"Bearer {busy}"}) as tabs,
        httpx.AsyncClient(base_url=api, timeout=60, headers={"Authorization": f"Bearer {other}"}) as mine,
    ):
        assert (
            await tabs.get(fragment)
        ).status_code == 200  # signed in, reviewed: what follows is the budget
        flood = asyncio.gather(*(tabs.get(fragment) for _ in range(CONSOLE_LIMITS.per_person * 8)))
        answers_of_other = [await mine.get(fragment) for _ in range(5)]
        answers = await flood
    codes = [a.status_code for a in answers]
    assert set(codes) <= {200, 429} and 429 in codes and 200 in codes, sorted(set(codes))
    refused = [a for a in answers if a.status_code == 429]
    assert all(int(a.headers["retry-after"]) >= 1 for a in refused)
    assert any("console requests" in a.text for a in refused), "the bound in flight held"
    assert [a.status_code for a in answers_of_other] == [200] * 5, [a.text[:200] for a in answers_of_other]


async def test_an_outsider_naming_a_namespace_spends_none_of_its_console_share(
    ksquad_cluster: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """A namespace's share of the console's requests in flight is spent only by who may read its Runs: someone
    who may not, naming it in every request, is refused by RBAC (403) and never by the namespace's bound, and a
    member is answered all the while."""
    cluster = ksquad_cluster
    _, member = person(cluster, namespace, "get,list,watch", "get,list")
    outsider_name = f"o-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", outsider_name, "-n", namespace)  # no grant at all
    outsider = cluster.kubectl("create", "token", outsider_name, "-n", namespace).stdout.strip()
    make_run(cluster, namespace, "shared")
    settings = ApiSettings(
        database_url=f"sqlite:///{tmp_path / 'store.db'}",
        console_key=KEY,
        namespaces=[namespace],
        console_limits=Limits(per_person=64, per_namespace=4, total=1000),
    )
    store = await Store.open(settings.database_url)
    fragment = f"/console/runs.frag?namespace={namespace}"
    try:
        async with (
            Kube(Config.from_kubeconfig(cluster.admin_kubeconfig)) as kube,
            serving(cluster_api(store, kube, KubernetesAuth(kube), settings, None)) as url,
            httpx.AsyncClient(
                base_url=url, timeout=60, headers={"Authorization": f"Bearer {outsider}"}
            ) as out,
            httpx.AsyncClient(
                base_url=url, timeout=60, headers={"Authorization": f"Bearer {member}"}
            ) as mine,
        ):
            assert (
                await out.get(fragment)
            ).status_code == 403  # signed in and reviewed: what follows is the budget
            flood = asyncio.gather(*(out.get(fragment) for _ in range(48)))
            answers_of_member = [await mine.get(fragment) for _ in range(3)]
            answers = await flood
    finally:
        await store.close()
    assert {a.status_code for a in answers} == {403}, sorted({(a.status_code, a.text[:120]) for a in answers})
    assert [a.status_code for a in answers_of_member] == [200] * 3, [a.text[:200] for a in answers_of_member]


async def next_event(lines: AsyncIterator[str]) -> tuple[str, Any]:
    """The next server-sent event's name and data (comments and `retry:` skipped)."""
    kind = ""
    async for text in lines:
        if text.startswith("event:"):
            kind = text.removeprefix("event:").strip()
        elif text.startswith("data:") and kind:
            return kind, json.loads(text.removeprefix("data:"))
    raise AssertionError("the stream ended without another event")


def person_requests(cluster: ControlPlane, user: str, verb: str, resource: str) -> int:
    """How many `verb` requests on `resource` the API server's audit log has from `user` (once each)."""
    seen = set()
    for line in cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            event["user"]["username"] == user
            and event.get("verb") == verb
            and ref.get("resource") == resource
        ):
            seen.add(event["auditID"])
    return len(seen)


async def test_a_runs_table_is_told_when_its_runs_change_and_costs_the_api_server_nothing_while_they_do_not(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    """The runs page follows /console/runs.changes instead of listing Runs every few seconds: ksquad-api's one
    metadata watch of the namespace tells each tab when a Run came, changed or went, and the tab lists them again,
    as the person, only then. A person who may not list the namespace's Runs is refused the stream; one whose
    rights go is told so and the stream ends."""
    cluster = ksquad_cluster
    member, token = person(cluster, namespace, "get,list,watch", "get,list")
    _, outsider = person(cluster, namespace, "get", "get")  # may get a Run, never list them
    auth = {"Authorization": f"Bearer {token}"}
    changes = f"/console/runs.changes?namespace={namespace}"
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        refused = await http.get(changes, headers={"Authorization": f"Bearer {outsider}"})
        assert refused.status_code == 403 and "may not list runs" in refused.text, refused.text
        async with asyncio.timeout(90), http.stream("GET", changes, headers=auth) as stream:
            assert stream.status_code == 200, await stream.aread()
            lines = stream.aiter_lines()
            # No tab followed the namespace yet: its watch starts now, and the tab is told once it has listed
            # (what changed between the page's own list and the watch's start, the watch could not see).
            assert await next_event(lines) == ("change", {})
            lists_before = person_requests(cluster, member, "list", "runs")
            # The audit log sees the person's lists (testbed.controlplane.AUDIT_POLICY): the count below can move.
            listed = await http.get(f"/console/runs.frag?namespace={namespace}", headers=auth)
            assert listed.status_code == 200, listed.text
            assert person_requests(cluster, member, "list", "runs") > lists_before, (
                "the person's list was not seen"
            )
            lists_before = person_requests(cluster, member, "list", "runs")
            quiet = asyncio.create_task(next_event(lines))
            await asyncio.sleep(6)  # three looks with nothing changed: no event, and no list as the person
            assert not quiet.done(), quiet.result()
            assert person_requests(cluster, member, "list", "runs") == lists_before
            make_run(cluster, namespace, "arrives")
            assert await quiet == ("change", {})
            cluster.kubectl(
                "patch",
                "run",
                "arrives",
                "-n",
                namespace,
                "--type=merge",
                "-p",
                '{"metadata": {"labels": {"touched": "yes"}}}',
            )
            assert await next_event(lines) == ("change", {})
            cluster.kubectl("delete", "rolebinding", member.rsplit(":", 1)[1], "-n", namespace)
            kind, data = await next_event(lines)
            while kind == "change":
                kind, data = await next_event(lines)
    assert kind == "end" and "may not list runs" in data["reason"], (kind, data)
