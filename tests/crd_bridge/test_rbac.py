# mypy: disable-error-code="no-untyped-call, misc"
"""Least privilege, proven: the bridge, the worker and the API hold only the rules the chart renders, and each rule
is needed. For every (role, group, resource, verb) the chart grants in Run namespaces, the test makes the call of
the component's own code that needs it, as the chart's ServiceAccount: allowed with the chart's Role, refused (403) once
the rule is removed. A call the chart does not grant is refused too, and the one way the bridge could read a
Secret's value (RBAC cannot grant metadata alone) is what the docs say it is. Cluster-wide, the only ClusterRole
bound to ksquad's accounts (read from the chart and from the cluster) is the delegator ksquad-api's reviews need, and
each review is refused without it."""

import asyncio
import copy
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import pytest
import yaml
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandboxes import KubernetesSandboxes, PoolRef, SandboxSettings, job_manifest
from activities.sandboxes.manifests import SANDBOX_FAILED
from crd_bridge.activities import BridgeActivities
from crd_bridge.leader import LeaderElector
from crd_bridge.status import RunStatusWriter
from kube import ApiError, Config, Kube, path
from testbed import agent_sandbox, chart
from testbed.controlplane import ControlPlane
from testbed.images import AGENT_IMAGE
from testbed.warrants import run_warrant
from workflows.activity_types import (
    OutputsRequest,
    ResolveRequest,
    RunRef,
    Sandbox,
    SandboxRelease,
)
from workflows.contract import ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.envelope import RunEnvelope
from workflows.spec import Placement, SandboxPolicy, parse_run_spec
from workflows.status import Phase, RunStatus, StatusSnapshot

RUN_API = "ksquad.io/v1alpha1"
ACCOUNTS = ("ksquad-bridge", "ksquad-worker", "ksquad-api")

Call = Callable[[Kube, "Fixture"], Awaitable[Any]]


class Fixture:
    """Objects the calls act on, made by the admin."""

    def __init__(self, ns: str, run_uid: str = "") -> None:
        self.ns = ns
        self.run_uid = run_uid
        self.unique = lambda prefix: f"{prefix}-{uuid.uuid4().hex[:6]}"

    @property
    def run(self) -> RunRef:
        return RunRef(namespace=self.ns, name="subject", uid=self.run_uid)


def run_url(f: Fixture, name: str = "subject", sub: str | None = None) -> str:
    return path(RUN_API, "runs", f.ns, name, sub)


async def first_event(kube: Kube, url: str) -> None:
    async for _ in kube.watch(url, timeout_seconds=1):
        return


def sandboxes(kube: Kube, pools: list[PoolRef] | None = None) -> KubernetesSandboxes:
    return KubernetesSandboxes(
        kube,
        SandboxSettings(
            image=AGENT_IMAGE,
            poll_seconds=0.05,
            release_timeout_seconds=5,
            pools=pools or [],
            outputs_config_map=True,
        ),
    )


def contract(f: Fixture, name: str = "subject", placement: Placement | None = None) -> ExecutionContract:
    model = ModelRef(name="m", url="http://model.example/v1")
    identity = RunIdentity(namespace=f.ns, name=name, uid=f.run_uid, attempt=1, fence=1)
    agent = ResolvedAgent(name="subject", model=model, placement=placement)
    return ExecutionContract(run=identity, agent=agent, model=model)


SUBJECT_SPEC = {
    "agents": ["subject"],
    "teamRef": "subject",
    "projectRef": "subject",
    "workItemRef": "subject-item",
}


# The bridge's own calls (crd_bridge): resolving a Run's references reads every ksquad.io kind and the
# credential's labels, and asks whether the Run's creator may update its work item; the leader election reads, makes and renews its Lease; a status write patches runs/status.
async def resolve_references(kube: Kube, f: Fixture) -> Any:
    spec = parse_run_spec(SUBJECT_SPEC)
    envelope = RunEnvelope(namespace=f.ns, name="subject", uid=f.run_uid, spec=spec)
    resolve = BridgeActivities(kube, RunStatusWriter(kube, "rbac")).resolve_references
    resolution = await ActivityEnvironment().run(resolve, ResolveRequest(envelope=envelope))
    assert resolution.outcome == "resolved", resolution  # every kind was read, none was skipped
    return resolution


