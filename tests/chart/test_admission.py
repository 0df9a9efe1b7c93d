"""The installed chart's admission policies, met as an attacker meets them (issue 28, finding 4 and item 11).

Whoever holds the worker's ServiceAccount token may create Jobs, patch and delete pods and write ConfigMaps in
the Run namespaces (its Role). Each escape route out of the sandbox shape is tried here with that token, against
the real API server (a dry run: admission runs in full, nothing is stored), and must be refused by the policy
with a message naming the field. ksquad's own sandboxes, a cold Job as activities.sandboxes.job_manifest makes it
from the release's sandbox settings and a warm pool pod from the chart's pool template, are admitted: from the
worker, and under Pod Security Admission `restricted`, which the Run namespace enforces (as the README's install
labels it). A namespace editor meets `restricted` and the triggered-by policy.

Runs first of tests/chart/ (it installs the shared release) and leaves nothing behind in its namespaces.
"""

import copy
import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from activities.sandboxes import KubernetesSandboxes, SandboxSettings, job_manifest
from kube import ApiError, Config, Kube, path
from testbed.chart import CHART, KUBE_VERSION, render
from tests.chart.conftest import HOME, NS, RELEASE, Release, wait_for
from workflows.contract import CredentialRef, ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import Placement, SandboxPolicy

Job = dict[str, Any]
RUN_API = "ksquad.io/v1alpha1"
POOL = "admission"
PSA = "pod-security.kubernetes.io/enforce"


def kubeconfig_of(release: Release, account: str, namespace: str) -> Path:
    token = release.kubectl("create", "token", account, "-n", namespace, "--duration=30m").stdout.strip()
    return release.cluster.token_kubeconfig(f"admission-{account}", token, NS)


@pytest.fixture(scope="module")
def as_worker(release: Release) -> Path:
    return kubeconfig_of(release, "ksquad-worker", HOME)


@pytest.fixture(scope="module")
def settings(release: Release) -> SandboxSettings:
    """What the release's worker makes sandboxes with (its ConfigMap)."""
    config = release.get("configmap", "ksquad-sandbox", "-n", HOME)["data"]["sandbox.yaml"]
    return SandboxSettings.model_validate(yaml.safe_load(config))


def cold_job(settings: SandboxSettings) -> Job:
    """A Run's cold sandbox as the worker makes it: a model credential and the agent's own."""
    model = ModelRef(
        name="m", url="http://model.example/v1", credential=CredentialRef(secret_name="model-key")
    )
    agent = ResolvedAgent(
        name="dev-1", model=model, credential=CredentialRef(secret_name="agent.key", key="tok-en")
    )
    run = RunIdentity(namespace=NS, name="shape", uid=str(uuid.uuid4()), attempt=1, fence=1)
    contract = ExecutionContract(run=run, agent=agent, model=model)
    token = hashlib.sha256(b"the attempt's caller token").hexdigest()
    manifest = job_manifest(contract, SandboxPolicy(), settings, 600, token)
    manifest["metadata"]["ownerReferences"] = []  # (its Run does not exist: nothing to own it)
    return manifest


def pool_replica_set(release: Release) -> dict[str, Any]:
    """The chart's warm pool in the Run namespace, rendered with the release's values."""
    values = yaml.safe_load(release.helm("get", "values", RELEASE, "-n", HOME, "-o", "yaml").stdout)
    values["pools"] = [{"name": POOL, "namespace": NS, "replicas": 1}]
    (replica_set,) = [d for d in render(values, namespace=HOME) if d["kind"] == "ReplicaSet"]
    return replica_set


def as_pod(name: str, template: dict[str, Any]) -> dict[str, Any]:
    """A pod as a controller makes it from `template` (what Pod Security Admission judges)."""
    metadata = {"name": name, "namespace": NS, **copy.deepcopy(template["metadata"])}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(template["spec"])}


def dry_run(
    release: Release, verb: str, doc: dict[str, Any], kubeconfig: Path | None = None
) -> tuple[int, str]:
    """`kubectl <verb> --dry-run=server` (as the admin, or as `kubeconfig`'s user)."""
    done = release.cluster.kubectl(
        verb, "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False, kubeconfig=kubeconfig
    )
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
async def worker(as_worker: Path) -> AsyncIterator[Kube]:
    async with Kube(Config.from_kubeconfig(as_worker)) as kube:
        yield kube


async def attempt(
    kube: Kube, method: str, url: str, body: Any = None, content_type: str = "application/json"
) -> ApiError | None:
    """The request, as a dry run (the API call kubectl --dry-run=server makes): its refusal, None when admitted."""
    try:
        content = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type}
        await kube._call(method, url, params={"dryRun": "All"}, content=content, headers=headers)
    except ApiError as err:
        return err
    return None


def denial(refusal: ApiError | None, policy: str) -> str:
    """What `policy` said when it refused the request."""
    assert refusal is not None, "admitted"
    said = f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: "
    assert said in refusal.message, refusal.message
    return refusal.message.split(said, 1)[1]


# --- ksquad's own sandboxes are admitted ----------------------------------------------------------------------


