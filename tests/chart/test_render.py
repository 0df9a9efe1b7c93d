"""The Helm chart lints clean and renders what production needs."""

import base64
import json
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from activities.sandboxes import SandboxSettings, job_manifest
from testbed import chart
from testbed.controlplane import cached_binaries_dir
from workflows.contract import (
    CredentialRef,
    ExecutionContract,
    ModelRef,
    ResolvedAgent,
    RunIdentity,
    SkillRequirements,
    SkillSpec,
)
from workflows.spec import SandboxPolicy

ROOT = Path(__file__).parents[2]
VALUES = {
    "namespaces": ["payments", "search"],
    "temporal": {
        "address": "ksquad.a2b3c.tmprl.cloud:7233",
        "namespace": "ksquad.a2b3c",
        "apiKeySecret": {"name": "temporal-cloud", "key": "apiKey"},
    },
    "pools": [{"name": "default", "namespace": "payments", "replicas": 3, "credentials": ["openai-key"]}],
    "sandbox": {"network": {"egress": [{"cidr": "203.0.113.0/24", "ports": [443]}]}},
}


# What the chart makes cluster-wide without api.url.
CLUSTER_WIDE = {
    # ksquad-api asks the API server who a caller is and what they may do: the built-in delegator role
    ("ClusterRoleBinding", f"ksquad-api-auth-delegator-{chart.RELEASE_NAMESPACE}"),
    # for people, not for ksquad: who may read decoded payloads with their own token
    ("ClusterRole", f"ksquad-codec-decoder-{chart.RELEASE_NAMESPACE}"),
    # for people: work items and squad memory, aggregated into the built-in edit/admin and view roles (no ServiceAccount's)
    ("ClusterRole", f"ksquad-workitems-edit-{chart.RELEASE_NAMESPACE}"),
    ("ClusterRole", f"ksquad-workitems-view-{chart.RELEASE_NAMESPACE}"),
}


def test_helm_lint_is_clean() -> None:
    done = subprocess.run(
        [
            str(cached_binaries_dir() / "helm"),
            "lint",
            "--strict",
            str(chart.CHART),
            "--set",
            "namespaces={payments}",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARNING]" not in done.stdout
    assert "[ERROR]" not in done.stdout


def test_deployments_have_probes_resources_and_a_locked_down_security_context() -> None:
    docs = chart.render(VALUES)
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert set(deployments) == {"ksquad-api", "ksquad-bridge", "ksquad-worker"}
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["resources"]["requests"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }
        env = {e["name"]: e for e in container["env"]}
        assert "secretKeyRef" in env["KSQUAD_DATABASE_URL"]["valueFrom"], "the DSN comes from a Secret"
        if deployment["metadata"]["name"] != "ksquad-api":  # the API talks to no Temporal
            assert env["KSQUAD_TEMPORAL_API_KEY"]["valueFrom"]["secretKeyRef"] == {
                "name": "temporal-cloud",
                "key": "apiKey",
            }
    worker_env = {
        e["name"]: e for e in deployments["ksquad-worker"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert "secretKeyRef" in worker_env["KSQUAD_DATABASE_URL"]["valueFrom"], "the DSN comes from a Secret"
    assert {
        (d["kind"], d["metadata"].get("namespace")) for d in docs if d["kind"] in ("Role", "NetworkPolicy")
    } >= {
        ("Role", "payments"),
        ("Role", "search"),
        ("NetworkPolicy", "payments"),
        ("NetworkPolicy", "search"),
    }
    cluster_wide = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].startswith("Cluster")}
    assert cluster_wide == CLUSTER_WIDE
    aggregated = [
        (sorted(k for k in d["metadata"]["labels"] if k.startswith("rbac.authorization.k8s.io/")), d["rules"])
        for d in docs
        if d["kind"] == "ClusterRole" and "workitems" in d["metadata"]["name"]
    ]
    assert aggregated == [
        (
            ["rbac.authorization.k8s.io/aggregate-to-admin", "rbac.authorization.k8s.io/aggregate-to-edit"],
            [
                {
                    "apiGroups": ["ksquad.io"],
                    "resources": ["workitems"],
                    "verbs": ["get", "list", "create", "update"],
                },
                {
                    "apiGroups": ["ksquad.io"],
                    "resources": ["teams/memory", "projects/memory"],
                    "verbs": ["get", "update"],
                },
            ],
        ),
        (
            ["rbac.authorization.k8s.io/aggregate-to-view"],
            [
                {"apiGroups": ["ksquad.io"], "resources": ["workitems"], "verbs": ["get", "list"]},
                {
                    "apiGroups": ["ksquad.io"],
                    "resources": ["teams/memory", "projects/memory"],
                    "verbs": ["get"],
                },
            ],
        ),
    ], "people's grants only: edit/admin write items and squad memory, view reads them"
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == "system:auth-delegator"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "ksquad-api", "namespace": chart.RELEASE_NAMESPACE}
    ]


