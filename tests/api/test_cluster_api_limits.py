"""ksquad-api (api.cluster) served on loopback against the real API server and a real store, as a client meets
it: one user cannot hold unbounded event streams nor send unbounded requests, and the codec cookie is neither the shared token nor sent over
plain HTTP once the browser came through HTTPS; what the router refuses is JSON like the rest; without a codec key
it serves all the same."""

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from api.budgets import RequestLimits
from api.cluster import cluster_api, serve
from api.cluster_codec import CODEC_COOKIE
from api.cluster_settings import REFUSED_TOKENS, ApiSettings
from api.kubernetes_auth import KubernetesAuth
from api.streams import STREAM_LIMITS
from kube import Config, Kube
from store import Store
from temporal_client.codec import EncryptionCodec
from testbed.asgi import serving
from testbed.controlplane import ControlPlane
from testbed.isolate import free_port

SHARED_TOKEN = "the-shared-codec-token"


@dataclass
class Api:
    url: str
    auth: KubernetesAuth
    store: Store


@pytest.fixture
async def served(ksquad_cluster: ControlPlane, tmp_path: Path) -> AsyncIterator[Api]:
    token_file = tmp_path / "codec-token"
    token_file.write_text(SHARED_TOKEN)
    settings = ApiSettings(database_url=f"sqlite:///{tmp_path / 'store.db'}", codec_token_file=token_file)
    store = await Store.open(settings.database_url)
    async with Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as kube:
        auth = KubernetesAuth(kube)
        app = cluster_api(store, kube, auth, settings, EncryptionCodec(os.urandom(32)))
        async with serving(app) as url:
            yield Api(url, auth, store)
    await store.close()


@pytest.fixture
def api(served: Api) -> str:
    return served.url


def reader(
    cluster: ControlPlane, namespace: str, account: str = "", resources: tuple[str, ...] = ("runs",)
) -> str:
    """A token of a user who may get and list the namespace's Runs (or `resources` of ksquad.io: workitems are
    no object of the API server, only what ksquad-api asks it about); their RoleBinding is `account`."""
    account = account or f"reader-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": account, "namespace": namespace},
        "rules": [{"apiGroups": ["ksquad.io"], "resources": list(resources), "verbs": ["get", "list"]}],
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))
    cluster.kubectl(
        "create",
        "rolebinding",
        account,
        f"--role={account}",
        f"--serviceaccount={namespace}:{account}",
        "-n",
        namespace,
    )
    return cluster.kubectl("create", "token", account, "-n", namespace).stdout.strip()


async def test_one_user_holds_at_most_so_many_event_streams(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    run = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": "r", "namespace": namespace},
    }
    ksquad_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({**run, "spec": {"agents": ["a"]}}))
    headers = {"Authorization": f"Bearer {reader(ksquad_cluster, namespace)}"}
    url = f"/runs/{namespace}/r/events"
    async with httpx.AsyncClient(base_url=api, timeout=30) as http, contextlib.AsyncExitStack() as streams:
        for _ in range(STREAM_LIMITS.per_person):
            response = await streams.enter_async_context(http.stream("GET", url, headers=headers))
            assert response.status_code == 200
        over = await http.get(url, headers=headers)
        assert over.status_code == 429, over.text
        assert f"has {STREAM_LIMITS.per_person} event streams open already" in over.json()["error"]
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:  # the streams closed: a new one opens
        for _ in range(50):
            async with http.stream("GET", url, headers=headers) as again:
                if again.status_code == 200:
                    break
            await asyncio.sleep(0.1)
        assert again.status_code == 200