async def test_the_workers_cold_sandbox_is_admitted_and_its_pod_meets_restricted(
    release: Release, worker: Kube, settings: SandboxSettings
) -> None:
    job = cold_job(settings)
    assert await attempt(worker, "POST", path("batch/v1", "jobs", NS), job) is None
    assert release.get("namespace", NS)["metadata"]["labels"].get(PSA) == "restricted"
    code, output = dry_run(release, "create", as_pod("cold-sandbox", job["spec"]["template"]))
    assert code == 0 and "created (server dry run)" in output, f"Pod Security Admission: {output}"


@pytest.fixture(scope="module")
def warm_pool(release: Release) -> Iterator[dict[str, Any]]:
    """The chart's pool ReplicaSet in the Run namespace, its pods kept off the node (a node selector no node has)
    and marked Ready with an address: the ReplicaSet controller makes them under Pod Security Admission."""
    replica_set = pool_replica_set(release)
    replica_set["spec"]["template"]["spec"]["nodeSelector"] = {"ksquad.io/no-node": "true"}
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump(replica_set))
    try:
        yield replica_set
    finally:
        release.kubectl("delete", "replicaset", replica_set["metadata"]["name"], "-n", NS, "--wait=false")
        release.kubectl("delete", "pods", "-n", NS, "-l", f"ksquad.io/pool={POOL}", "--wait=false")


async def test_a_warm_pool_pod_meets_restricted_and_the_workers_claim_of_it_is_admitted(
    release: Release, worker: Kube, settings: SandboxSettings, warm_pool: dict[str, Any]
) -> None:
    # The pool's pod as the chart renders it, unchanged, under restricted (the ReplicaSet's were made too).
    code, output = dry_run(
        release, "create", as_pod("warm-sandbox", pool_replica_set(release)["spec"]["template"])
    )
    assert code == 0 and "created (server dry run)" in output, f"Pod Security Admission: {output}"

    def made() -> str | None:
        pods = release.get("pods", "-n", NS, "-l", f"ksquad.io/pool={POOL},ksquad.io/state=warm")["items"]
        return pods[0]["metadata"]["name"] if pods else None

    name = await wait_for("the ReplicaSet to make its pod", made, timeout=30)
    ready = {"status": {"podIP": "10.244.255.2", "conditions": [{"type": "Ready", "status": "True"}]}}
    release.kubectl("patch", "pod", name, "-n", NS, "--subresource=status", "-p", json.dumps(ready))
    # The worker's own claim (activities.sandboxes) of the ReplicaSet's pod: one label patch, admitted.
    model = ModelRef(name="m", url="http://model.example/v1")
    run = RunIdentity(namespace=NS, name="claims", uid=str(uuid.uuid4()), attempt=1, fence=1)
    # Placed as the pool is (its node selector keeps it off the node): a pool serves runs placed as it is.
    placed = ResolvedAgent(
        name="dev-1", model=model, placement=Placement(node_selector={"ksquad.io/no-node": "true"})
    )
    contract = ExecutionContract(run=run, agent=placed, model=model)
    pool = {
        "name": POOL,
        "namespace": NS,
        "template": warm_pool["spec"]["template"],
    }  # as the chart renders it
    pools = SandboxSettings.model_validate({**settings.model_dump(), "pools": [pool]})
    bound = await KubernetesSandboxes(worker, pools).pools.bind_warm(contract, SandboxPolicy())
    assert bound is not None and bound.name == name, "the claim went through admission"


# --- the escape routes, each as the worker's token --------------------------------------------------------------


def agent(job: Job) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


def spec(job: Job) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def agent_security(job: Job) -> dict[str, Any]:
    context: dict[str, Any] = agent(job)["securityContext"]
    return context


def pod_security(job: Job) -> dict[str, Any]:
    context: dict[str, Any] = spec(job)["securityContext"]
    return context


