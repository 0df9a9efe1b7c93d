"""Loading cluster credentials as kubectl does (the files; the cluster itself is in
tests/crd_bridge/test_cluster_credentials.py): several kubeconfig files merged, the first current-context and
that context's namespace, a named context, inline key material that never stays on disk, and credentials that
are read again instead of kept: token files when they change, exec plugins after a 401."""

import base64
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from kube import Config, ConfigError, TokenFile
from kube.config import LoadedCredentials
from testbed.pki import Pki


def kubeconfig(path: Path, name: str, server: str, user: dict[str, Any], **extra: Any) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": f"ns-{name}"}}],
        **extra,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_files_merge_as_kubectl_merges_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig(
        tmp_path / "a", "alpha", "https://alpha.example:6443", {"token": "a"}, **{"current-context": "alpha"}
    )
    second = kubeconfig(
        tmp_path / "b", "beta", "https://beta.example:6443", {"token": "b"}, **{"current-context": "beta"}
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}:{tmp_path / 'missing'}:{second}")
    config = Config.load()
    assert (config.server, config.namespace) == ("https://alpha.example:6443", "ns-alpha"), (
        "the first file's current-context, and its namespace"
    )
    other = Config.load(context="beta")
    assert (other.server, other.namespace) == ("https://beta.example:6443", "ns-beta")
    with pytest.raises(ConfigError, match="gamma"):
        Config.load(context="gamma")


async def test_inline_key_material_is_on_disk_only_while_the_tls_context_reads_it(tmp_path: Path) -> None:
    pki = Pki(tmp_path / "pki")
    pair = pki.issue("user", "someone")
    user = {
        "client-certificate-data": base64.b64encode(pair.cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(pair.key.read_bytes()).decode(),
    }
    path = kubeconfig(tmp_path / "inline", "inline", "https://127.0.0.1:6443", user)
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"] = {
        "server": "https://127.0.0.1:6443",
        "certificate-authority-data": base64.b64encode(pki.ca.read_bytes()).decode(),
    }
    doc["current-context"] = "inline"
    path.write_text(yaml.safe_dump(doc))
    before = set(Path(tempfile.gettempdir()).glob("ksquad-kube-*"))
    config = Config.from_kubeconfig(path)
    assert config.ssl_context is not False
    assert set(Path(tempfile.gettempdir()).glob("ksquad-kube-*")) == before, "no key left in a file"
    assert await config.credentials.authorization() is None, "a client certificate, no token"


async def test_a_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    path = kubeconfig(
        tmp_path / "k",
        "files",
        "https://127.0.0.1:6443",
        {"tokenFile": "token"},
        **{"current-context": "files"},
    )
    credentials = Config.from_kubeconfig(path).credentials
    assert isinstance(credentials, TokenFile), "relative to the kubeconfig's folder"
    assert await credentials.authorization() == "Bearer first"
    token.write_text("second-and-longer\n")
    assert await credentials.authorization() == "Bearer second-and-longer"
    # Read between a writer's truncate and its write: the token of before stands, the next read takes the new one.
    token.write_text("")
    assert await credentials.authorization() == "Bearer second-and-longer"
    token.write_text("third\n")
    assert await credentials.authorization() == "Bearer third"
    never = tmp_path / "never-written"
    never.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        await TokenFile(never).authorization()  # no token before: nothing to stand on


async def test_an_exec_plugin_runs_again_after_a_401(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    plugin = tmp_path / "plugin"
    plugin.write_text(
        "#!/bin/sh\n"
        f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        '"status":{"token":"token-%s"}}\' "$n"\n'
    )
    plugin.chmod(0o755)
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin)}}
    path = kubeconfig(
        tmp_path / "k", "exec", "https://127.0.0.1:6443", exec_user, **{"current-context": "exec"}
    )
    credentials = Config.from_kubeconfig(path).credentials
    assert isinstance(credentials, LoadedCredentials)
    assert await credentials.authorization() == "Bearer token-1"
    assert await credentials.authorization() == "Bearer token-1", "kept until it expires or is refused"
    assert await credentials.refreshed(), "a 401: the plugin runs again"
    assert await credentials.authorization() == "Bearer token-2"


def test_in_a_pod_the_service_account_is_read_without_the_official_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text("token-1\n")
    (account / "namespace").write_text("ksquad-system")
    (account / "ca.crt").write_bytes(Pki(tmp_path / "pki").ca.read_bytes())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = Config.in_cluster(account)
    assert (config.server, config.namespace) == ("https://10.96.0.1:443", "ksquad-system")
    assert isinstance(config.credentials, TokenFile) and config.credentials.path == account / "token"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert Config.in_cluster(account).server == "https://[fd00::1]:443"

    (account / "token").write_text("")
    with pytest.raises(ConfigError, match="token is missing or empty"):
        Config.in_cluster(account)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    with pytest.raises(ConfigError, match="KUBERNETES_SERVICE_HOST/PORT are not set"):
        Config.in_cluster(account)


def test_ksquads_processes_do_not_import_the_official_client_until_a_kubeconfig_is_read() -> None:
    """Its generated API client costs each process that imports it ~10 MB (worker.main: 101 MB max RSS, 112 with it); only a kubeconfig needs it."""
    probe = (
        "import sys, worker.main, crd_bridge.main, api.cluster, kube; "
        "print(sorted(m for m in sys.modules if m == 'kubernetes' or m.startswith('kubernetes.')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