async def test_the_codec_cookie_is_not_the_token_and_is_secure_behind_https(api: str) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        signed_in = await http.post(
            "/codec/login", data={"token": SHARED_TOKEN}, headers={"X-Forwarded-Proto": "https"}
        )
        assert signed_in.status_code == 303
        cookie = signed_in.headers["set-cookie"]
        assert "secure" in cookie.lower() and "httponly" in cookie.lower(), cookie
        value = cookie.split(";")[0].split("=", 1)[1]
        assert SHARED_TOKEN not in value, "the cookie is derived from the token, not the token"
        body: dict[str, list[object]] = {"payloads": []}
        assert (await http.post("/codec/decode", json=body, cookies={CODEC_COOKIE: value})).status_code == 200
        raw = await http.post("/codec/decode", json=body, cookies={CODEC_COOKIE: SHARED_TOKEN})
        assert raw.status_code == 401, "the token itself is no cookie"


async def test_what_the_router_refuses_is_answered_in_the_apis_error_shape(api: str) -> None:
    async with httpx.AsyncClient(base_url=api, timeout=30) as http:
        unknown = await http.get("/no/such/route")
        assert (unknown.status_code, unknown.json()) == (
            404,
            {"error": "no such route: GET /no/such/route", "problems": []},
        )
        wrong = await http.delete("/runs/default/r/events")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD", wrong.headers
        assert wrong.json()["error"] == "/runs/default/r/events does not take DELETE (it takes GET, HEAD)"
        in_codec = await http.get("/codec/nothing/here/at/all")  # a mounted app of its own
        assert in_codec.status_code == 404 and "no such route" in in_codec.json()["error"], in_codec.text