def mount(job: Job, volume: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [m for m in agent(job)["volumeMounts"] if m["name"] == volume]
    return found[0]


def credential_volume(job: Job, volume: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [v for v in spec(job)["volumes"] if v["name"] == volume]
    return found[0]


SECRET_FILE = "/var/run/ksquad/secrets/model-key/apiKey"
AGENT = "spec.template.spec.containers[agent]"
POD = "spec.template.spec"

# escape route -> (how the attacker changes ksquad's own Job, what the refusal must name)
ESCAPES: dict[str, tuple[Callable[[Job], Any], str]] = {
    # Finding 4: Secrets and ConfigMaps the sandbox is not given as credentials
    "env secretKeyRef to any Secret": (
        lambda j: agent(j)["env"].append(
            {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}}}
        ),
        f"{AGENT}.env[DB]",
    ),
    "env secretKeyRef named like a credential, its Secret not mounted as one": (
        lambda j: agent(j)["env"].append(
            {
                "name": "KSQUAD_CREDENTIAL_DB_PASSWORD_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "db-password", "key": "password"}},
            }
        ),
        f"{AGENT}.env[KSQUAD_CREDENTIAL_DB_PASSWORD_PASSWORD]",
    ),
    "env configMapKeyRef": (
        lambda j: agent(j)["env"].append(
            {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "db"}}}
        ),
        f"{AGENT}.env[CFG]",
    ),
    "env a variable ksquad never sets": (
        lambda j: agent(j)["env"].append({"name": "PYTHONWARNINGS", "value": "all"}),
        f"{AGENT}.env[PYTHONWARNINGS]",
    ),
    "envFrom a Secret": (
        lambda j: agent(j).update(envFrom=[{"secretRef": {"name": "db-password"}}]),
        f"{AGENT}.envFrom",
    ),
    "a secret volume of a Secret no credential names": (
        lambda j: spec(j)["volumes"].append(
            {"name": "credential-db-password", "secret": {"secretName": "db-password"}}
        ),
        f"{POD}.volumes[credential-db-password].secret.secretName",
    ),
    "a credential volume's secretName changed": (
        lambda j: credential_volume(j, "credential-model-key")["secret"].update(secretName="db-password"),
        f"{POD}.volumes[credential-model-key].secret.secretName",
    ),
    "a credential mounted outside /var/run/ksquad/secrets": (
        lambda j: mount(j, "credential-model-key").update(mountPath="/tmp/key"),
        f"{AGENT}.volumeMounts[credential-model-key]",
    ),
    # Finding 4: a container's securityContext overriding the pod's
    "container runAsUser 0": (
        lambda j: agent_security(j).update(runAsUser=0),
        f"{AGENT}.securityContext.runAsUser",
    ),
    "container runAsNonRoot false": (
        lambda j: agent_security(j).update(runAsNonRoot=False),
        f"{AGENT}.securityContext.runAsNonRoot",
    ),
    "pod seccompProfile Unconfined": (
        lambda j: pod_security(j).update(seccompProfile={"type": "Unconfined"}),
        f"{POD}.securityContext.seccompProfile",
    ),
    "container seccompProfile Unconfined": (
        lambda j: agent_security(j).update(seccompProfile={"type": "Unconfined"}),
        f"{AGENT}.securityContext.seccompProfile",
    ),
    "pod appArmorProfile Unconfined": (
        lambda j: pod_security(j).update(appArmorProfile={"type": "Unconfined"}),
        f"{POD}.securityContext.appArmorProfile",
    ),
    "container appArmorProfile Unconfined": (
        lambda j: agent_security(j).update(appArmorProfile={"type": "Unconfined"}),
        f"{AGENT}.securityContext.appArmorProfile",
    ),
    "AppArmor unconfined by annotation": (
        lambda j: j["spec"]["template"]["metadata"]["annotations"].update(
            {"container.apparmor.security.beta.kubernetes.io/agent": "unconfined"}
        ),
        "spec.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/agent]",
    ),
    "pod seLinuxOptions": (
        lambda j: pod_security(j).update(seLinuxOptions={"type": "spc_t"}),
        f"{POD}.securityContext.seLinuxOptions",
    ),
    "container seLinuxOptions": (
        lambda j: agent_security(j).update(seLinuxOptions={"type": "spc_t"}),
        f"{AGENT}.securityContext.seLinuxOptions",
    ),
    "capabilities not dropped": (
        lambda j: agent_security(j).pop("capabilities"),
        f"{AGENT}.securityContext.capabilities.drop",
    ),
    "capabilities added": (
        lambda j: agent_security(j)["capabilities"].update(add=["NET_RAW"]),
        f"{AGENT}.securityContext.capabilities.add",
    ),
    "privileged": (
        lambda j: agent_security(j).update(privileged=True, allowPrivilegeEscalation=True),
        f"{AGENT}.securityContext.privileged",
    ),
    "a writable root filesystem": (
        lambda j: agent_security(j).update(readOnlyRootFilesystem=False),
        f"{AGENT}.securityContext.readOnlyRootFilesystem",
    ),
    "sysctls": (
        lambda j: pod_security(j).update(sysctls=[{"name": "net.ipv4.ping_group_range", "value": "0 0"}]),
        f"{POD}.securityContext.sysctls",
    ),
    "supplementalGroups root": (
        lambda j: pod_security(j).update(supplementalGroups=[0]),
        f"{POD}.securityContext.supplementalGroups",
    ),
    # Finding 4: placement (a node selector, affinity and the chart's allowed tolerations and priority classes
    # are a sandbox's placement now: tests/chart/test_placement.py; these stay refused)
    "nodeName": (lambda j: spec(j).update(nodeName="node-1"), f"{POD}.nodeName"),
    "tolerations": (lambda j: spec(j).update(tolerations=[{"operator": "Exists"}]), f"{POD}.tolerations"),
    "toleration of a control-plane taint": (
        lambda j: spec(j).update(
            tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]
        ),
        f"{POD}.tolerations",
    ),
    "priorityClassName": (
        lambda j: spec(j).update(priorityClassName="system-node-critical"),
        f"{POD}.priorityClassName",
    ),
    "serviceAccountName not in the chart's list": (
        lambda j: spec(j).update(serviceAccountName="ksquad-worker"),
        f"{POD}.serviceAccountName",
    ),
    # Finding 4: the kubelet calls any host for a probe or a hook (and runs an exec probe in the container)
    "readinessProbe httpGet.host": (
        lambda j: agent(j)["readinessProbe"]["httpGet"].update(host="169.254.169.254"),
        f"{AGENT}.readinessProbe.httpGet.host",
    ),
    "livenessProbe tcpSocket.host": (
        lambda j: agent(j).update(livenessProbe={"tcpSocket": {"host": "10.96.0.1", "port": 443}}),
        f"{AGENT}.livenessProbe.tcpSocket.host",
    ),
    "startupProbe exec": (
        lambda j: agent(j).update(startupProbe={"exec": {"command": ["sh", "-c", f"cat {SECRET_FILE}"]}}),
        f"{AGENT}.startupProbe.exec",
    ),
    "lifecycle httpGet.host": (
        lambda j: agent(j).update(
            lifecycle={"postStart": {"httpGet": {"host": "10.96.0.1", "path": "/", "port": 443}}}
        ),
        f"{AGENT}.lifecycle",
    ),
    # Finding 4: no sandbox label, no default-deny NetworkPolicy
    "the Job without the sandbox label": (
        lambda j: j["metadata"]["labels"].pop("app.kubernetes.io/component"),
        "metadata.labels and spec.template.metadata.labels need app.kubernetes.io/component: sandbox",
    ),
    "its pods without the sandbox label": (
        lambda j: j["spec"]["template"]["metadata"]["labels"].pop("app.kubernetes.io/component"),
        "metadata.labels and spec.template.metadata.labels need app.kubernetes.io/component: sandbox",
    ),
    # The rest of the shape: what the sandbox runs, how many, where its names resolve
    "another command": (
        lambda j: agent(j).update(command=["sh", "-c", f"cat {SECRET_FILE}"]),
        f"{AGENT}.command",
    ),
    "a second container": (
        lambda j: spec(j)["containers"].append({**copy.deepcopy(agent(j)), "name": "miner", "ports": []}),
        "got containers agent, miner",
    ),
    "fifty pods": (lambda j: j["spec"].update(parallelism=50, completions=50), "spec.parallelism"),
    "dnsConfig": (
        lambda j: spec(j).update(dnsPolicy="None", dnsConfig={"nameservers": ["10.0.0.53"]}),
        f"{POD}.dnsPolicy, {POD}.dnsConfig",
    ),
    "hostAliases": (
        lambda j: spec(j).update(hostAliases=[{"ip": "10.0.0.1", "hostnames": ["model.example"]}]),
        f"{POD}.hostAliases",
    ),
    "shareProcessNamespace": (
        lambda j: spec(j).update(shareProcessNamespace=True),
        f"{POD}.shareProcessNamespace",
    ),
    "terminationMessagePath at a credential": (
        lambda j: agent(j).update(terminationMessagePath=SECRET_FILE),
        f"{AGENT}.terminationMessagePath",
    ),
    # Refused before as well (tests/chart/test_install.py had these)
    "another ServiceAccount": (
        lambda j: spec(j).update(serviceAccountName="default"),
        f"{POD}.serviceAccountName",
    ),
    "a ServiceAccount token": (
        lambda j: spec(j).update(automountServiceAccountToken=True),
        f"{POD}.automountServiceAccountToken",
    ),
    "hostPath": (
        lambda j: spec(j)["volumes"].append({"name": "root", "hostPath": {"path": "/"}}),
        f"{POD}.volumes[root]",
    ),
    "a foreign image": (
        lambda j: agent(j).update(image="docker.io/attacker/miner:1"),
        "image docker.io/attacker/miner:1 is not a sandbox image",
    ),
    "pod runAsUser 0": (lambda j: pod_security(j).update(runAsUser=0), f"{POD}.securityContext.runAsUser"),
    "hostNetwork": (lambda j: spec(j).update(hostNetwork=True), f"{POD}.hostNetwork"),
    "hostPort": (lambda j: agent(j)["ports"][0].update(hostPort=8080), f"{AGENT}.ports[8080].hostPort"),
    "no RuntimeClass": (lambda j: spec(j).pop("runtimeClassName"), f"{POD}.runtimeClassName"),
}