def test_the_codec_key_ring_is_mounted_from_its_secret_into_every_process_that_talks_to_temporal() -> None:
    with_codec = chart.render({**VALUES, "codec": {"keySecret": {"name": "ksquad-codec", "key": "key"}}})
    every = {"ksquad-api", "ksquad-bridge", "ksquad-worker"}
    assert {d["metadata"]["name"] for d in with_codec if d["kind"] == "Deployment"} == every
    for deployment in (d for d in with_codec if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["KSQUAD_CODEC_KEY_FILE"] == "/var/run/ksquad/codec/key", "the active key encrypts"
        assert env["KSQUAD_CODEC_KEYS"] == "/var/run/ksquad/codec", "every key of the Secret decrypts"
        assert {"name": "codec-key", "mountPath": "/var/run/ksquad/codec", "readOnly": True} in container[
            "volumeMounts"
        ]
        (volume,) = [v for v in pod["volumes"] if v["name"] == "codec-key"]
        assert volume["secret"] == {"secretName": "ksquad-codec", "defaultMode": 0o440}, (
            "referenced, never copied"
        )
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
    without = chart.render(VALUES)
    assert {d["metadata"]["name"] for d in without if d["kind"] == "Deployment"} == every
    for deployment in (d for d in without if d["kind"] == "Deployment"):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "KSQUAD_CODEC_KEY_FILE" not in {e["name"] for e in container["env"]}


def test_the_item_token_key_reaches_the_worker_and_the_api_alone_and_the_worker_knows_the_api() -> None:
    docs = chart.render(VALUES)
    (secret,) = [
        d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].endswith("-item-token-key")
    ]
    key_file = base64.b64decode(secret["data"]["key"])  # what the pods read: 32 random bytes, base64
    assert len(base64.b64decode(key_file, validate=True)) == 32
    holders = {}
    for deployment in (d for d in docs if d["kind"] == "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        holders[deployment["metadata"]["name"]] = (secret["metadata"]["name"] in secrets, env)
    assert {name for name, (held, _) in holders.items() if held} == {"ksquad-worker", "ksquad-api"}
    for name in ("ksquad-worker", "ksquad-api"):
        assert holders[name][1]["KSQUAD_ITEM_TOKEN_KEY_FILE"] == "/var/run/ksquad/item-token/key"
    url = f"https://ksquad-api.{chart.RELEASE_NAMESPACE}.svc:8443"
    assert holders["ksquad-worker"][1]["KSQUAD_ITEM_API_URL"] == url, "the listener for sandboxes, over TLS"
    without = chart.render({**VALUES, "api": {"enabled": False}})
    assert not [d for d in without if d["kind"] == "Secret" and "item-token" in d["metadata"]["name"]]
    (worker,) = [d for d in without if d["kind"] == "Deployment" and d["metadata"]["name"] == "ksquad-worker"]
    names = {e["name"] for e in worker["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert not names & {"KSQUAD_ITEM_TOKEN_KEY_FILE", "KSQUAD_ITEM_API_URL", "KSQUAD_ITEM_API_CA_FILE"}, (
        "no API: no way to an item"
    )
    assert not [d for d in without if d["kind"] == "Secret" and "items-tls" in d["metadata"]["name"]]


def _items_tls(docs: list[dict[str, Any]]) -> tuple[x509.Certificate, x509.Certificate, bytes]:
    (secret,) = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "ksquad-items-tls"]
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    return (
        x509.load_pem_x509_certificate(data["ca.crt"]),
        x509.load_pem_x509_certificate(data["tls.crt"]),
        data["tls.key"],
    )


def _names(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(names.get_values_for_type(x509.DNSName)), {
        str(a) for a in names.get_values_for_type(x509.IPAddress)
    }


def test_sandboxes_reach_their_item_over_tls_with_a_ca_the_worker_hands_them_and_never_the_listeners_key() -> (
    None
):
    docs = chart.render(VALUES)
    ca, cert, key = _items_tls(docs)
    cert.verify_directly_issued_by(ca)  # what the agent checks, trusting this CA alone
    ns = chart.RELEASE_NAMESPACE
    dns, ips = _names(cert)
    assert dns == {
        "ksquad-api",
        f"ksquad-api.{ns}",
        f"ksquad-api.{ns}.svc",
        f"ksquad-api.{ns}.svc.cluster.local",
    }
    assert ips == set()
    assert b"PRIVATE KEY" in key
    pods = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in docs if d["kind"] == "Deployment"}
    mounted = {
        name: [
            v["secret"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "ksquad-items-tls"
        ]
        for name, pod in pods.items()
    }
    assert {name for name, found in mounted.items() if found} == {"ksquad-worker", "ksquad-api"}
    assert [i["key"] for i in mounted["ksquad-worker"][0]["items"]] == ["ca.crt"], "the worker: the CA alone"
    assert [i["key"] for i in mounted["ksquad-api"][0]["items"]] == ["tls.crt", "tls.key"]
    worker = {e["name"]: e.get("value") for e in pods["ksquad-worker"]["containers"][0]["env"]}
    assert worker["KSQUAD_ITEM_API_CA_FILE"] == "/var/run/ksquad/items-ca/ca.crt"
    api = pods["ksquad-api"]["containers"][0]
    env = {e["name"]: e.get("value") for e in api["env"]}
    assert env["KSQUAD_API_ITEMS_PORT"] == "8443"
    assert env["KSQUAD_API_ITEMS_TLS_CERT_FILE"] == "/var/run/ksquad/items-tls/tls.crt"
    assert {"name": "items", "containerPort": 8443} in api["ports"]
    (service,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "ksquad-api"]
    assert {"name": "items", "port": 8443, "targetPort": "items"} in service["spec"]["ports"]
    # A fixed cluster address and an items URL of another host: the certificate names both.
    fixed = chart.render(
        {
            **VALUES,
            "api": {"service": {"clusterIP": "10.0.0.80"}, "itemsUrl": "https://items.example.com:8443"},
        }
    )
    dns, ips = _names(_items_tls(fixed)[1])
    assert ips == {"10.0.0.80"} and "items.example.com" in dns
    by_ip = chart.render({**VALUES, "api": {"itemsUrl": "https://10.0.0.81:8443"}})
    assert _names(_items_tls(by_ip)[1])[1] == {"10.0.0.81"}
    # A Secret of one's own (cert-manager's): the chart makes none and mounts it.
    own = chart.render({**VALUES, "api": {"itemsTlsSecret": "items-cert"}})
    assert not [d for d in own if d["kind"] == "Secret" and "items-tls" in d["metadata"]["name"]]
    (worker_pod,) = [
        d["spec"]["template"]["spec"]
        for d in own
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "ksquad-worker"
    ]
    assert {
        "secretName": "items-cert",
        "defaultMode": 0o440,
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    } in [v.get("secret") for v in worker_pod["volumes"]]


def test_the_default_images_are_the_projects_version_built_by_make_images() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == project == meta["version"]
    docs = chart.render(VALUES)
    images = {
        c["image"]
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/ksquad/ksquad:{project}"}
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ksquad-sandbox"]
    assert yaml.safe_load(config["data"]["sandbox.yaml"])["image"] == f"ghcr.io/ksquad/ksquad-agent:{project}"
    (pool,) = [d for d in docs if d["kind"] == "ReplicaSet"]
    assert (
        pool["spec"]["template"]["spec"]["containers"][0]["image"] == f"ghcr.io/ksquad/ksquad-agent:{project}"
    )


def test_a_cluster_without_mutating_admission_policy_v1_gets_the_validating_policy_alone() -> None:
    older = chart.render(VALUES, kube_version="1.33.0", api_versions=[])
    kinds = {d["kind"] for d in older}
    assert not kinds & {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    (policy,) = [
        d
        for d in older
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == "ksquad-triggered-by-immutable"
    ]
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert any("request.userInfo.username" in v["expression"] for v in policy["spec"]["validations"]), (
        "a Run may carry only its own creator's name"
    )
    newer = {d["kind"] for d in chart.render(VALUES)}
    assert {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding", "ValidatingAdmissionPolicy"} <= newer


def test_kubernetes_older_than_the_charts_kube_version_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"chart requires kubeVersion: >=1.30.0-0"):
        chart.render(VALUES, kube_version="1.29.4", api_versions=[])


def test_values_that_cannot_work_are_refused_with_what_to_set() -> None:
    with pytest.raises(RuntimeError, match="namespaces is empty: set the namespaces your Runs live in"):
        chart.render({})
    with pytest.raises(RuntimeError, match=r"temporal\.address is empty"):
        chart.render({**VALUES, "temporal": {"address": ""}})


def test_the_release_namespace_is_never_a_run_namespace() -> None:
    with pytest.raises(RuntimeError, match="namespaces must not include the release namespace ksquad-tests"):
        chart.render({"namespaces": [chart.RELEASE_NAMESPACE, "payments"]})


def test_the_allow_lists_reach_the_bridge_and_the_admission_policies() -> None:
    docs = chart.render(
        {
            **VALUES,
            "agents": {"allowedEndpoints": ["agents.example.com", "10.20.0.0/16"]},
            "sandbox": {"allowedImages": ["registry.example.com/agent:2"]},
        }
    )
    (bridge,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "ksquad-bridge"]
    env = {e["name"]: e.get("value") for e in bridge["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KSQUAD_ALLOWED_IMAGES"] == "ghcr.io/ksquad/ksquad-agent:0.1.0,registry.example.com/agent:2"
    assert env["KSQUAD_ALLOWED_RUNTIME_CLASSES"] == "gvisor"
    assert env["KSQUAD_ALLOWED_AGENT_ENDPOINTS"] == "agents.example.com,10.20.0.0/16"
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    assert {"ksquad-allowed-sandboxes", "ksquad-worker-makes-sandboxes"} <= set(policies)
    (binding,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
        and d["metadata"]["name"] == "ksquad-allowed-sandboxes"
    ]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "payments",
        "search",
    ]
    worker = policies["ksquad-worker-makes-sandboxes"]["spec"]
    assert worker["matchConditions"][0]["expression"].endswith(
        "'system:serviceaccount:ksquad-tests:ksquad-worker'"
    )


def test_the_worker_policy_knows_each_container_as_job_manifest_makes_it_from_the_same_values() -> None:
    """The admission policy describes a sandbox's containers from the chart's values, job_manifest from the worker's
    ConfigMap made of the same values: a toolchain's or sidecar's name, image, command, args and environment must
    agree, or a Run needing it would be refused."""
    toolchain = {"image": "registry.example.com/node:20", "command": ["cp", "-r", "/node"], "env": {"A": "1"}}
    sidecar = {"image": "registry.example.com/pg:16", "args": ["-c", "fsync=off"]}
    sandbox = {"allowedImages": ["registry.example.com/agent:2"], "port": 9090, "command": ["agent", "serve"]}
    docs = chart.render(
        {**VALUES, "sandbox": {**sandbox, "toolchains": {"Node.js": toolchain}, "sidecars": {"pg": sidecar}}}
    )
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ksquad-sandbox"]
    settings = SandboxSettings.model_validate(yaml.safe_load(config["data"]["sandbox.yaml"]))
    model = ModelRef(name="m", credential=CredentialRef(secret_name="model-key"))
    skill = SkillSpec(name="s", requires=SkillRequirements(toolchains=["Node.js"], sidecars=["pg"]))
    agent = ResolvedAgent(name="a", model=model, skills=[skill], image="registry.example.com/agent:2")
    run = RunIdentity(namespace="payments", name="r", uid="u", attempt=1, fence=1)
    job = job_manifest(
        ExecutionContract(run=run, agent=agent, model=model), SandboxPolicy(), settings, 60, "0" * 64
    )
    (policy,) = [
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy"
        and d["metadata"]["name"] == "ksquad-worker-makes-sandboxes"
    ]
    known = {
        v["name"]: json.loads(v["expression"])
        for v in policy["spec"]["variables"]
        if v["name"] in ("images", "commands", "args", "env")
    }
    pod = job["spec"]["template"]["spec"]
    containers = pod["initContainers"] + pod["containers"]
    assert (
        {c["name"] for c in containers}
        == set(known["images"])
        == {"agent", "toolchain-node-js", "sidecar-pg"}
    )
    for c in containers:
        name = c["name"]
        assert c["image"] in known["images"][name]
        assert (c.get("command", []), c.get("args", [])) == (known["commands"][name], known["args"][name])
        literal = {e["name"]: e["value"] for e in c.get("env", []) if "valueFrom" not in e}
        assert literal == known["env"][name], name
    assert "ghcr.io/ksquad/ksquad-agent:0.1.0" in known["images"]["agent"], "the agent image, always"


def test_a_pod_security_level_that_does_not_exist_is_refused() -> None:
    with pytest.raises(
        RuntimeError, match=r"sandbox\.podSecurity\.enforce is strict: set restricted, baseline"
    ):
        chart.render({**VALUES, "sandbox": {"podSecurity": {"enforce": "strict"}}})
    assert chart.render({**VALUES, "sandbox": {"podSecurity": {"enforce": ""}}}), "the check can be skipped"


def test_the_bridge_survives_a_node_drain_and_the_worker_rolls_when_its_sandbox_settings_change() -> None:
    docs = chart.render(VALUES)
    (budget,) = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 1
    (bridge,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "ksquad-bridge"]
    anti = bridge["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert (
        anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"]
        == "kubernetes.io/hostname"
    )

    def checksum(values: dict[str, Any]) -> str:
        (worker,) = [
            d
            for d in chart.render(values)
            if d["kind"] == "Deployment" and d["metadata"]["name"] == "ksquad-worker"
        ]
        return str(worker["spec"]["template"]["metadata"]["annotations"]["checksum/sandbox-config"])

    assert checksum(VALUES) != checksum({**VALUES, "sandbox": {"runtimeClasses": {"gvisor": "gvisor-v2"}}})


def _sandbox_policy(egress: list[dict[str, Any]], api: bool = True, **network: Any) -> dict[str, Any]:
    docs = chart.render(
        {**VALUES, "api": {"enabled": api}, "sandbox": {"network": {"egress": egress, **network}}}
    )
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["namespace"] == "payments"]
    spec: dict[str, Any] = policy["spec"]
    return spec


def test_sandboxes_may_ask_only_the_cluster_dns_in_kube_system_and_ksquad_api_for_their_item() -> None:
    spec = _sandbox_policy([])
    assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/component": "sandbox"}}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    # One peer each (namespace AND pod selector): a pod labelled k8s-app=kube-dns (or component=api) elsewhere is
    # neither the cluster DNS nor ksquad-api.
    dns = {
        "to": [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
            }
        ],
        "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}],
    }
    assert spec["egress"] == [
        dns,
        {
            "to": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": chart.RELEASE_NAMESPACE}
                    },
                    "podSelector": {"matchLabels": {"app.kubernetes.io/component": "api"}},
                }
            ],
            "ports": [
                {"port": 8443, "protocol": "TCP"}
            ],  # the listener for sandboxes, not the one for people
        },
    ]
    assert _sandbox_policy([], api=False)["egress"] == [dns], "no API, no way out to it"
    (ingress,) = spec["ingress"]
    assert ingress["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": chart.RELEASE_NAMESPACE}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}},
        }
    ]
    # A cluster whose DNS runs elsewhere says so (a label of the default is dropped by setting it to null: Helm
    # merges maps).
    other = _sandbox_policy(
        [],
        dns={
            "namespace": "openshift-dns",
            "podLabels": {"k8s-app": None, "dns.operator.openshift.io/daemonset-dns": "default"},
        },
    )
    assert other["egress"][0]["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}},
            "podSelector": {"matchLabels": {"dns.operator.openshift.io/daemonset-dns": "default"}},
        }
    ]


