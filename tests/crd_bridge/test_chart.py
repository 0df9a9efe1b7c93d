"""The Helm chart lints clean and renders what production needs."""

import subprocess

from tests.cluster.controlplane import cached_binaries_dir
from tests.support import chart

VALUES = {
    "namespaces": ["payments", "search"],
    "temporal": {"address": "ksquad.a2b3c.tmprl.cloud:7233", "namespace": "ksquad.a2b3c",
                 "apiKeySecret": {"name": "temporal-cloud", "key": "apiKey"}},
    "pools": [{"name": "default", "namespace": "payments", "replicas": 3, "credentials": ["openai-key"]}],
    "sandbox": {"network": {"egress": [{"cidr": "203.0.113.0/24", "ports": [443]}]}},
}  # fmt: skip


def test_helm_lint_is_clean() -> None:
    done = subprocess.run([str(cached_binaries_dir() / "helm"), "lint", "--strict", str(chart.CHART),
                           "--set", "namespaces={payments}"], capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout
    assert "[ERROR]" not in done.stdout


def test_deployments_have_probes_resources_and_a_locked_down_security_context() -> None:
    docs = chart.render(VALUES)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {"ksquad-bridge", "ksquad-worker"}
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["resources"]["requests"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}  # fmt: skip
        env = {e["name"]: e for e in container["env"]}
        assert env["KSQUAD_TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"] == {
            "name": "temporal-cloud",
            "key": "apiKey",
        }
    worker_env = {
        e["name"]: e for e in deployments["ksquad-worker"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert "secretKeyRef" in worker_env["KSQUAD_DATABASE_URL"]["valueFrom"], "the DSN comes from a Secret"
    assert {(d["kind"], d["metadata"].get("namespace")) for d in docs if d["kind"] in ("Role", "NetworkPolicy")} >= {
        ("Role", "payments"), ("Role", "search"), ("NetworkPolicy", "payments"), ("NetworkPolicy", "search")}  # fmt: skip
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")], "nothing cluster-wide"


def test_the_codec_key_is_mounted_from_its_secret_into_every_process_that_talks_to_temporal() -> None:
    with_codec = chart.render({**VALUES, "codec": {"keySecret": {"name": "ksquad-codec", "key": "key"}}})
    for deployment in (d for d in with_codec if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["KSQUAD_CODEC_KEY_FILE"] == "/var/run/ksquad/codec/key"
        assert {"name": "codec-key", "mountPath": "/var/run/ksquad/codec", "readOnly": True} in container[
            "volumeMounts"
        ]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "codec-key"]
        assert volume["secret"] == {"secretName": "ksquad-codec", "defaultMode": 0o440}, (
            "referenced, never copied"
        )
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    without = chart.render(VALUES)
    for deployment in (d for d in without if d["kind"] == "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "KSQUAD_CODEC_KEY_FILE" not in {e["name"] for e in container["env"]}