@pytest.mark.parametrize("escape", list(ESCAPES))
async def test_the_worker_cannot_make_a_job_outside_the_sandbox_shape(
    worker: Kube, settings: SandboxSettings, escape: str
) -> None:
    change, names = ESCAPES[escape]
    job = cold_job(settings)
    change(job)
    refusal = await attempt(worker, "POST", path("batch/v1", "jobs", NS), job)
    assert names in denial(refusal, "ksquad-worker-makes-sandboxes")


# --- what the worker may do to pods and ConfigMaps that are there ---------------------------------------------

CLAIM: dict[str, Any] = {
    "labels": {
        "ksquad.io/state": "bound",
        "ksquad.io/run": "claims",
        "ksquad.io/run-uid": "0f6a1c2e-0000-4000-8000-000000000001",
        "ksquad.io/attempt": "1",
    },
    "annotations": {"ksquad.io/caller-token-sha256": "ab" * 32},
    "ownerReferences": [
        {
            "apiVersion": RUN_API,
            "kind": "Run",
            "name": "claims",
            "uid": "0f6a1c2e-0000-4000-8000-000000000001",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ],
}


def claim_and(**metadata: Any) -> dict[str, Any]:
    """The worker's claim patch with `metadata` changed too."""
    labels = {**CLAIM["labels"], **metadata.pop("labels", {})}
    return {"metadata": {**CLAIM, **metadata, "labels": labels}}


@pytest.fixture(scope="module")
def victims(release: Release) -> Iterator[None]:
    """As the namespace's users have them: a warm and a bound sandbox (pool-shaped, kept off the node), a tenant's
    own pod and Job, a tenant's ConfigMap named like a Run's outputs."""
    template = pool_replica_set(release)["spec"]["template"]
    template["spec"]["nodeSelector"] = {"ksquad.io/no-node": "true"}
    warm = {**template["metadata"]["labels"], "ksquad.io/pool": "victims"}  # a pool no ReplicaSet here adopts
    pods = {
        "warm-victim": warm,
        "bound-victim": {**warm, "ksquad.io/state": "bound", "ksquad.io/run": "other"},
        "tenant-app": {"app": "web"},
    }
    docs: list[dict[str, Any]] = []
    for name, labels in pods.items():
        pod = as_pod(name, template)
        pod["metadata"]["labels"] = labels
        docs.append(pod)
    tenant_job = cold_job(SandboxSettings())["spec"]["template"]
    docs.append(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "tenant-job", "namespace": NS},
            "spec": {"suspend": True, "template": {"spec": {**tenant_job["spec"], "restartPolicy": "Never"}}},
        }
    )
    docs.append(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "r9-outputs", "namespace": NS}}
    )
    release.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    try:
        yield
    finally:
        release.kubectl(
            "delete", "-f", "-", "--wait=false", "--ignore-not-found", input=yaml.safe_dump_all(docs)
        )