async def elect(kube: Kube, f: Fixture, lease: str = "rbac-subject") -> Any:
    return await LeaderElector(
        kube, chart.RELEASE_NAMESPACE, lease, f.unique("bridge"), lease_seconds=1
    )._try()


async def write_status(kube: Kube, f: Fixture) -> Any:
    status = RunStatus(phase=Phase.RUNNING, revision=int(time.time() * 1000))
    snapshot = StatusSnapshot(namespace=f.ns, name="subject", uid=f.run_uid, status=status)
    return await RunStatusWriter(kube, "rbac").write(snapshot)


# The worker's own calls (activities.sandboxes): the Job start_cold creates, the release of a cold and of a warm
# sandbox (delete, then make sure it is gone), a warm claim (the pool's ReplicaSet, its pods, then a guarded label
# patch), the look for why a Job has no pod (the Job, then its events), the outputs ConfigMap (made, then replaced).
async def create_job(kube: Kube, f: Fixture) -> Any:
    manifest = job_manifest(
        contract(f, f.unique("job")), SandboxPolicy(), sandboxes(kube).settings, 60, "0" * 64
    )
    manifest["metadata"]["ownerReferences"] = []  # (its Run does not exist: nothing to own it)
    return await kube.create(path("batch/v1", "jobs", f.ns), manifest)


async def release(kube: Kube, f: Fixture, kind: Literal["cold", "warm", "claimed"]) -> Any:
    # A claimed sandbox's release deletes its claim, then looks for the claim, its Sandbox and its pod (none here).
    name = "rbac-claim/rbac-sandbox" if kind == "claimed" else "victim"
    sandbox = Sandbox(name=name, kind=kind, endpoint="http://x/")
    warrant = run_warrant(f.run)
    return await sandboxes(kube).release(SandboxRelease(warrant=warrant, sandbox=sandbox, confirm=True))


async def claim_warm(kube: Kube, f: Fixture) -> Any:
    # Placed as the pool is (its node selector keeps its pod off the node): a pool serves runs placed so.
    placed = contract(f, placement=Placement(node_selector={"never": "true"}))
    pool = PoolRef(name="rbac", namespace=f.ns, template=pool_template())
    bound = await sandboxes(kube, [pool]).pools.bind_warm(placed, SandboxPolicy())
    assert bound is not None, "the warm pod was there to claim"
    return bound


async def claim_through_agent_sandbox(kube: Kube, f: Fixture) -> Any:
    """A claim on a pool of backend agent-sandbox (activities.sandboxes.agent_sandbox): the SandboxClaim made, read
    until its sandbox is ready (never: the pool has no SandboxWarmPool), then deleted."""
    pool = PoolRef(name="rbac-as", namespace=f.ns, template=pool_template(), backend="agent-sandbox")
    try:
        return await sandboxes(kube, [pool]).pools.claims.bind(
            pool, pool_template(), contract(f, f.unique("as")), 0.5
        )
    except ApplicationError as err:
        if err.type != SANDBOX_FAILED:
            raise
        return None  # what the worker says of a claim that gave no ready sandbox in time


async def why_no_pod(kube: Kube, f: Fixture) -> Any:
    return await sandboxes(kube).jobs._job_failure(f.ns, "subject", 3600, SandboxPolicy())


async def publish_outputs(kube: Kube, f: Fixture) -> Any:
    request = OutputsRequest(warrant=run_warrant(f.run), attempt=1, fence=1, outputs={"answer": "rbac"})
    return await sandboxes(kube).publish_outputs(request)


