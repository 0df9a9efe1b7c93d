"""Where `ksquad runs watch --kubeconfig` sends the user's cluster token, on the real API server: a Run namespace's
editors cannot choose it (a ConfigMap of theirs is never read), and a URL that is not HTTPS is refused, naming
the setting that would allow it. The user's own `--api` is theirs to choose."""

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

KSQUAD = str(Path(os.environ.get("VIRTUAL_ENV", ".venv")) / "bin" / "ksquad")


@pytest.fixture
async def listener() -> AsyncIterator[tuple[str, list[str]]]:
    """The editor's server: it records the Authorization header of every request it gets (and refuses it, so the
    CLI ends)."""
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


def configmap(cluster: ControlPlane, namespace: str, url: str) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ksquad-api", "namespace": namespace},
        "data": {"url": url},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(doc))


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


async def watch(kubeconfig: Path, namespace: str, *extra: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        KSQUAD,
        "runs",
        "watch",
        f"{namespace}/stuck",
        "--kubeconfig",
        str(kubeconfig),
        "-o",
        "json",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_an_editors_configmap_never_gets_the_callers_token(
    ksquad_cluster: ControlPlane,
    namespace: str,
    admin: tuple[Path, str],
    listener: tuple[str, list[str]],
) -> None:
    url, tokens = listener
    kubeconfig, _ = admin
    finished_run(ksquad_cluster, namespace)
    configmap(ksquad_cluster, namespace, url)  # what `edit` in the Run's namespace may write
    code, out, err = await watch(
        kubeconfig, namespace, "--ksquad-namespace", f"nowhere-{uuid.uuid4().hex[:6]}"
    )
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
) -> None:
    url, tokens = listener
    kubeconfig, token = admin
    system = f"ksquad-{uuid.uuid4().hex[:6]}"  # ksquad's own namespace, as the chart publishes it
    ksquad_cluster.kubectl("create", "namespace", system)
    try:
        finished_run(ksquad_cluster, namespace)
        configmap(ksquad_cluster, system, url)  # http://, on the test bed's network
        code, _, err = await watch(kubeconfig, namespace, "--ksquad-namespace", system)
        assert code != 0 and "is not HTTPS" in err and "api.tlsSecret" in err and "--api" in err, err
        assert tokens == [], "the token went over plain HTTP"
        code, _, err = await watch(kubeconfig, namespace, "--api", url)  # the user's own choice
        assert code != 0 and "recorded" in err, err
        assert tokens == [f"Bearer {token}"], tokens
    finally:
        ksquad_cluster.kubectl("delete", "namespace", system, "--wait=false", check=False)
