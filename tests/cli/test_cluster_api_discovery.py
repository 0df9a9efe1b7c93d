"""Where `ksquad` sends the user's cluster token on a cluster, tried on the real API server as a Run namespace's editor
would: ksquad-api's URL is read only from the ClusterRole `ksquad-locator` the chart installs (cluster-scoped: an
editor can neither make nor change one), never from a ConfigMap of theirs; a URL there that is not HTTPS is refused,
naming the setting that would allow it; the user's own `--api` is theirs to choose. An API that is not ksquad's (a
listener that answers anything, or nothing, or with a certificate that does not verify) gets a bounded number of
requests and a one-line reason, never a traceback."""

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from testbed.asgi import serving
from testbed.controlplane import ControlPlane
from testbed.pki import Pki

KSQUAD = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "ksquad")
LOCATOR = "ksquad-locator"


@pytest.fixture
async def listener() -> AsyncIterator[tuple[str, list[str]]]:
    """Someone else's server: it records the Authorization header of every request it gets (and refuses it)."""
    tokens: list[str] = []

    async def anything(request: Request) -> Response:
        tokens.append(request.headers.get("authorization", ""))
        return Response('{"error": "recorded"}', status_code=403, media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])
    async with serving(app) as url:
        yield url, tokens


@pytest.fixture
def admin(ksquad_cluster: ControlPlane, namespace: str) -> Iterator[tuple[Path, str]]:
    """A cluster admin who signs in with a bearer token (an OIDC or exec-plugin token, on a real cluster)."""
    name = f"admin-{uuid.uuid4().hex[:6]}"
    ksquad_cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    ksquad_cluster.kubectl(
        "create",
        "clusterrolebinding",
        name,
        "--clusterrole=cluster-admin",
        f"--serviceaccount={namespace}:{name}",
    )
    token = ksquad_cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()
    try:
        yield ksquad_cluster.token_kubeconfig(name, token, namespace), token
    finally:
        ksquad_cluster.kubectl("delete", "clusterrolebinding", name, check=False)


@pytest.fixture
def locator(ksquad_cluster: ControlPlane) -> Iterator[list[str]]:
    """The chart's locator, made as the chart makes it: pass a URL and it is the ClusterRole's annotation."""
    made: list[str] = []
    yield made
    if made:
        ksquad_cluster.kubectl("delete", "clusterrole", LOCATOR, check=False)


def locate(cluster: ControlPlane, url: str, made: list[str]) -> None:
    doc = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": LOCATOR, "annotations": {"ksquad.io/api-url": url}},
        "rules": [],
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    made.append(url)


def editor(cluster: ControlPlane, namespace: str) -> Path:
    """A user with `edit` in the Run namespace (and on its Runs)."""
    name = f"editor-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", name, "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        name,
        "-n",
        namespace,
        "--clusterrole=edit",
        f"--serviceaccount={namespace}:{name}",
    )
    token = cluster.kubectl("create", "token", name, "-n", namespace).stdout.strip()
    return cluster.token_kubeconfig(name, token, namespace)


def finished_run(cluster: ControlPlane, namespace: str) -> None:
    doc = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": "stuck", "namespace": namespace},
        "spec": {"agents": ["dev-1"]},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))
    status = {"status": {"phase": "Succeeded", "reason": "Succeeded", "revision": 3}}
    cluster.kubectl(
        "patch",
        "kr",
        "stuck",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(status),
    )


