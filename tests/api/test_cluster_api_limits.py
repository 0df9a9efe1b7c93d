"""ksquad-api (api.cluster) served on loopback against the real API server and a real store, as a client meets
it: one user cannot hold unbounded event streams, and the codec cookie is neither the shared token nor sent over
plain HTTP once the browser came through HTTPS; what the router refuses is JSON like the rest; without a codec key
it serves all the same."""

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import yaml

from api.cluster import CODEC_COOKIE, ApiSettings, cluster_api, serve
from api.kubernetes_auth import KubernetesAuth
from api.streams import MAX_STREAMS_PER_USER
from kube import Config, Kube
from store import Store
from temporal_client.codec import EncryptionCodec
from testbed.asgi import serving
from testbed.controlplane import ControlPlane
from testbed.isolate import free_port

SHARED_TOKEN = "the-shared-codec-token"


@pytest.fixture
async def api(ksquad_cluster: ControlPlane, tmp_path: Path) -> AsyncIterator[str]:
    token_file = tmp_path / "codec-token"
    token_file.write_text(SHARED_TOKEN)
    settings = ApiSettings(database_url=f"sqlite:///{tmp_path / 'store.db'}", codec_token_file=token_file)
    store = await Store.open(settings.database_url)
    async with Kube(Config.from_kubeconfig(ksquad_cluster.admin_kubeconfig)) as kube:
        app = cluster_api(store, kube, KubernetesAuth(kube), settings, EncryptionCodec(os.urandom(32)))
        async with serving(app) as url:
            yield url
    await store.close()


def reader(cluster: ControlPlane, namespace: str) -> str:
    """A token of a user who may get the namespace's Runs."""
    account = f"reader-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    cluster.kubectl("create", "role", account, "--verb=get", "--resource=runs.ksquad.io", "-n", namespace)
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
        for _ in range(MAX_STREAMS_PER_USER):
            response = await streams.enter_async_context(http.stream("GET", url, headers=headers))
            assert response.status_code == 200
        over = await http.get(url, headers=headers)
        assert over.status_code == 429, over.text
        assert f"has {MAX_STREAMS_PER_USER} event streams open already" in over.json()["error"]
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