# (role, apiGroup, resource, verb) -> the component's call that needs it. Where a call is written out here, it is
# the request the named code makes, in a loop that would swallow the refusal (the reconciler and credential
# watches retry, an Event is best effort).
CALLS: dict[tuple[str, str, str, str], Call] = {
    ("ksquad-bridge", "ksquad.io", "runs", "list"): (  # RunReconciler._watch
        lambda k, f: k.list(path(RUN_API, "runs", f.ns))
    ),
    ("ksquad-bridge", "ksquad.io", "runs", "watch"): (  # RunReconciler._follow
        lambda k, f: first_event(k, path(RUN_API, "runs", f.ns))
    ),
    ("ksquad-bridge", "ksquad.io", "runs", "get"): write_status,
    ("ksquad-bridge", "ksquad.io", "runs", "patch"): (  # RunReconciler.reconcile adds its finalizer
        lambda k, f: k.patch(run_url(f), {"metadata": {"finalizers": ["ksquad.io/workflow"]}})
    ),
    ("ksquad-bridge", "ksquad.io", "runs/status", "patch"): write_status,
    **{
        ("ksquad-bridge", "ksquad.io", plural, "get"): resolve_references
        for plural in ("agents", "modelendpoints", "tools", "mcpservers", "skills", "teams", "projects")
    },
    ("ksquad-bridge", "", "events", "create"): (  # EventRecorder.record, a new Event
        lambda k, f: k.create(
            path("v1", "events", f.ns),
            {
                "metadata": {"name": f.unique("ev")},
                "involvedObject": {"kind": "Run", "name": "subject", "namespace": f.ns},
                "reason": "Rbac",
                "message": "rbac",
            },
        )
    ),
    ("ksquad-bridge", "", "events", "get"): (  # EventRecorder.record, a repeat
        lambda k, f: k.get(path("v1", "events", f.ns, "subject"))
    ),
    ("ksquad-bridge", "", "events", "patch"): (  # EventRecorder.record counts a repeat
        lambda k, f: k.patch(path("v1", "events", f.ns, "subject"), {"count": 2})
    ),
    ("ksquad-bridge", "", "secrets", "list"): resolve_references,
    ("ksquad-bridge", "authorization.k8s.io", "localsubjectaccessreviews", "create"): resolve_references,
    ("ksquad-bridge", "", "secrets", "watch"): (  # CredentialWatcher._watch (kube.reflect)
        lambda k, f: first_event(k, path("v1", "secrets", f.ns))
    ),
    ("ksquad-bridge-lease", "coordination.k8s.io", "leases", "get"): elect,
    ("ksquad-bridge-lease", "coordination.k8s.io", "leases", "create"): lambda k, f: elect(
        k, f, f.unique("lease")
    ),
    ("ksquad-bridge-lease", "coordination.k8s.io", "leases", "update"): elect,
    ("ksquad-worker", "batch", "jobs", "create"): create_job,
    ("ksquad-worker", "batch", "jobs", "get"): why_no_pod,
    ("ksquad-worker", "batch", "jobs", "delete"): lambda k, f: release(k, f, "cold"),
    ("ksquad-worker", "", "pods", "list"): lambda k, f: release(k, f, "cold"),
    ("ksquad-worker", "", "pods", "get"): lambda k, f: release(k, f, "warm"),
    ("ksquad-worker", "", "pods", "watch"): (  # WarmPods._reflect: the pools' warm pods, watched
        lambda k, f: first_event(k, path("v1", "pods", f.ns))
    ),
    ("ksquad-worker", "", "pods", "patch"): claim_warm,
    ("ksquad-worker", "apps", "replicasets", "get"): claim_warm,
    (
        "ksquad-worker",
        "apps",
        "replicasets",
        "create",
    ): claim_warm,  # the pool's template, defaulted (a dry run)
    ("ksquad-worker", "", "pods", "delete"): lambda k, f: release(k, f, "warm"),
    ("ksquad-worker", "extensions.agents.x-k8s.io", "sandboxclaims", "create"): claim_through_agent_sandbox,
    ("ksquad-worker", "extensions.agents.x-k8s.io", "sandboxclaims", "get"): claim_through_agent_sandbox,
    ("ksquad-worker", "extensions.agents.x-k8s.io", "sandboxclaims", "delete"): lambda k, f: release(
        k, f, "claimed"
    ),
    ("ksquad-worker", "agents.x-k8s.io", "sandboxes", "get"): lambda k, f: release(k, f, "claimed"),
    ("ksquad-worker", "", "configmaps", "create"): publish_outputs,
    ("ksquad-worker", "", "configmaps", "update"): publish_outputs,
    ("ksquad-worker", "", "events", "list"): why_no_pod,
    # ksquad-api (api/cluster_runs.py, run_for): the Run whose events or artifacts a caller asks for, once RBAC said
    # the caller may get it; its uid keys the store's records.
    ("ksquad-api", "ksquad.io", "runs", "get"): lambda k, f: k.get(run_url(f)),
    # ksquad-api (api/console/cluster.py, RunChanges): one metadata-only list and watch of a namespace's Runs, which
    # tell console tabs when their runs table changed (reflect retries a refusal: the requests, written out)
    ("ksquad-api", "ksquad.io", "runs", "list"): (
        lambda k, f: k.list(path(RUN_API, "runs", f.ns), limit=500, metadata_only=True)
    ),
    ("ksquad-api", "ksquad.io", "runs", "watch"): lambda k, f: first_event(k, path(RUN_API, "runs", f.ns)),
}