async def test_without_a_codec_key_ksquad_api_serves_and_says_there_is_no_codec(
    ksquad_cluster: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's default has no codec.keySecret: ksquad-api used to exit at start, so `helm install --wait`
    timed out instead of saying what to set."""
    monkeypatch.delenv("KSQUAD_CODEC_KEY_FILE", raising=False)
    database = f"sqlite:///{tmp_path / 'store.db'}"
    await (await Store.open(database)).close()  # migrated, as the worker leaves it
    settings = ApiSettings(
        database_url=database,
        port=free_port(),
        health_port=free_port(),
        kubeconfig=str(ksquad_cluster.admin_kubeconfig),
    )
    serving_api = asyncio.create_task(serve(settings))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.port}", timeout=30) as http:
            for _ in range(200):
                assert not serving_api.done(), serving_api.exception()
                with contextlib.suppress(httpx.TransportError):
                    answer = await http.post("/codec/decode", json={"payloads": []})
                    break
                await asyncio.sleep(0.05)
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"].startswith("no codec is configured (codec.keySecret)")
            unauthenticated = await http.get("/runs/default/r/events")
            assert unauthenticated.status_code == 401, "the rest is served, as ever"
            ready = await http.get(f"http://127.0.0.1:{settings.health_port}/readyz")
            assert ready.status_code == 200, ready.text
    finally:
        serving_api.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving_api


def make_run(cluster: ControlPlane, namespace: str, name: str) -> None:
    run = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": namespace},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({**run, "spec": {"agents": ["a"]}}))


async def test_streams_opened_all_at_once_stop_at_the_bound(
    ksquad_cluster: ControlPlane, namespace: str, api: str
) -> None:
    """Counted as each is let open, not after: one more than the bound, opened in parallel, is one refusal."""
    make_run(ksquad_cluster, namespace, "r")
    headers = {"Authorization": f"Bearer {reader(ksquad_cluster, namespace)}"}
    most = STREAM_LIMITS.per_person
    async with (
        httpx.AsyncClient(base_url=api, timeout=30, headers=headers) as http,
        contextlib.AsyncExitStack() as held,
    ):

        async def open_one() -> httpx.Response:
            return await held.enter_async_context(http.stream("GET", f"/runs/{namespace}/r/events"))

        answers = await asyncio.gather(*(open_one() for _ in range(most + 1)))
        codes = sorted(a.status_code for a in answers)
        assert codes == [200] * most + [429], codes
        refused = next(a for a in answers if a.status_code == 429)
        assert int(refused.headers["retry-after"]) > 0


async def test_a_readers_streams_end_when_their_rolebinding_goes(
    ksquad_cluster: ControlPlane, namespace: str, served: Api
) -> None:
    """A Run's and a work item's stream ask again, as the reader, whether they may read: the RoleBinding deleted,
    both end with `end` {"reason": "forbidden"} within seconds, and a new one is refused."""
    make_run(ksquad_cluster, namespace, "watched")
    await served.store.create_item(namespace, "ITEM-1", title="watched", created_by="admin")
    account = f"leaver-{uuid.uuid4().hex[:6]}"
    token = reader(ksquad_cluster, namespace, account, ("runs", "workitems"))
    headers = {"Authorization": f"Bearer {token}"}

    async def ending(http: httpx.AsyncClient, url: str, opened: asyncio.Event) -> str:
        async with http.stream("GET", url) as stream:
            assert stream.status_code == 200, await stream.aread()
            opened.set()
            last_event = ""
            async for line in stream.aiter_lines():
                if line.startswith("event: "):
                    last_event = line.removeprefix("event: ")
                elif line.startswith("data: ") and last_event == "end":
                    return line.removeprefix("data: ")
        return "the stream closed without an end"

    async with httpx.AsyncClient(base_url=served.url, timeout=60, headers=headers) as http:
        opened = [asyncio.Event(), asyncio.Event()]
        run_stream = asyncio.create_task(ending(http, f"/runs/{namespace}/watched/events", opened[0]))
        item_stream = asyncio.create_task(ending(http, f"/items/{namespace}/ITEM-1/events", opened[1]))
        await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 30)
        ksquad_cluster.kubectl("delete", "rolebinding", account, "-n", namespace)
        ends = await asyncio.wait_for(asyncio.gather(run_stream, item_stream), 60)
        assert list(ends) == ['{"reason": "forbidden"}'] * 2, ends
        again = await http.get(f"/items/{namespace}/ITEM-1/events")
        assert again.status_code == 403, again.text


async def test_made_up_tokens_cost_the_api_server_a_bounded_number_of_reviews(
    ksquad_cluster: ControlPlane, namespace: str, served: Api
) -> None:
    """10,000 requests with random bearer tokens: past a burst, each is refused 429 with Retry-After without a
    TokenReview; a person signed in before the flood (from the same address) is still answered after it."""
    make_run(ksquad_cluster, namespace, "r")
    person = {"Authorization": f"Bearer {reader(ksquad_cluster, namespace)}"}
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as http:
        signed_in = await http.get(f"/runs/{namespace}/r/artifacts/answer", headers=person)
        assert signed_in.status_code == 404, signed_in.text
    served.auth._users.clear()  # the person's review forgotten (as 10 s later): they are reviewed again
    before = served.auth.reviews
    started = asyncio.get_running_loop().time()
    codes: list[int] = []
    retry_after: set[str] = set()
    # 400 at a time: each refusal is held back a second (api.budgets.Tarpit, 256 at once), so a client that
    # floods sends as many requests as it has connections, a second. A new connection each (one kept alive
    # through a held refusal may be closed by the server as it is reused: a client's race, not a refusal).
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=served.url, timeout=60, limits=limits) as http:

        async def flood(n: int) -> None:
            for _ in range(n):
                made_up = {"Authorization": f"Bearer {uuid.uuid4().hex}{uuid.uuid4().hex}"}
                answer = await http.get(f"/runs/{namespace}/r/artifacts/answer", headers=made_up)
                codes.append(answer.status_code)
                if answer.status_code == 429:
                    retry_after.add(answer.headers.get("retry-after", ""))

        await asyncio.gather(*(flood(25) for _ in range(400)))
        elapsed = asyncio.get_running_loop().time() - started
        mine = await http.get(f"/runs/{namespace}/r/artifacts/answer", headers=person)
    assert mine.status_code == 404, mine.text  # reviewed and allowed: the Run has no such artifact yet
    assert len(codes) == 10_000 and set(codes) <= {401, 429}, set(codes)
    reviews = served.auth.reviews - before - 1  # the person's own review, again
    most = REFUSED_TOKENS.burst + REFUSED_TOKENS.total * elapsed
    assert reviews <= most, f"{reviews} TokenReviews in {elapsed:.1f} s (the bound allows {most:.0f})"
    assert codes.count(401) == reviews and codes.count(429) == 10_000 - reviews
    assert "" not in retry_after and all(int(r) >= 1 for r in retry_after), retry_after


@pytest.mark.parametrize(
    "query",
    [
        "since=99999999999d",
        "since=0001-01-01",
        "until=9999-12-31T00:00:00",
        f"since={'9' * 500}",
        "since=-1d",
    ],
)
async def test_an_absurd_usage_range_is_refused_naming_it(
    ksquad_cluster: ControlPlane, namespace: str, api: str, query: str
) -> None:
    headers = {"Authorization": f"Bearer {reader(ksquad_cluster, namespace)}"}
    async with httpx.AsyncClient(base_url=api, timeout=30, headers=headers) as http:
        answer = await http.get(f"/usage?namespace={namespace}&{query}")
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith(query.split("=")[0] + ":"), answer.text


async def test_a_persons_requests_past_their_share_are_refused_and_others_are_served(
    ksquad_cluster: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    """Requests a second, per person and per namespace: a person who sends as fast as they can is answered 429
    (Retry-After, naming them) past their share while a second person of the namespace is served; the two
    together are held to the namespace's share, which no one without access to it can spend; a person of
    another namespace is served throughout."""
    limits = RequestLimits(per_person=2, per_namespace=3, total=100)
    settings = ApiSettings(database_url=f"sqlite:///{tmp_path / 'store.db'}", requests=limits)
    store = await Store.open(settings.database_url)
    other_namespace = f"other-{uuid.uuid4().hex[:6]}"
    ksquad_cluster.kubectl("create", "namespace", other_namespace)
    ksquad_cluster.wait_for_default_service_account(other_namespace)
    for where in (namespace, other_namespace):
        make_run(ksquad_cluster, where, "r")
    flooder, neighbour = (reader(ksquad_cluster, namespace) for _ in range(2))
    elsewhere = reader(ksquad_cluster, other_namespace)
    async with (
        Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as kube,
        serving(cluster_api(store, kube, KubernetesAuth(kube), settings, None)) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as http,
    ):

        async def ask(token: str, where: str = namespace) -> httpx.Response:
            return await http.get(
                f"/runs/{where}/r/artifacts/x", headers={"Authorization": f"Bearer {token}"}
            )

        def served(answers: list[httpx.Response]) -> int:
            codes = {a.status_code for a in answers}
            assert codes <= {404, 429}, codes  # 404: answered (the Run has no such artifact)
            return sum(a.status_code == 404 for a in answers)

        # Someone with no access to the namespace spends none of its share by naming it: all 403 (or 429, theirs)
        outsider = await asyncio.gather(*(ask(elsewhere) for _ in range(20)))
        assert {a.status_code for a in outsider} <= {403, 429} and 403 in {a.status_code for a in outsider}

        clock = asyncio.get_running_loop().time
        started = clock()
        flooded = list(await asyncio.gather(*(ask(flooder) for _ in range(40))))
        burst = limits.per_person * RequestLimits.BURST_SECONDS
        assert burst <= served(flooded) <= burst + limits.per_person * (clock() - started) + 1
        refused = next(a for a in flooded if a.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"].startswith("too many requests from system:serviceaccount:"), (
            refused.text
        )
        assert (await ask(neighbour)).status_code == 404, "the flooder's share is theirs alone"

        started = clock()
        both = await asyncio.gather(*(ask(who) for who in (flooder, neighbour) * 30))
        most = limits.per_namespace * (RequestLimits.BURST_SECONDS + clock() - started) + 1
        assert served(list(both)) <= most
        assert any(f"namespace {namespace}" in a.text for a in both if a.status_code == 429)
        assert [(await ask(elsewhere, other_namespace)).status_code for _ in range(5)] == [404] * 5
    await store.close()