# what the attacker does -> (the object, the patch (strategic merge), what the refusal must name)
POD_CHANGES: dict[str, tuple[str, dict[str, Any], str]] = {
    "remove the sandbox label from a live sandbox": (
        "bound-victim",
        {"metadata": {"labels": {"app.kubernetes.io/component": None}}},
        "metadata.labels[app.kubernetes.io/component]",
    ),
    "change the sandbox label": (
        "warm-victim",
        {"metadata": {"labels": {"app.kubernetes.io/component": "web"}}},
        "metadata.labels[app.kubernetes.io/component]",
    ),
    "claim, dropping the sandbox label": (
        "warm-victim",
        claim_and(labels={"app.kubernetes.io/component": None}),
        "metadata.labels[app.kubernetes.io/component]",
    ),
    "claim, adding a label another NetworkPolicy selects": (
        "warm-victim",
        claim_and(labels={"app": "web"}),
        "metadata.labels[app]",
    ),
    "move a warm sandbox to another pool": (
        "warm-victim",
        claim_and(labels={"ksquad.io/pool": "other"}),
        "metadata.labels[ksquad.io/pool]",
    ),
    "take a bound sandbox for another run": (
        "bound-victim",
        {"metadata": {"labels": {"ksquad.io/run": "mine"}}},
        "metadata.labels[ksquad.io/state]",
    ),
    "claim, adding an annotation": ("warm-victim", claim_and(annotations={"x": "y"}), "metadata.annotations"),
    "claim, adding a finalizer": (
        "warm-victim",
        claim_and(finalizers=["example.com/keep"]),
        "metadata.finalizers",
    ),
    "claim, owned by something else": (
        "warm-victim",
        claim_and(ownerReferences=[{"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "1"}]),
        "metadata.ownerReferences",
    ),
    "another image in a warm sandbox": (
        "warm-victim",
        {"spec": {"containers": [{"name": "agent", "image": "docker.io/attacker/miner:1"}]}},
        "spec refused",
    ),
    "label a tenant's pod as a warm sandbox": (
        "tenant-app",
        {"metadata": {"labels": {"ksquad.io/state": "warm"}}},
        "pod tenant-app refused: it is not a sandbox",
    ),
}


@pytest.mark.parametrize("change", list(POD_CHANGES))
async def test_the_worker_changes_a_pod_only_to_claim_a_warm_sandbox(
    worker: Kube, victims: None, change: str
) -> None:
    pod, patch, names = POD_CHANGES[change]
    strategic = "application/strategic-merge-patch+json"  # kubectl patch's
    refusal = await attempt(worker, "PATCH", path("v1", "pods", NS, pod), patch, strategic)
    assert names in denial(refusal, "ksquad-worker-claims-warm-pods")


@pytest.mark.parametrize(
    ("resource", "name"), [(("v1", "pods"), "tenant-app"), (("batch/v1", "jobs"), "tenant-job")]
)
async def test_the_worker_deletes_only_sandboxes(
    worker: Kube, victims: None, resource: tuple[str, str], name: str
) -> None:
    refusal = await attempt(worker, "DELETE", path(*resource, NS, name))
    assert f"{name} refused: it is not a sandbox" in denial(refusal, "ksquad-worker-deletes-sandboxes")


async def test_by_default_the_worker_writes_no_config_map(worker: Kube) -> None:
    """sandbox.outputsConfigMap is off: the worker's Role has no ConfigMap rule at all."""
    refusal = await attempt(
        worker, "POST", path("v1", "configmaps", NS), config_map("r9-outputs", {"ksquad.io/run": "r9"})
    )
    assert refusal is not None and refusal.status == 403 and "cannot create resource" in refusal.message


@pytest.fixture
def outputs_on(release: Release) -> Iterator[None]:
    """The rule the chart gives the worker with sandbox.outputsConfigMap: true (the policy below holds it to outputs)."""
    rule = render({"namespaces": [NS], "sandbox": {"outputsConfigMap": True}}, namespace=HOME)
    role = next(
        d
        for d in rule
        if d["kind"] == "Role"
        and d["metadata"]["name"] == "ksquad-worker"
        and d["metadata"]["namespace"] == NS
    )
    name = f"outputs-{uuid.uuid4().hex[:6]}"
    granted = {
        **role,
        "metadata": {"name": name, "namespace": NS},
        "rules": [r for r in role["rules"] if "configmaps" in r["resources"]],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "ksquad-worker", "namespace": HOME}],
    }
    release.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [granted, binding]}),
    )
    as_worker = f"--as=system:serviceaccount:{HOME}:ksquad-worker"
    for _ in range(100):  # the authorizer's cache takes the new binding a moment later
        if (
            release.cluster.kubectl(
                "auth", "can-i", "create", "configmaps", "-n", NS, as_worker, check=False
            ).returncode
            == 0
        ):
            break
        time.sleep(0.1)
    yield
    release.cluster.kubectl("delete", "rolebinding,role", name, "-n", NS, check=False)