# Calls the chart must NOT grant (each refused as it stands).
NOT_GRANTED: dict[str, Call] = {
    "bridge reads a Secret's data": lambda k, f: k.get(path("v1", "secrets", f.ns, "subject")),
    "bridge deletes a Run": lambda k, f: k.delete(path(RUN_API, "runs", f.ns, "subject"), missing_ok=False),
    "bridge creates a Job": lambda k, f: k.create(path("batch/v1", "jobs", f.ns), job(f.unique("job"))),
    "worker reads a Secret": lambda k, f: k.get(path("v1", "secrets", f.ns, "subject")),
    "worker writes a Run's status": lambda k, f: k.patch(
        run_url(f, sub="status"), {"status": {"message": "no"}}
    ),
    "worker creates pods directly": lambda k, f: k.create(path("v1", "pods", f.ns), pod(f.unique("pod"))),
    "api patches a Run": lambda k, f: k.patch(run_url(f), {"metadata": {"labels": {"rbac": "no"}}}),
    "api reads a Secret": lambda k, f: k.get(path("v1", "secrets", f.ns, "subject")),
}


SANDBOX = {"app.kubernetes.io/component": "sandbox"}  # the worker deletes only sandboxes (admission policy)


def job(name: str) -> dict[str, Any]:
    """A suspended Job labelled as a sandbox, locked down like one."""
    return {
        "metadata": {"name": name, "labels": SANDBOX},
        "spec": {
            "suspend": True,
            "template": {
                "metadata": {"labels": SANDBOX},
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": "ksquad-sandbox",
                    "automountServiceAccountToken": False,
                    "runtimeClassName": "gvisor",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                    "containers": [
                        {
                            "name": "x",
                            "image": AGENT_IMAGE,
                            "securityContext": {"allowPrivilegeEscalation": False},
                        }
                    ],
                },
            },
        },
    }


def pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": SANDBOX},
        "spec": {"nodeSelector": {"never": "true"}, "containers": [{"name": "x", "image": "x"}]},
    }


def granted(docs: list[dict[str, Any]]) -> set[tuple[str, str, str, str]]:
    triples = set()
    for doc in docs:
        if doc["kind"] == "Role":
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            triples.add((doc["metadata"]["name"], group, resource, verb))
    return triples


def without(role: dict[str, Any], group: str, resource: str, verb: str) -> dict[str, Any]:
    trimmed = copy.deepcopy(role)
    rules = []
    for rule in trimmed["rules"]:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            others = [r for r in rule["resources"] if r != resource]
            if others:
                rules.append({**rule, "resources": others})
            rest = [v for v in rule["verbs"] if v != verb]
            if rest:
                rules.append({**rule, "resources": [resource], "verbs": rest})
        else:
            rules.append(rule)
    trimmed["rules"] = rules
    return trimmed


class Rbac:
    def __init__(self, cluster: ControlPlane, ns: str, docs: list[dict[str, Any]], run_uid: str) -> None:
        self.cluster, self.ns, self.docs, self.run_uid = cluster, ns, docs, run_uid
        self.roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
        self.kubes: dict[str, Kube] = {}

    def apply_role(self, role: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))

    async def outcome(self, role: str, call: Call) -> int:
        """The HTTP status of the call (200 when it went through), as the role's ServiceAccount."""
        account = next(a for a in ACCOUNTS if role.startswith(a))
        try:
            await call(self.kubes[account], Fixture(self.ns, self.run_uid))
        except ApiError as err:
            return err.status
        except ApplicationError as err:  # the bridge's activities report the API's refusal as their failure
            if "403 Forbidden" in str(err):
                return 403
            raise
        return 200


