"""The test cluster runs Jobs, ReplicaSets, garbage collection and RBAC for real, and its node runs pods in
containers from ksquad's images: the pod's user, a read-only root, env and volumes from Secrets and
ConfigMaps, the projected service-account token, restarts, probes and memory limits, as a kubelet does."""

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from testbed.controlplane import ControlPlane, cached_binaries_dir
from testbed.images import KSQUAD_IMAGE
from testbed.isolate import NODE_ADDRESS

T = TypeVar("T")
PY = "python3"  # the ksquad image's Python, ksquad installed
IMAGE = KSQUAD_IMAGE


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60, interval: float = 0.2) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def get(cluster: ControlPlane, *args: str) -> Any:
    return json.loads(cluster.kubectl("get", "-o", "json", *args).stdout)


def apply(cluster: ControlPlane, namespace: str, manifest: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def test_job_runs_a_local_program_to_complete_and_its_pod_is_garbage_collected(
    cluster: ControlPlane, namespace: str
) -> None:
    cluster.kubectl(
        "create", "secret", "generic", "agent-key", "-n", namespace, "--from-literal=token=s3cret"
    )
    cluster.kubectl("create", "configmap", "settings", "-n", namespace, "--from-literal=mode=fast")
    # The program succeeds only when every env source resolved as Kubernetes defines it.
    check = (
        "import os, sys; e = os.environ;"
        "ok = (e['TOKEN'] == 's3cret' and e['MODE'] == 'fast' and e['POD'] == e['HOSTNAME']"
        " and e['POD_IP'].startswith('10.244.') and e['POD_IP'] != e['NODE_IP'] and e['GREETING'] == 'hi fast');"
        "print(dict(e)); sys.exit(0 if ok else 3)"
    )
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "hello"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": IMAGE,
                                "command": [PY, "-c", check],
                                "env": [
                                    {
                                        "name": "TOKEN",
                                        "valueFrom": {"secretKeyRef": {"name": "agent-key", "key": "token"}},
                                    },
                                    {
                                        "name": "MODE",
                                        "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}},
                                    },
                                    {
                                        "name": "POD",
                                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                                    },
                                    {
                                        "name": "POD_IP",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                    },
                                    {
                                        "name": "NODE_IP",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
                                    },
                                    {"name": "GREETING", "value": "hi $(MODE)"},
                                ],
                            }
                        ],
                    }
                },
            },
        },
    )

    def complete() -> bool:
        conditions = get(cluster, "job", "hello", "-n", namespace).get("status", {}).get("conditions", [])
        return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)

    wait_for("the Job to be Complete", complete)
    pods = get(cluster, "pods", "-n", namespace, "-l", "job-name=hello")["items"]
    assert len(pods) == 1
    assert pods[0]["status"]["phase"] == "Succeeded"
    assert pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0

    cluster.kubectl("delete", "job", "hello", "-n", namespace, "--cascade=background", "--wait=false")
    wait_for(
        "the garbage collector to delete the Job's pod",
        lambda: not get(cluster, "pods", "-n", namespace, "-l", "job-name=hello")["items"],
    )


def test_failing_program_fails_the_job_with_its_exit_code(cluster: ControlPlane, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "broken"},
            "spec": {
                "backoffLimit": 0,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "main", "image": IMAGE, "command": [PY, "-c", "raise SystemExit(7)"]}
                        ],
                    }
                },
            },
        },
    )

    def failed() -> bool:
        conditions = get(cluster, "job", "broken", "-n", namespace).get("status", {}).get("conditions", [])
        return any(c["type"] == "Failed" and c["status"] == "True" for c in conditions)

    wait_for("the Job to fail", failed)
    (pod,) = get(cluster, "pods", "-n", namespace, "-l", "job-name=broken")["items"]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (pod["status"]["phase"], terminated["exitCode"], terminated["reason"]) == ("Failed", 7, "Error")