def config_map(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    metadata = {"name": name, "namespace": NS, "labels": labels or {}}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {"ca.crt": "attacker's CA"},
    }


@pytest.mark.parametrize(
    ("method", "doc"),
    [
        ("PUT", config_map("kube-root-ca.crt")),  # the CA every pod of the namespace trusts
        ("POST", config_map("settings")),
        ("PUT", config_map("r9-outputs", {"ksquad.io/run": "r9"})),  # a tenant's, named like outputs
    ],
    ids=["the namespace's CA bundle", "a new ConfigMap", "a tenant's ConfigMap named like outputs"],
)
async def test_the_worker_writes_only_a_runs_outputs_config_map(
    worker: Kube, victims: None, outputs_on: None, method: str, doc: dict[str, Any]
) -> None:
    name = doc["metadata"]["name"]
    url = path("v1", "configmaps", NS, name if method == "PUT" else None)
    refusal = await attempt(worker, method, url, doc)
    assert f"configmap {name} refused" in denial(refusal, "ksquad-worker-writes-outputs")
    outputs = config_map("shape-outputs", {"ksquad.io/run": "shape"})
    assert await attempt(worker, "POST", path("v1", "configmaps", NS), outputs) is None, "a Run's outputs"


# --- the triggered-by annotation ---------------------------------------------------------------------------------


def runs_editor(release: Release, ns: str, name: str, verbs: str) -> None:
    """A ServiceAccount that may `verbs` Runs in `ns`, and nothing else (the chart aggregates no Run rights into
    `edit`: a cluster grants them); its Role and binding are named after it."""
    release.kubectl("create", "serviceaccount", name, "-n", ns)
    release.kubectl("create", "role", name, "-n", ns, f"--verb={verbs}", "--resource=runs.ksquad.io")
    release.kubectl(
        "create", "rolebinding", name, "-n", ns, f"--role={name}", f"--serviceaccount={ns}:{name}"
    )