@pytest.fixture(scope="module")
async def rbac(ksquad_cluster: ControlPlane) -> AsyncIterator[Rbac]:
    ns = f"rbac-{uuid.uuid4().hex[:6]}"
    ksquad_cluster.kubectl("create", "namespace", ns)
    ksquad_cluster.wait_for_default_service_account(ns)
    # With the outputs ConfigMap on (sandbox.outputsConfigMap) and a pool of backend agent-sandbox (its CRDs and
    # controller in the cluster): their rules are proven too.
    agent_sandbox.start(ksquad_cluster)
    docs = chart.render(
        {
            "namespaces": [ns],
            "sandbox": {"outputsConfigMap": True},
            "pools": [{"name": "rbac-as", "namespace": ns, "backend": "agent-sandbox"}],
        }
    )
    chart.apply(
        ksquad_cluster,
        docs,
        {
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        },
    )
    admin = lambda *a, **kw: ksquad_cluster.kubectl(*a, **kw)  # noqa: E731
    for kind, name in (("Run", "subject"),):
        admin(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                {
                    "apiVersion": RUN_API,
                    "kind": kind,
                    "metadata": {
                        "name": name,
                        "namespace": ns,
                        # who made it, as admission stamps it: the bridge asks whether they may update its item
                        "annotations": {
                            "ksquad.io/triggered-by": "ksquad-test-admin",
                            "ksquad.io/triggered-by-groups": "system:masters",
                        },
                    },
                    # what resolve_references resolves (the Run as stored): every kind, and a work item
                    "spec": SUBJECT_SPEC,
                }
            ),
        )
    for kind in ("Agent", "ModelEndpoint", "Tool", "MCPServer", "Skill", "Team", "Project"):
        spec = {
            "ModelEndpoint": {"url": "http://x", "model": "m"},  # the Agent names each kind: all are read
            "Agent": {
                "modelEndpointRef": "subject",
                "tools": ["subject"],
                "allowedTools": ["subject"],
                "skillRefs": ["subject"],
                "credentialSecretRef": {"name": "subject", "key": "k"},
            },
            "Tool": {"mcpServerRef": "subject", "toolName": "t"},
            "MCPServer": {"url": "http://x"},
        }.get(kind, {})
        admin(
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(
                {
                    "apiVersion": RUN_API,
                    "kind": kind,
                    "metadata": {"name": "subject", "namespace": ns},
                    "spec": spec,
                }
            ),
        )
    admin("create", "secret", "generic", "subject", "-n", ns, "--from-literal=k=v")
    admin("label", "secret", "subject", "-n", ns, "ksquad.io/credential=true")
    admin("annotate", "secret", "subject", "-n", ns, "ksquad.io/allowed-hosts=x")  # the ModelEndpoint's host
    admin("create", "configmap", "subject", "-n", ns)
    for name in ("subject", "victim"):
        admin(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            input=yaml.safe_dump({"apiVersion": "batch/v1", "kind": "Job", **job(name)}),
        )
        admin(
            "apply",
            "-n",
            ns,
            "-f",
            "-",
            input=yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", **pod(name)}),
        )
    admin(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "subject", "namespace": ns},
                "involvedObject": {"kind": "Run", "name": "subject", "namespace": ns},
                "reason": "Rbac",
                "message": "rbac",
            }
        ),
    )
    admin(
        "apply",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": "rbac-subject", "namespace": chart.RELEASE_NAMESPACE},
                "spec": {},
            }
        ),
    )
    run_uid = json.loads(admin("get", "kr", "subject", "-n", ns, "-o", "json").stdout)["metadata"]["uid"]
    state = Rbac(ksquad_cluster, ns, docs, run_uid)
    for account in ACCOUNTS:
        token = admin(
            "create", "token", account, "-n", chart.RELEASE_NAMESPACE, "--duration=1h"
        ).stdout.strip()
        state.kubes[account] = Kube(
            Config.from_kubeconfig(ksquad_cluster.token_kubeconfig(f"{account}-{ns}", token, ns))
        )
    yield state
    for kube in state.kubes.values():
        await kube.close()