@pytest.mark.parametrize(
    ("cidr", "excepted"),
    [
        ("0.0.0.0/0", ["169.254.0.0/16"]),
        ("128.0.0.0/1", ["169.254.0.0/16"]),
        ("169.0.0.0/8", ["169.254.0.0/16"]),
        ("169.254.0.0/15", ["169.254.0.0/16"]),
        ("169.252.0.0/15", None),  # next to it, not over it
        ("0.0.0.0/1", None),
        ("203.0.113.0/24", None),
        ("169.254.169.254/32", None),  # named on purpose (a node-local DNS cache, say): the operator's call
        ("::/0", ["fe80::/10"]),
        ("fe80::/9", ["fe80::/10"]),
        ("fe00::/7", ["fe80::/10"]),
        ("FE00::/7", ["fe80::/10"]),
        ("fc00::/7", None),  # unique local, beside link-local
        ("2000::/3", None),
        ("2001:db8::/32", None),
    ],
)
def test_egress_cidrs_never_include_the_link_local_metadata_addresses(
    cidr: str, excepted: list[str] | None
) -> None:
    spec = _sandbox_policy([{"cidr": cidr, "ports": [443]}], api=False)
    (dns, configured) = spec["egress"]
    assert dns["ports"][0] == {"port": 53, "protocol": "UDP"}
    expected: dict[str, Any] = {"cidr": cidr} if excepted is None else {"cidr": cidr, "except": excepted}
    assert configured == {"to": [{"ipBlock": expected}], "ports": [{"port": 443, "protocol": "TCP"}]}