def test_triggered_by_cannot_be_added_to_a_run_that_was_created_without_it(release: Release) -> None:
    """Where no MutatingAdmissionPolicy stamps Runs (before Kubernetes 1.36, or a Run made before the chart), a Run
    has no ksquad.io/triggered-by; its namespace's editor must not add one naming someone else (or anyone)."""
    ns, editor_name = (
        NS,
        f"runs-editor-{uuid.uuid4().hex[:6]}",
    )  # a namespace ksquad serves (others refuse Runs)
    runs_editor(release, ns, editor_name, "get,update,patch")
    binding = release.get("mutatingadmissionpolicybinding", "ksquad-triggered-by")
    original = binding["spec"].get("matchResources")
    outside = {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [ns]}
    run = {"apiVersion": RUN_API, "kind": "Run", "metadata": {"name": "unstamped", "namespace": ns}}
    run["spec"] = {"agents": ["no-such-agent"]}  # it fails its references at once: nothing runs
    release.kubectl(
        "patch",
        "mutatingadmissionpolicybinding",
        "ksquad-triggered-by",
        "--type=merge",
        "-p",
        json.dumps({"spec": {"matchResources": {"namespaceSelector": {"matchExpressions": [outside]}}}}),
    )
    try:
        for _ in range(100):  # the API server sees the binding change within moments
            created = json.loads(
                release.cluster.kubectl("create", "-o", "json", "-f", "-", input=yaml.safe_dump(run)).stdout
            )
            if "ksquad.io/triggered-by" not in created["metadata"].get("annotations", {}):
                break
            release.kubectl("delete", "run", "unstamped", "-n", ns)
            time.sleep(0.1)
        else:
            raise AssertionError("the MutatingAdmissionPolicy kept stamping Runs in the tenant namespace")
    finally:
        restore = {"op": "replace", "path": "/spec/matchResources", "value": original}
        release.kubectl(
            "patch",
            "mutatingadmissionpolicybinding",
            "ksquad-triggered-by",
            "--type=json",
            "-p",
            json.dumps([restore if original else {"op": "remove", "path": "/spec/matchResources"}]),
        )
    try:
        editor = kubeconfig_of(release, editor_name, ns)
        for name in ("ksquad-test-admin", "system:serviceaccount:ksquad:ksquad-worker"):
            done = release.cluster.kubectl(
                "annotate",
                "run",
                "unstamped",
                "-n",
                ns,
                f"ksquad.io/triggered-by={name}",
                check=False,
                kubeconfig=editor,
            )
            assert done.returncode != 0, f"annotated: {done.stdout}"
            assert "ksquad-triggered-by-immutable" in done.stderr, done.stderr
            assert "ksquad.io/triggered-by is set when the Run is created" in done.stderr, done.stderr
    finally:
        release.kubectl("delete", "run", "unstamped", "-n", ns, "--wait=false")
        release.kubectl("delete", "rolebinding,role,serviceaccount", editor_name, "-n", ns)


def test_a_stamped_triggered_by_cannot_change_by_any_way_a_namespace_editor_has(release: Release) -> None:
    """A Run stamped with its creator (by the MutatingAdmissionPolicy) keeps that name whatever an editor of its
    namespace's Runs tries: annotate, merge and JSON patches, update, server-side apply, the
    status subresource, the groups annotation, a label of that name; and no one creates a Run naming another."""
    ns, editor_name = NS, f"attribution-{uuid.uuid4().hex[:6]}"
    runs_editor(release, ns, editor_name, "get,list,create,update,patch")
    run: dict[str, Any] = {
        "apiVersion": RUN_API,
        "kind": "Run",
        "metadata": {"name": "stamped", "namespace": ns},
    }
    run["spec"] = {"agents": ["no-such-agent"]}  # it fails its references at once: nothing runs
    # Stamped at creation; a test before this one may have just given the MutatingAdmissionPolicy its binding
    # back, which the API server sees within moments.
    for _ in range(100):
        created = json.loads(
            release.cluster.kubectl("create", "-o", "json", "-f", "-", input=yaml.safe_dump(run)).stdout
        )
        if "ksquad.io/triggered-by" in created["metadata"].get("annotations", {}):
            break
        release.kubectl("delete", "run", "stamped", "-n", ns)
        time.sleep(0.1)
    else:
        raise AssertionError("the MutatingAdmissionPolicy stamped no Run")
    try:
        editor = kubeconfig_of(release, editor_name, ns)

        def as_editor(*args: str, doc: dict[str, Any] | None = None) -> tuple[int, str]:
            done = release.cluster.kubectl(
                *args, input=yaml.safe_dump(doc) if doc else None, check=False, kubeconfig=editor
            )
            return done.returncode, done.stdout + done.stderr

        def stored() -> dict[str, Any]:
            got: dict[str, Any] = release.get("run", "stamped", "-n", ns)
            return got

        creator = stored()["metadata"]["annotations"]["ksquad.io/triggered-by"]
        assert creator == "ksquad-test-admin"
        wait_for_status = time.monotonic() + 60  # the bridge mirrors it into the status too
        while (stored().get("status") or {}).get("triggeredBy") != creator:
            assert time.monotonic() < wait_for_status, stored().get("status")
            time.sleep(0.5)
        me = f"system:serviceaccount:{ns}:{editor_name}"
        changed = copy.deepcopy(stored())
        changed["metadata"]["annotations"]["ksquad.io/triggered-by"] = me
        applied = {**run, "metadata": {**run["metadata"], "annotations": {"ksquad.io/triggered-by": me}}}
        attempts = {
            "annotate": as_editor(
                "annotate", "--overwrite", "run", "stamped", "-n", ns, f"ksquad.io/triggered-by={me}"
            ),
            "annotate away": as_editor("annotate", "run", "stamped", "-n", ns, "ksquad.io/triggered-by-"),
            "merge patch": as_editor(
                "patch",
                "run",
                "stamped",
                "-n",
                ns,
                "--type=merge",
                "-p",
                json.dumps({"metadata": {"annotations": {"ksquad.io/triggered-by": me}}}),
            ),
            "JSON patch": as_editor(
                "patch",
                "run",
                "stamped",
                "-n",
                ns,
                "--type=json",
                "-p",
                json.dumps([{"op": "remove", "path": "/metadata/annotations/ksquad.io~1triggered-by"}]),
            ),
            "update": as_editor("replace", "-f", "-", doc=changed),
            "server-side apply": as_editor(
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=editor",
                "-f",
                "-",
                doc=applied,
            ),
            "groups": as_editor(
                "annotate",
                "--overwrite",
                "run",
                "stamped",
                "-n",
                ns,
                "ksquad.io/triggered-by-groups=system:masters",
            ),
        }
        for how, (code, message) in attempts.items():
            assert code != 0, f"{how}: {message}"
            assert "ksquad-triggered-by-immutable" in message, f"{how}: {message}"
        code, message = as_editor(
            "patch",
            "run",
            "stamped",
            "-n",
            ns,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": {"triggeredBy": me}}),
        )
        assert code != 0 and "forbidden" in message, f"the status is the bridge's: {message}"
        code, message = as_editor(
            "label", "run", "stamped", "-n", ns, f"ksquad.io/triggered-by={editor_name}"
        )
        assert code == 0, message  # a label is no attribution: nothing reads it
        after = stored()
        assert after["metadata"]["annotations"]["ksquad.io/triggered-by"] == creator
        assert after["status"]["triggeredBy"] == creator, "the status still names the creator"
        other = {
            **run,
            "metadata": {
                "name": "forged",
                "namespace": ns,
                "annotations": {"ksquad.io/triggered-by": creator},
            },
        }
        forged = release.cluster.kubectl(
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            "-",
            input=yaml.safe_dump(other),
            check=False,
            kubeconfig=editor,
        )
        if forged.returncode == 0:  # the MutatingAdmissionPolicy stamped the creator over the name given
            assert json.loads(forged.stdout)["metadata"]["annotations"]["ksquad.io/triggered-by"] == me
        else:  # where it is absent, the validating policy refuses the other's name
            assert "it cannot name anyone else" in forged.stderr, forged.stderr
    finally:
        release.kubectl("delete", "run", "stamped", "-n", ns, "--wait=false")
        release.kubectl("delete", "rolebinding,role,serviceaccount", editor_name, "-n", ns)