def test_replicaset_replaces_a_pod_relabelled_out_of_its_selector(
    cluster: ControlPlane, namespace: str
) -> None:
    # Each pod serves HTTP on its own address; the readiness probe gates Ready.
    server = "import http.server, os; http.server.HTTPServer((os.environ['POD_IP'], 8080), http.server.SimpleHTTPRequestHandler).serve_forever()"
    apply(
        cluster,
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {"name": "pool"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"pool": "p1", "state": "warm"}},
                "template": {
                    "metadata": {"labels": {"pool": "p1", "state": "warm"}},
                    "spec": {
                        "terminationGracePeriodSeconds": 2,
                        "containers": [
                            {
                                "name": "agent",
                                "image": IMAGE,
                                "command": [PY, "-c", server],
                                "env": [
                                    {
                                        "name": "POD_IP",
                                        "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}},
                                    }
                                ],
                                "ports": [{"name": "http", "containerPort": 8080}],
                                "readinessProbe": {
                                    "httpGet": {"path": "/", "port": "http"},
                                    "periodSeconds": 1,
                                },
                            }
                        ],
                    },
                },
            },
        },
    )

    def ready_pods() -> list[dict[str, Any]]:
        pods = get(cluster, "pods", "-n", namespace, "-l", "pool=p1,state=warm")["items"]
        ready = [
            p
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]
        return ready if len(ready) == 2 else []

    first = wait_for("2 ready pods", ready_pods)
    ips = {p["status"]["podIP"] for p in first}
    assert len(ips) == 2, "each pod gets its own address"
    for ip in ips:  # the probe's target answers on the reported podIP
        with urllib.request.urlopen(f"http://{ip}:8080/", timeout=5) as response:
            assert response.status == 200

    bound = first[0]["metadata"]["name"]
    cluster.kubectl("label", "pod", bound, "-n", namespace, "state=bound", "--overwrite")
    second = wait_for("a replacement pod", ready_pods)
    names = {p["metadata"]["name"] for p in second}
    assert bound not in names
    assert first[1]["metadata"]["name"] in names
    released = get(cluster, "pod", bound, "-n", namespace)
    assert not released["metadata"].get("ownerReferences"), "the ReplicaSet releases the relabelled pod"

    bound_ip = first[0]["status"]["podIP"]
    cluster.kubectl("delete", "pod", bound, "-n", namespace, "--wait=true", "--timeout=30s")
    assert cluster.kubectl("get", "pod", bound, "-n", namespace, check=False).returncode != 0
    with pytest.raises(urllib.error.URLError):  # the kubelet stopped the deleted pod's container
        urllib.request.urlopen(f"http://{bound_ip}:8080/", timeout=5)


def test_rbac_denies_a_service_account_outside_its_role(cluster: ControlPlane, namespace: str) -> None:
    cluster.kubectl("create", "serviceaccount", "narrow", "-n", namespace)
    cluster.kubectl("create", "role", "pod-reader", "-n", namespace, "--verb=get,list", "--resource=pods")
    cluster.kubectl(
        "create",
        "rolebinding",
        "narrow-reads-pods",
        "-n",
        namespace,
        "--role=pod-reader",
        f"--serviceaccount={namespace}:narrow",
    )
    token = cluster.kubectl("create", "token", "narrow", "-n", namespace, "--duration=10m").stdout.strip()
    as_narrow = cluster.token_kubeconfig(f"narrow-{namespace}", token, namespace)

    def status_of(method: str, path: str) -> int:
        response = httpx.request(
            method,
            cluster.server + path,
            headers={"Authorization": f"Bearer {token}"},
            verify=ssl.create_default_context(cafile=str(cluster.pki.ca)),
            json={} if method == "POST" else None,
        )
        return response.status_code

    ns_path = f"/api/v1/namespaces/{namespace}"
    assert status_of("GET", f"{ns_path}/pods") == 200
    assert status_of("GET", f"{ns_path}/secrets") == 403
    assert status_of("GET", "/api/v1/namespaces/default/pods") == 403
    assert status_of("POST", f"{ns_path}/configmaps") == 403
    assert status_of("GET", "/api/v1/nodes") == 403

    # and kubectl, as the service account, names who was refused
    denied = cluster.kubectl("get", "secrets", kubeconfig=as_narrow, check=False)
    assert denied.returncode != 0
    assert f'User "system:serviceaccount:{namespace}:narrow" cannot list resource "secrets"' in denied.stderr


def test_helm_from_the_cache_renders_a_chart(tmp_path: Path) -> None:
    helm = str(cached_binaries_dir() / "helm")
    version = subprocess.run([helm, "version", "--template", "{{.Version}}"], capture_output=True, text=True)
    assert version.stdout.startswith("v3."), version.stderr
    subprocess.run([helm, "create", str(tmp_path / "demo")], check=True, capture_output=True)
    rendered = subprocess.run(
        [helm, "template", "demo", str(tmp_path / "demo")], check=True, capture_output=True, text=True
    )
    kinds = {doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc}
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds


