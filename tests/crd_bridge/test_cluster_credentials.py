"""Cluster credentials as users have them, on the test control plane: a kubeconfig whose user is an exec
credential plugin (how EKS, GKE, AKS and OIDC logins hand out tokens) works for the bridge and the CLI, and a
token rotated on disk is what the next requests carry, without a restart (the API server's audit log says
which token each request came with)."""

import base64
import json
from pathlib import Path
from typing import Any

from testbed import chart
from testbed.agents import ModelEndpoint
from testbed.controlplane import write_kubeconfig
from tests.crd_bridge.conftest import RUN_API, Stack, StackFactory
from tests.support.dev import ksquad


def service_account_token(stack: Stack, account: str) -> str:
    return stack.kubectl(
        "create", "token", account, "-n", chart.RELEASE_NAMESPACE, "--duration=2h"
    ).stdout.strip()


def jti(token: str) -> str:
    """The token's id, which the API server records for each request as its credential-id."""
    claims = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["jti"])


def exec_plugin(root: Path, token_file: Path) -> tuple[Path, Path]:
    """A credential plugin as kubectl runs one: it prints an ExecCredential holding the token in `token_file`,
    and notes each time it runs."""
    calls = root / "plugin-calls"
    plugin = root / "credential-plugin"
    plugin.write_text(
        "#!/bin/sh\n"
        f"echo run >> {calls}\n"
        '[ "$(echo "$KUBERNETES_EXEC_INFO" | grep -c ExecCredential)" = 1 ] || exit 3\n'
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential",'
        f'"status":{{"token":"%s"}}}}\' "$(cat {token_file})"\n'
    )
    plugin.chmod(0o755)
    return plugin, calls


def run_doc(name: str) -> dict[str, Any]:
    return {"apiVersion": RUN_API, "kind": "Run", "metadata": {"name": name}, "spec": {"agents": ["dev-1"]}}


async def test_an_exec_credential_plugin_authenticates_the_bridge_and_the_cli(
    start_stack: StackFactory, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "done"})
    stack = await start_stack(bridge=False)
    token_file = tmp_path / "bridge-token"
    token_file.write_text(service_account_token(stack, "ksquad-bridge"))
    plugin, calls = exec_plugin(tmp_path, token_file)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": str(plugin),
            "interactiveMode": "Never",
        }
    }
    kubeconfig = write_kubeconfig(
        tmp_path / "exec.kubeconfig", stack.cluster.server, stack.cluster.pki.ca, user, stack.namespace
    )
    stack.kubeconfigs["bridge"] = kubeconfig
    await stack.start("bridge")
    stack.apply(*stack.resources(model), run_doc("through-a-plugin"))
    run = await stack.wait_phase("through-a-plugin", {"Succeeded", "Failed"})
    assert run["status"]["phase"] == "Succeeded", run["status"]
    assert calls.read_text().count("run") >= 1, "the bridge's requests carried the plugin's token"

    # The CLI with the same kubeconfig: no -n, so the context's namespace.
    before = calls.read_text().count("run")
    listed = await ksquad(tmp_path, "runs", "list", "--kubeconfig", str(kubeconfig), "-o", "json")
    assert listed.code == 0, listed.err
    assert [r["metadata"]["name"] for r in listed.json()["items"]] == ["through-a-plugin"]
    assert calls.read_text().count("run") > before, "the CLI ran the plugin"


async def test_a_token_rotated_on_disk_is_used_by_the_next_requests_without_a_restart(
    start_stack: StackFactory, model: ModelEndpoint, tmp_path: Path
) -> None:
    model.script("dev-model", {"text": "done"})
    stack = await start_stack(bridge=False)
    token_file = tmp_path / "bridge-token"
    first = service_account_token(stack, "ksquad-bridge")
    token_file.write_text(first)
    stack.kubeconfigs["bridge"] = write_kubeconfig(
        tmp_path / "token-file.kubeconfig",
        stack.cluster.server,
        stack.cluster.pki.ca,
        {"tokenFile": str(token_file)},
        stack.namespace,
    )
    bridge = await stack.start("bridge")
    stack.apply(*stack.resources(model), run_doc("before"))
    assert (await stack.wait_phase("before", {"Succeeded", "Failed"}))["status"]["phase"] == "Succeeded"
    assert jti(first) in credential_ids(stack, "before")

    second = service_account_token(stack, "ksquad-bridge")  # what the kubelet does to a projected token
    token_file.write_text(second)
    stack.apply(run_doc("after"))
    assert (await stack.wait_phase("after", {"Succeeded", "Failed"}))["status"]["phase"] == "Succeeded"
    assert bridge.poll() is None, "the same bridge process"
    after = credential_ids(stack, "after")
    assert jti(second) in after and jti(first) not in after, after


def credential_ids(stack: Stack, run: str) -> set[str]:
    """The token ids of the bridge's writes to the Run `run` (its status), from the audit log."""
    found = set()
    for line in stack.cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        user = event.get("user") or {}
        if (
            ref.get("resource") == "runs"
            and ref.get("name") == run
            and ref.get("namespace") == stack.namespace
            and user.get("username", "").endswith(":ksquad-bridge")
        ):
            for credential in (user.get("extra") or {}).get("authentication.kubernetes.io/credential-id", []):
                found.add(credential.removeprefix("JTI="))
    return found