def pool_template() -> dict[str, Any]:
    """The pod template of the pool ksquad-pool-rbac, as a chart would render it (the worker's settings name it)."""
    labels = {
        "ksquad.io/state": "warm",
        "ksquad.io/pool": "rbac",
        "ksquad.io/runtime-class": "gvisor",
        "app.kubernetes.io/component": "sandbox",
    }
    template = job("warm")["spec"]["template"]["spec"]  # locked down like a pool's pod
    # Its agent container asks for what the worker's sandboxes do: a pool serves runs placed (and sized) as it is.
    template["containers"][0].update(name="agent", resources=SandboxSettings().resources)
    return {
        "metadata": {"labels": labels},
        "spec": {**template, "restartPolicy": "Always", "nodeSelector": {"never": "true"}},
    }


def rewarm(cluster: ControlPlane, ns: str) -> None:
    """A warm pod to claim: a pool's (its ReplicaSet ksquad-pool-rbac makes one after each claim), made Ready with
    an address (it never runs: no node takes it)."""
    pool = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "ksquad-pool-rbac"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"ksquad.io/pool": "rbac", "ksquad.io/state": "warm"}},
            "template": pool_template(),
        },
    }
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pool))
    for _ in range(200):
        pods = json.loads(
            cluster.kubectl(
                "get", "pods", "-n", ns, "-l", "ksquad.io/pool=rbac,ksquad.io/state=warm", "-o", "json"
            ).stdout
        )["items"]
        if pods:
            break
        time.sleep(0.05)
    ready = {"status": {"podIP": "10.244.255.1", "conditions": [{"type": "Ready", "status": "True"}]}}
    for pod in pods:
        name = pod["metadata"]["name"]
        cluster.kubectl("patch", "pod", name, "-n", ns, "--subresource=status", "-p", json.dumps(ready))


def test_every_granted_rule_has_a_call_that_needs_it(rbac: Rbac) -> None:
    assert granted(rbac.docs) == set(CALLS), (
        "each rule of the chart is exercised, and nothing else is granted"
    )


@pytest.mark.parametrize("rule", list(CALLS), ids=[f"{r}:{g or 'core'}/{res}:{v}" for r, g, res, v in CALLS])
async def test_removing_a_rule_refuses_the_call_that_needs_it(
    rbac: Rbac, rule: tuple[str, str, str, str]
) -> None:
    role, group, resource, verb = rule
    call = CALLS[rule]

    def prepare() -> None:  # what a call consumes, made again
        if verb == "delete" or (resource, verb) in {("pods", "list"), ("pods", "get")}:
            recreate_victim(rbac, "jobs" if (resource, verb) == ("pods", "list") else resource)
        if (resource, verb) in {("pods", "patch"), ("replicasets", "get")}:
            rewarm(rbac.cluster, rbac.ns)

    # The case before restored the role it cut: the authorizer sees that within moments too.
    allowed = 0
    for _ in range(50):
        prepare()
        allowed = await rbac.outcome(role, call)
        if allowed < 400:
            break
        await asyncio.sleep(0.1)
    assert allowed < 400, f"the chart's rules allow it (got {allowed})"
    rbac.apply_role(without(rbac.roles[role], group, resource, verb))
    try:
        status = 0
        for _ in range(50):  # the authorizer sees Role changes within moments
            prepare()
            status = await rbac.outcome(role, call)
            if status == 403:
                break
            await asyncio.sleep(0.1)
        assert status == 403, f"without {rule}, the component's call must be refused (got {status})"
    finally:
        rbac.apply_role(rbac.roles[role])


def recreate_victim(rbac: Rbac, resource: str) -> None:
    doc = (
        {"apiVersion": "batch/v1", "kind": "Job", **job("victim")}
        if resource == "jobs"
        else {"apiVersion": "v1", "kind": "Pod", **pod("victim")}
    )
    rbac.cluster.kubectl("delete", resource, "victim", "-n", rbac.ns, "--wait=true", "--ignore-not-found")
    rbac.cluster.kubectl("apply", "-n", rbac.ns, "-f", "-", input=yaml.safe_dump(doc))


@pytest.mark.parametrize("what", list(NOT_GRANTED))
async def test_what_the_chart_does_not_grant_is_refused(rbac: Rbac, what: str) -> None:
    role = f"ksquad-{what.split()[0]}"
    assert await rbac.outcome(role, NOT_GRANTED[what]) == 403