def test_pods_that_cannot_start_say_why(cluster: ControlPlane, namespace: str) -> None:
    def pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "main", **container}], **spec},
        }

    sleeper = {"image": IMAGE, "command": [PY, "-c", "import time; time.sleep(60)"]}
    apply(
        cluster,
        namespace,
        pod(
            "missing-secret",
            {
                **sleeper,
                "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "token"}}}],
            },
        ),
    )
    apply(cluster, namespace, pod("image-only", {"image": "registry.example/agent:1"}))
    apply(cluster, namespace, pod("nowhere", sleeper, nodeSelector={"pool": "gpu"}))

    def waiting(name: str) -> dict[str, Any] | None:
        statuses = get(cluster, "pod", name, "-n", namespace).get("status", {}).get("containerStatuses") or []
        state = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return state if state.get("reason") not in (None, "ContainerCreating") else None

    assert waiting_for(waiting, "missing-secret") == {
        "reason": "CreateContainerConfigError",
        "message": 'secret "nope" not found',
    }
    # No registry is reachable from the test cluster: the pull fails at once.
    assert waiting_for(waiting, "image-only")["reason"] in ("ErrImagePull", "ImagePullBackOff")

    def unschedulable() -> dict[str, Any] | None:
        conditions = get(cluster, "pod", "nowhere", "-n", namespace).get("status", {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled" and c["status"] == "False"), None)

    assert wait_for("nowhere to be Unschedulable", unschedulable)["reason"] == "Unschedulable"

    # A Secret created later is picked up, as a real kubelet retries: the pod then runs.
    cluster.kubectl("create", "secret", "generic", "nope", "-n", namespace, "--from-literal=token=x")
    wait_for(
        "missing-secret to run once its Secret exists",
        lambda: get(cluster, "pod", "missing-secret", "-n", namespace)["status"].get("phase") == "Running",
    )


def waiting_for(probe: Callable[[str], dict[str, Any] | None], name: str) -> dict[str, Any]:
    return wait_for(f"{name} to report why it waits", lambda: probe(name), timeout=30)


def pod_manifest(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": IMAGE, **container}],
            **spec,
        },
    }


def finished(cluster: ControlPlane, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod: dict[str, Any] = get(cluster, "pod", name, "-n", namespace)
        return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    return wait_for(f"pod {name} to finish", done, timeout)


def logs(cluster: ControlPlane, namespace: str, name: str) -> str:
    return cluster.kubectl("logs", name, "-n", namespace).stdout


def test_a_container_runs_as_the_pods_user_on_a_read_only_root(cluster: ControlPlane, namespace: str) -> None:
    script = "id -u; id -g; touch /written 2>/dev/null && echo wrote-root || echo root-refused; touch /tmp/ok && echo wrote-tmp"
    apply(
        cluster,
        namespace,
        pod_manifest(
            "locked",
            {
                "command": ["sh", "-c", script],
                "securityContext": {
                    "readOnlyRootFilesystem": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            },
            securityContext={"runAsUser": 4242, "runAsGroup": 4343, "runAsNonRoot": True},
            volumes=[{"name": "tmp", "emptyDir": {}}],
        ),
    )
    pod = finished(cluster, namespace, "locked")
    assert pod["status"]["phase"] == "Succeeded"
    assert logs(cluster, namespace, "locked").split() == ["4242", "4343", "root-refused", "wrote-tmp"]


def test_run_as_non_root_refuses_a_root_user(cluster: ControlPlane, namespace: str) -> None:
    apply(
        cluster,
        namespace,
        pod_manifest("as-root", {"command": ["id"]}, securityContext={"runAsUser": 0, "runAsNonRoot": True}),
    )

    def refused(name: str) -> dict[str, Any] | None:
        statuses = get(cluster, "pod", name, "-n", namespace).get("status", {}).get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return waiting if waiting.get("reason") == "CreateContainerConfigError" else None

    assert "non-root" in waiting_for(refused, "as-root")["message"]


def test_a_pod_calls_the_api_server_as_its_service_account_with_the_projected_token(
    cluster: ControlPlane, namespace: str
) -> None:
    cluster.kubectl("create", "serviceaccount", "caller", "-n", namespace)
    # The kubelet projects a TokenRequest token, the cluster CA and the namespace; KUBERNETES_SERVICE_HOST/PORT
    # lead to the API server through the `kubernetes` Service (kube-proxy). SelfSubjectReview says who we are.
    check = (
        "import json, os, ssl, urllib.request; d = '/var/run/secrets/kubernetes.io/serviceaccount/';"
        "ctx = ssl.create_default_context(cafile=d + 'ca.crt');"
        "url = 'https://%s:%s/apis/authentication.k8s.io/v1/selfsubjectreviews' % (os.environ['KUBERNETES_SERVICE_HOST'], os.environ['KUBERNETES_SERVICE_PORT']);"
        "body = json.dumps({'apiVersion': 'authentication.k8s.io/v1', 'kind': 'SelfSubjectReview'}).encode();"
        "req = urllib.request.Request(url, body, {'Authorization': 'Bearer ' + open(d + 'token').read(), 'Content-Type': 'application/json'});"
        "print(json.loads(urllib.request.urlopen(req, context=ctx).read())['status']['userInfo']['username']);"
        "print(open(d + 'namespace').read())"
    )
    apply(
        cluster,
        namespace,
        pod_manifest("caller", {"command": [PY, "-c", check]}, serviceAccountName="caller"),
    )
    pod = finished(cluster, namespace, "caller")
    assert pod["status"]["phase"] == "Succeeded", logs(cluster, namespace, "caller")
    assert logs(cluster, namespace, "caller").split() == [
        f"system:serviceaccount:{namespace}:caller",
        namespace,
    ]
    token_volume = next(v for v in pod["spec"]["volumes"] if v["name"].startswith("kube-api-access-"))
    assert token_volume["projected"]["sources"][0]["serviceAccountToken"]["expirationSeconds"] > 0


def test_a_crashed_container_is_restarted_and_a_readiness_probe_gates_ready(
    cluster: ControlPlane, namespace: str
) -> None:
    # Exits 3 the first time (a file on the emptyDir remembers), then serves; Ready only once it answers.
    script = (
        "import http.server, os, sys; m = '/scratch/started';"
        "first = not os.path.exists(m); open(m, 'w').close();"
        "sys.exit(3) if first else http.server.HTTPServer(('', 8080), http.server.SimpleHTTPRequestHandler).serve_forever()"
    )
    apply(
        cluster,
        namespace,
        pod_manifest(
            "crasher",
            {
                "command": [PY, "-c", script],
                "workingDir": "/scratch",
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
            },
            restartPolicy="Always",
            volumes=[{"name": "scratch", "emptyDir": {}}],
        ),
    )

    def ready() -> dict[str, Any] | None:
        pod: dict[str, Any] = get(cluster, "pod", "crasher", "-n", namespace)
        conditions = pod.get("status", {}).get("conditions", [])
        return pod if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions) else None

    pod = wait_for("the restarted container to be Ready", ready, timeout=90)
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 1
    assert status["lastState"]["terminated"]["exitCode"] == 3


def test_a_container_over_its_memory_limit_is_oom_killed(cluster: ControlPlane, namespace: str) -> None:
    hog = "b = []\nwhile True: b.append(bytearray(16 << 20))"
    apply(
        cluster,
        namespace,
        pod_manifest(
            "hog",
            {
                "command": [PY, "-c", hog],
                "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
            },
        ),
    )
    pod = finished(cluster, namespace, "hog")
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


def test_a_changed_secret_reaches_its_mounted_volume(cluster: ControlPlane, namespace: str) -> None:
    cluster.kubectl("create", "secret", "generic", "rotating", "-n", namespace, "--from-literal=key=first")
    watch = "import time\nwhile open('/secret/key').read() != 'second': time.sleep(0.2)\nprint('saw second')"
    apply(
        cluster,
        namespace,
        pod_manifest(
            "reader",
            {
                "command": [PY, "-c", watch],
                "volumeMounts": [{"name": "s", "mountPath": "/secret", "readOnly": True}],
            },
            volumes=[{"name": "s", "secret": {"secretName": "rotating"}}],
        ),
    )
    wait_for(
        "the reader to run",
        lambda: get(cluster, "pod", "reader", "-n", namespace)["status"].get("phase") == "Running",
    )
    cluster.kubectl("patch", "secret", "rotating", "-n", namespace, "-p", '{"stringData": {"key": "second"}}')
    pod = finished(cluster, namespace, "reader", timeout=120)
    assert pod["status"]["phase"] == "Succeeded"
    assert logs(cluster, namespace, "reader").strip() == "saw second"


def test_pods_get_addresses_of_their_own_on_the_node_network(cluster: ControlPlane, namespace: str) -> None:
    for name in ("one", "two"):
        apply(
            cluster,
            namespace,
            pod_manifest(name, {"command": ["sleep", "60"]}, terminationGracePeriodSeconds=1),
        )

    def address(name: str) -> str:
        ip: str = wait_for(
            f"{name}'s address", lambda: get(cluster, "pod", name, "-n", namespace)["status"].get("podIP")
        )
        return ip

    ips = {name: address(name) for name in ("one", "two")}
    assert len(set(ips.values())) == 2
    assert all(ip.startswith("10.244.") and ip != NODE_ADDRESS for ip in ips.values())