def test_the_uninstall_module_runs_last_of_the_packages_release() -> None:
    # tests/chart/ shares one release and its modules run in name order: a module after test_uninstall.py would
    # find no release (CI: test_work_items.py's ksquad-api "does not answer").
    modules = sorted(p.name for p in Path(__file__).parent.glob("test_*.py"))
    assert modules[-1] == "test_uninstall.py", f"{modules[-1]} runs after the release is uninstalled"


def test_api_budgets_reach_ksquad_api_as_the_settings_it_reads() -> None:
    """api.budgets in the values are the bounds ksquad-api enforces (api.cluster_settings.ApiSettings), and a malformed
    bound stops it at start naming the setting."""
    from api.budgets import Limits, RateLimits, RequestLimits
    from api.cluster_settings import budgets_from_env

    budgets = {
        "streams": {"perPerson": 4, "perNamespace": 40, "total": 400},
        "consoleRequests": {"perPerson": 3, "perNamespace": 30, "total": 300},
        "refusedTokens": {"perClient": 1, "burst": 5, "total": 10},
        "requests": {"perPerson": 2.5, "perNamespace": 25, "total": 250},
    }
    docs = chart.render({**VALUES, "api": {"budgets": budgets}})
    (api,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "ksquad-api"]
    env = {e["name"]: e.get("value") for e in api["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert budgets_from_env(env) == {
        "stream_limits": Limits(4, 40, 400),
        "console_limits": Limits(3, 30, 300),
        "refused_tokens": RateLimits(1.0, 5, 10.0),
        "requests": RequestLimits(2.5, 25.0, 250.0),
    }
    for setting, bad in (
        ("KSQUAD_API_STREAMS", "4,40"),
        ("KSQUAD_API_REFUSED_TOKENS", "1,0,10"),
        ("KSQUAD_API_REQUESTS", "20,x,400"),
    ):
        with pytest.raises(SystemExit, match=setting):
            budgets_from_env({setting: bad})


def test_a_service_monitor_scrapes_every_component_where_the_prometheus_operator_is_served() -> None:
    operator = [*chart.SERVED, "monitoring.coreos.com/v1/ServiceMonitor"]
    values = {**VALUES, "metrics": {"serviceMonitor": {"interval": "15s", "labels": {"release": "prom"}}}}
    rendered = chart.render(values, api_versions=operator)
    (monitor,) = [d for d in rendered if d["kind"] == "ServiceMonitor"]
    (service,) = [d for d in rendered if d["kind"] == "Service" and d["metadata"]["name"] == "ksquad-metrics"]
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items(), "it selects the metrics Service"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["metadata"]["labels"]["release"] == "prom", "the operator's selector labels, as given"
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["targetPort"]) == ("metrics", "health")
    pods = [d for d in rendered if d["kind"] == "Deployment"]
    assert len(pods) == 3
    for deployment in pods:  # the Service's selector finds each component, on the port it names `health`
        template = deployment["spec"]["template"]
        assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items(), deployment[
            "metadata"
        ]
        (container,) = template["spec"]["containers"]
        assert "health" in {p["name"] for p in container["ports"]}, deployment["metadata"]["name"]
    assert not [d for d in chart.render(VALUES) if d["kind"] == "ServiceMonitor"], (
        "no operator, no ServiceMonitor"
    )
    disabled = {**VALUES, "metrics": {"serviceMonitor": {"enabled": False}}}
    assert not [d for d in chart.render(disabled, api_versions=operator) if d["kind"] == "ServiceMonitor"]