async def test_the_bridge_could_read_a_secrets_value_only_by_a_full_list_as_the_docs_say(rbac: Rbac) -> None:
    bridge = rbac.kubes["ksquad-bridge"]
    metadata = await bridge.list(path("v1", "secrets", rbac.ns), metadata_only=True)
    assert all("data" not in item for item in metadata["items"]), (
        "what the bridge asks for: labels, no values"
    )
    full = await bridge.list(path("v1", "secrets", rbac.ns))  # what RBAC cannot forbid it: docs/operating.md
    names = {item["metadata"]["name"] for item in full["items"]}
    assert names and {item["metadata"]["name"] for item in metadata["items"]} == names, "the same Secrets"
    assert any(item.get("data") for item in full["items"])
    assert await rbac.outcome("ksquad-bridge", NOT_GRANTED["bridge reads a Secret's data"]) == 403


# The one ClusterRole any of ksquad's accounts holds (with or without api.url): the built-in delegator role, for what
# ksquad-api asks the API server about its callers (api.kubernetes_auth): who a token is, and what they may do.
CLUSTER_GRANTS = {("ksquad-api", "system:auth-delegator")}
REVIEWS: dict[str, Call] = {
    "tokenreviews": lambda k, f: k.create(
        path("authentication.k8s.io/v1", "tokenreviews"),
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "not-a-token"}},
    ),
    "subjectaccessreviews": lambda k, f: k.create(
        path("authorization.k8s.io/v1", "subjectaccessreviews"),
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": "someone",
                "resourceAttributes": {"verb": "get", "resource": "runs", "namespace": f.ns},
            },
        },
    ),
}


def cluster_grants(docs: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """(ksquad account, ClusterRole) for every binding, cluster-wide or in a namespace, of a ClusterRole to one of
    ksquad's ServiceAccounts."""
    return {
        (subject["name"], doc["roleRef"]["name"])
        for doc in docs
        if doc["kind"] in ("ClusterRoleBinding", "RoleBinding") and doc["roleRef"]["kind"] == "ClusterRole"
        for subject in doc.get("subjects") or []
        if subject["kind"] == "ServiceAccount"
        and subject.get("namespace") == chart.RELEASE_NAMESPACE
        and subject["name"] in ACCOUNTS
    }


def test_the_only_cluster_role_ksquads_accounts_hold_is_the_review_delegator() -> None:
    values: dict[str, Any] = {"namespaces": ["payments"], "sandbox": {"outputsConfigMap": True}}
    for with_url in ({}, {"api": {"url": "https://ksquad.example.com"}}):
        assert cluster_grants(chart.render({**values, **with_url})) == CLUSTER_GRANTS, with_url


async def test_ksquad_apis_reviews_go_through_with_its_cluster_binding_and_only_with_it(rbac: Rbac) -> None:
    """On the cluster: the chart's ClusterRoleBinding is the only grant of a ClusterRole to ksquad's accounts, and
    each review ksquad-api makes goes through with it, and is refused (403) without it."""
    (binding,) = [d for d in rbac.docs if d["kind"] == "ClusterRoleBinding"]
    name = binding["metadata"]["name"]
    had = rbac.cluster.kubectl(
        "get", "clusterrolebinding", name, "--ignore-not-found", "-o", "name"
    ).stdout.strip()
    rbac.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(binding))
    try:
        on_cluster = [
            {**found, "kind": kind}
            for kind, listing in (
                ("ClusterRoleBinding", ["clusterrolebindings"]),
                ("RoleBinding", ["rolebindings", "-A"]),
            )
            for found in json.loads(rbac.cluster.kubectl("get", *listing, "-o", "json").stdout)["items"]
        ]
        assert cluster_grants(on_cluster) == CLUSTER_GRANTS, "what the cluster binds to ksquad's accounts"
        for review, call in REVIEWS.items():
            assert await rbac.outcome("ksquad-api", call) == 200, review
        rbac.cluster.kubectl("delete", "clusterrolebinding", name)
        for review, call in REVIEWS.items():
            status = 0
            for _ in range(50):  # the authorizer sees binding changes within moments
                if (status := await rbac.outcome("ksquad-api", call)) == 403:
                    break
                await asyncio.sleep(0.1)
            assert status == 403, f"without {name}, ksquad-api's {review} must be refused (got {status})"
    finally:
        if had:
            rbac.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(binding))
        else:
            rbac.cluster.kubectl("delete", "clusterrolebinding", name, "--ignore-not-found")