async def ksquad(kubeconfig: Path, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        KSQUAD,
        *args,
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def watch(kubeconfig: Path, namespace: str, *extra: str) -> tuple[int, str, str]:
    return await ksquad(kubeconfig, "runs", "watch", f"{namespace}/stuck", "-o", "json", *extra)


def no_traceback(err: str) -> None:
    assert "Traceback" not in err and err.count("\n") <= 3, err


async def test_an_editor_can_neither_point_the_cli_nor_make_a_locator(
    ksquad_cluster: ControlPlane, namespace: str, admin: tuple[Path, str], listener: tuple[str, list[str]]
) -> None:
    url, tokens = listener
    kubeconfig, _ = admin
    finished_run(ksquad_cluster, namespace)
    as_editor = editor(ksquad_cluster, namespace)
    for where in (namespace, "ksquad-system", "ksquad"):  # what `edit` there may write (where it may)
        configmap = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "ksquad-api", "namespace": where},
        }
        ksquad_cluster.kubectl(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump({**configmap, "data": {"url": url}}),
            kubeconfig=as_editor,
            check=False,
        )
    locator = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": LOCATOR},
    }
    made = ksquad_cluster.kubectl(
        "create", "-f", "-", input=json.dumps(locator), kubeconfig=as_editor, check=False
    )
    assert made.returncode != 0 and "forbidden" in made.stderr, "an editor made the locator"
    code, out, err = await watch(kubeconfig, namespace)
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["data"]["phase"] == "Succeeded", (
        "read from the Run's status instead"
    )
    assert tokens == [], "the editor's listener was called"


async def test_a_url_that_is_not_https_gets_no_token_and_says_which_setting(
    ksquad_cluster: ControlPlane,
    namespace: str,
    admin: tuple[Path, str],
    listener: tuple[str, list[str]],
    locator: list[str],
) -> None:
    url, tokens = listener
    kubeconfig, token = admin
    finished_run(ksquad_cluster, namespace)
    locate(ksquad_cluster, url, locator)  # http://, on the test bed's network
    code, _, err = await watch(kubeconfig, namespace)
    assert code != 0 and "is not HTTPS" in err and "api.tlsSecret" in err and "--api" in err, err
    assert f"ClusterRole {LOCATOR}" in err
    no_traceback(err)
    assert tokens == [], "the token went over plain HTTP"
    code, _, err = await watch(kubeconfig, namespace, "--api", url)  # the user's own choice
    assert code != 0 and "recorded" in err, err
    assert tokens == [f"Bearer {token}"], tokens


async def test_an_api_that_is_not_ksquads_gets_few_requests_and_one_line_each(
    ksquad_cluster: ControlPlane, namespace: str, admin: tuple[Path, str], tmp_path: Path
) -> None:
    """A listener that answers 200 with no event stream (the CLI looped on it: 4,049 requests in 20 s), JSON of the
    wrong shape, nothing at all, or a certificate the kubeconfig's CA does not vouch for."""
    kubeconfig, _ = admin
    finished_run(ksquad_cluster, namespace)
    hits: list[str] = []

    async def odd(request: Request) -> Response:
        hits.append(request.url.path)
        if request.url.path.endswith("/events"):
            return Response("", media_type="text/plain")
        return Response(json.dumps(["not", "an", "object"]), media_type="application/json")

    app = Starlette(routes=[Route("/{path:path}", odd, methods=["GET", "POST"])])
    async with serving(app) as url:
        code, _, err = await watch(kubeconfig, namespace, "--api", url)
        assert code != 0 and "not an event stream" in err, err
        no_traceback(err)
        assert len(hits) == 1, f"{len(hits)} requests"
        code, _, err = await ksquad(kubeconfig, "items", "list", "-n", namespace, "--api", url)
        assert code != 0 and "not an object" in err, err
        no_traceback(err)
    gone = f"http://127.0.0.1:{9}"  # nothing listens
    code, _, err = await ksquad(kubeconfig, "items", "list", "-n", namespace, "--api", gone)
    assert code != 0 and "does not answer" in err, err
    no_traceback(err)

    pki = Pki(tmp_path / "elsewhere")  # a CA the kubeconfig's does not know
    pair = pki.issue("listener", "listener", server=True, addresses=(url.split("//")[1].split(":")[0],))
    async with serving(app, tls=(pair.cert, pair.key)) as secure:
        hits.clear()
        code, _, err = await watch(kubeconfig, namespace, "--api", secure)
        assert code != 0 and "certificate does not verify" in err, err
        no_traceback(err)
        assert hits == [], "the request never went past the handshake"
