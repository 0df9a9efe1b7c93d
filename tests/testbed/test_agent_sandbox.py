"""agent-sandbox (testbed/agent_sandbox.py) on the test cluster's real node: a SandboxWarmPool of a SandboxTemplate
running the reference agent keeps a ready Sandbox; a SandboxClaim adopts it (the same pod, now owned through the
claim), the agent answers on the pod's address, the pool makes a replacement, and deleting the claim removes the
Sandbox and its pod."""

from typing import Any

import httpx

from testbed import agent_sandbox
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE
from tests.testbed.test_control_plane import apply, get, wait_for

EXTENSIONS = "extensions.agents.x-k8s.io/v1beta1"


def template(name: str) -> dict[str, Any]:
    return {
        "apiVersion": EXTENSIONS,
        "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "networkPolicyManagement": "Unmanaged",  # the platform's (ksquad's chart brings its own)
            "podTemplate": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                    "containers": [
                        {
                            "name": "agent",
                            "image": AGENT_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["ksquad-agent"],
                            "args": ["--host", "$(POD_IP)", "--port", "8080"],
                            "env": [
                                {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                            ],
                            "readinessProbe": {
                                "httpGet": {"path": "/readyz", "port": 8080},
                                "periodSeconds": 1,
                            },
                            "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                        }
                    ],
                },
            },
        },
    }


def ready(obj: dict[str, Any]) -> bool:
    return any(
        c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", [])
    )


def controller_of(obj: dict[str, Any]) -> dict[str, Any]:
    owners: list[dict[str, Any]] = [
        o for o in obj["metadata"].get("ownerReferences", []) if o.get("controller")
    ]
    assert len(owners) == 1, obj["metadata"]
    return owners[0]


def test_a_claim_adopts_a_warm_sandbox_whose_agent_answers_and_its_deletion_removes_the_pod(
    ksquad_cluster: ControlPlane, namespace: str
) -> None:
    cluster = ksquad_cluster
    agent_sandbox.start(cluster)
    apply(cluster, namespace, template("agent"))
    apply(
        cluster,
        namespace,
        {
            "apiVersion": EXTENSIONS,
            "kind": "SandboxWarmPool",
            "metadata": {"name": "warm"},
            "spec": {"replicas": 1, "sandboxTemplateRef": {"name": "agent"}},
        },
    )
    wait_for(
        "the pool's sandbox to be ready",
        lambda: (
            get(cluster, "sandboxwarmpools", "warm", "-n", namespace).get("status", {}).get("readyReplicas")
            == 1
        ),
        timeout=120,
    )
    (warm,) = get(cluster, "sandboxes", "-n", namespace)["items"]
    apply(
        cluster,
        namespace,
        {
            "apiVersion": EXTENSIONS,
            "kind": "SandboxClaim",
            "metadata": {"name": "attempt-1"},
            "spec": {"warmPoolRef": {"name": "warm"}},
        },
    )

    def claim_ready() -> dict[str, Any] | None:
        claim: dict[str, Any] = get(cluster, "sandboxclaims", "attempt-1", "-n", namespace)
        return claim if ready(claim) else None

    claim = wait_for("the claim to be ready", claim_ready, timeout=60)
    bound = claim["status"]["sandbox"]
    assert bound["name"] == warm["metadata"]["name"], "adopted from the pool, not made anew"
    sandbox = get(cluster, "sandbox", bound["name"], "-n", namespace)
    assert controller_of(sandbox)["uid"] == claim["metadata"]["uid"], "the claim owns it now"
    pod = get(cluster, "pod", bound["name"], "-n", namespace)
    assert controller_of(pod)["uid"] == sandbox["metadata"]["uid"]
    assert pod["metadata"]["labels"]["agents.x-k8s.io/claim-uid"] == claim["metadata"]["uid"]
    assert bound["podIPs"] == [pod["status"]["podIP"]]
    answer = httpx.get(f"http://{pod['status']['podIP']}:8080/readyz", timeout=10)
    assert answer.status_code == 200 and answer.json()["ready"] is True

    wait_for(
        "the pool to make a replacement",
        lambda: any(
            s["metadata"]["name"] != bound["name"]
            for s in get(cluster, "sandboxes", "-n", namespace)["items"]
        ),
        timeout=60,
    )
    cluster.kubectl("delete", "sandboxclaim", "attempt-1", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for(
        "the claimed sandbox and its pod to be gone",
        lambda: (
            not cluster.kubectl(
                "get", "pod", bound["name"], "-n", namespace, "--ignore-not-found", "-o", "name"
            ).stdout
            and not cluster.kubectl(
                "get", "sandbox", bound["name"], "-n", namespace, "--ignore-not-found", "-o", "name"
            ).stdout
        ),
        timeout=90,
    )