def test_a_run_in_a_namespace_ksquad_does_not_serve_is_refused_naming_the_chart_value(
    release: Release,
) -> None:
    """No bridge watches it: accepted, it would wait forever without a status, a message or an Event."""
    ns = f"unserved-{uuid.uuid4().hex[:6]}"
    release.kubectl("create", "namespace", ns)
    try:
        for namespace in (ns, HOME):  # any other namespace, and the release's own
            run = {"apiVersion": RUN_API, "kind": "Run", "metadata": {"name": "lost", "namespace": namespace}}
            code, message = dry_run(release, "create", {**run, "spec": {"agents": ["dev-1"]}})
            assert code != 0, message
            assert (
                f"no ksquad serves Runs in namespace {namespace}: the release {RELEASE} in namespace {HOME} "
                f"serves {NS} (chart value namespaces)"
            ) in message, message
        served = {"apiVersion": RUN_API, "kind": "Run", "metadata": {"name": "served", "namespace": NS}}
        code, message = dry_run(release, "create", {**served, "spec": {"agents": ["dev-1"]}})
        assert code == 0, message
    finally:
        release.kubectl("delete", "namespace", ns, "--wait=false")


# --- Pod Security Admission in the Run namespaces ---------------------------------------------------------------


def test_a_namespace_editor_meets_restricted_in_a_run_namespace(release: Release) -> None:
    release.kubectl("create", "serviceaccount", "tenant-editor", "-n", NS)
    release.kubectl(
        "create",
        "rolebinding",
        "tenant-editor",
        "-n",
        NS,
        "--clusterrole=edit",
        f"--serviceaccount={NS}:tenant-editor",
    )
    try:
        editor = kubeconfig_of(release, "tenant-editor", NS)
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "root-shell", "namespace": NS},
            "spec": {
                "containers": [{"name": "sh", "image": "busybox", "securityContext": {"privileged": True}}]
            },
        }
        code, message = dry_run(release, "create", pod, editor)
        assert code != 0, message
        assert 'violates PodSecurity "restricted:latest"' in message and "privileged" in message, message
    finally:
        release.kubectl("delete", "rolebinding,serviceaccount", "tenant-editor", "-n", NS)


def test_helm_refuses_a_run_namespace_that_does_not_enforce_restricted(release: Release) -> None:
    ns = f"unlabelled-{uuid.uuid4().hex[:6]}"
    release.kubectl("create", "namespace", ns)
    # What helm install and upgrade do: look at the cluster (lookup) while rendering.
    render = ["template", "psa", str(CHART), "-n", HOME, "--dry-run=server", "--kube-version", KUBE_VERSION]
    try:
        done = release.helm(*render, "--set", f"namespaces={{{ns}}}", check=False)
        assert done.returncode != 0, "rendered"
        assert f"namespace {ns} enforces Pod Security Admission level privileged" in done.stderr, done.stderr
        assert f"kubectl label namespace {ns} pod-security.kubernetes.io/enforce=restricted" in done.stderr
        release.kubectl("label", "namespace", ns, f"{PSA}=restricted")
        labelled = release.helm(*render, "--set", f"namespaces={{{ns}}}")
        assert "ksquad-worker-makes-sandboxes" in labelled.stdout
    finally:
        release.kubectl("delete", "namespace", ns, "--wait=false")