def test_with_api_url_every_signed_in_user_may_read_the_locator_and_nothing_else_cluster_wide() -> None:
    """With `api.url`, `ksquad` finds ksquad-api from a ClusterRole no tenant can write: it grants nothing, and
    every signed-in user may get it and only it. The whole cluster-wide set, with the subject of each binding."""
    docs = chart.render({**VALUES, "api": {"url": "https://ksquad-api.example.com"}})
    cluster_wide = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].startswith("Cluster")}
    assert cluster_wide == CLUSTER_WIDE | {
        ("ClusterRole", "ksquad-locator"),
        ("ClusterRole", "ksquad-locator-reader"),
        ("ClusterRoleBinding", "ksquad-locator-reader"),
    }
    subjects = {
        d["metadata"]["name"]: (d["roleRef"]["name"], d["subjects"])
        for d in docs
        if d["kind"] == "ClusterRoleBinding"
    }
    assert subjects == {
        f"ksquad-api-auth-delegator-{chart.RELEASE_NAMESPACE}": (
            "system:auth-delegator",
            [{"kind": "ServiceAccount", "name": "ksquad-api", "namespace": chart.RELEASE_NAMESPACE}],
        ),
        "ksquad-locator-reader": (
            "ksquad-locator-reader",
            [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}],
        ),
    }
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert roles["ksquad-locator"]["rules"] == [], "the locator grants nothing"
    assert (
        roles["ksquad-locator"]["metadata"]["annotations"]["ksquad.io/api-url"]
        == "https://ksquad-api.example.com"
    )
    assert roles["ksquad-locator-reader"]["rules"] == [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "resourceNames": ["ksquad-locator"],
            "verbs": ["get"],
        }
    ]
