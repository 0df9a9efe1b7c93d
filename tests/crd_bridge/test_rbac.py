# mypy: disable-error-code="no-untyped-call, misc"
"""Least privilege, proven: the bridge and the worker hold only the rules the chart renders, and each rule is
needed. For every (role, group, resource, verb) the chart grants, the test removes it, shows the one API call
that needs it refused (403), and names the test that breaks without it; a call the chart does not grant is
refused too."""

import asyncio
import copy
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import yaml

from kube import ApiError, Config, Kube, path
from tests.cluster.controlplane import ControlPlane
from tests.cluster.images import AGENT_IMAGE
from tests.support import chart

RUN_API = "ksquad.io/v1alpha1"
E2E = "tests/crd_bridge/test_bridge_e2e.py::"
RES = "tests/crd_bridge/test_bridge_resilience.py::"
SANDBOX = "tests/activities/test_sandboxes.py::"
SEED = E2E + "test_the_seed_run_applied_with_kubectl_runs_to_succeeded_and_events_tell_the_story"
LATE = E2E + "test_a_run_whose_agent_appears_later_waits_with_the_condition_then_runs"
DELETE = E2E + "test_kubectl_delete_of_a_running_run_ends_cancelled_with_its_sandbox_gone"
ROTATE = E2E + "test_a_rotated_credential_resumes_a_run_paused_on_it"
FAILOVER = RES + "test_two_bridge_replicas_never_both_act_and_the_standby_takes_over"
WARM = SANDBOX + "test_twenty_runs_race_for_five_warm_pods_none_bound_twice"
BROKEN = SANDBOX + "test_a_pod_that_cannot_start_fails_the_acquisition_with_its_reason"

Call = Callable[[Kube, "Fixture"], Awaitable[Any]]


class Fixture:
    """Objects the calls act on, made by the admin."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.unique = lambda prefix: f"{prefix}-{uuid.uuid4().hex[:6]}"


def run_url(f: Fixture, name: str = "subject", sub: str | None = None) -> str:
    return path(RUN_API, "runs", f.ns, name, sub)


async def first_event(kube: Kube, url: str) -> None:
    async for _ in kube.watch(url, timeout_seconds=1):
        return


# (role, apiGroup, resource, verb) -> (the call the component makes, the test that breaks without it)
CALLS: dict[tuple[str, str, str, str], tuple[Call, str]] = {
    ("ksquad-bridge", "ksquad.io", "runs", "list"): (lambda k, f: k.list(path(RUN_API, "runs", f.ns)), SEED),
    ("ksquad-bridge", "ksquad.io", "runs", "watch"): (lambda k, f: first_event(k, path(RUN_API, "runs", f.ns)), SEED),
    ("ksquad-bridge", "ksquad.io", "runs", "get"): (lambda k, f: k.get(run_url(f)), SEED),
    ("ksquad-bridge", "ksquad.io", "runs", "patch"): (
        lambda k, f: k.patch(run_url(f), {"metadata": {"finalizers": ["ksquad.io/workflow"]}}), DELETE),
    ("ksquad-bridge", "ksquad.io", "runs/status", "patch"): (
        lambda k, f: k.patch(run_url(f, sub="status"), {"status": {"message": "rbac"}}), SEED),
    **{("ksquad-bridge", "ksquad.io", plural, "get"): (
        lambda k, f, p=plural: k.get(path(RUN_API, p, f.ns, "subject")), LATE)
       for plural in ("agents", "modelendpoints", "tools", "mcpservers", "skills", "teams", "projects")},
    ("ksquad-bridge", "", "events", "create"): (
        lambda k, f: k.create(path("v1", "events", f.ns), {"metadata": {"name": f.unique("ev")},
                              "involvedObject": {"kind": "Run", "name": "subject", "namespace": f.ns},
                              "reason": "Rbac", "message": "rbac"}), SEED),
    ("ksquad-bridge", "", "events", "get"): (lambda k, f: k.get(path("v1", "events", f.ns, "subject")), SEED),
    ("ksquad-bridge", "", "events", "patch"): (
        lambda k, f: k.patch(path("v1", "events", f.ns, "subject"), {"count": 2}), SEED),
    ("ksquad-bridge", "", "secrets", "list"): (
        lambda k, f: k.list(path("v1", "secrets", f.ns), metadata_only=True), ROTATE),
    ("ksquad-bridge", "", "secrets", "watch"): (
        lambda k, f: first_event(k, path("v1", "secrets", f.ns)), ROTATE),
    ("ksquad-bridge-lease", "coordination.k8s.io", "leases", "get"): (
        lambda k, f: k.get(path("coordination.k8s.io/v1", "leases", chart.RELEASE_NAMESPACE, "rbac-subject")), FAILOVER),
    ("ksquad-bridge-lease", "coordination.k8s.io", "leases", "create"): (
        lambda k, f: k.create(path("coordination.k8s.io/v1", "leases", chart.RELEASE_NAMESPACE),
                              {"metadata": {"name": f.unique("lease")}, "spec": {}}), FAILOVER),
    ("ksquad-bridge-lease", "coordination.k8s.io", "leases", "update"): (
        lambda k, f: renew(k, path("coordination.k8s.io/v1", "leases", chart.RELEASE_NAMESPACE, "rbac-subject")),
        FAILOVER),
    ("ksquad-worker", "batch", "jobs", "create"): (
        lambda k, f: k.create(path("batch/v1", "jobs", f.ns), job(f.unique("job"))), SEED),
    ("ksquad-worker", "batch", "jobs", "get"): (lambda k, f: k.get(path("batch/v1", "jobs", f.ns, "subject")), BROKEN),
    ("ksquad-worker", "batch", "jobs", "delete"): (lambda k, f: deleted(k, f, "jobs"), DELETE),
    ("ksquad-worker", "", "pods", "list"): (lambda k, f: k.list(path("v1", "pods", f.ns)), SEED),
    ("ksquad-worker", "", "pods", "get"): (lambda k, f: k.get(path("v1", "pods", f.ns, "subject")), DELETE),
    ("ksquad-worker", "", "pods", "patch"): (
        lambda k, f: k.patch(path("v1", "pods", f.ns, "subject"), {"metadata": {"labels": {"x": "y"}}}), WARM),
    ("ksquad-worker", "", "pods", "delete"): (lambda k, f: deleted(k, f, "pods"), WARM),
    ("ksquad-worker", "", "configmaps", "create"): (
        lambda k, f: k.create(path("v1", "configmaps", f.ns), {"metadata": {"name": f.unique("cm")}}), SEED),
    ("ksquad-worker", "", "configmaps", "update"): (lambda k, f: update(k, path("v1", "configmaps", f.ns, "subject")), SEED),
    ("ksquad-worker", "", "events", "list"): (lambda k, f: k.list(path("v1", "events", f.ns)), BROKEN),
}  # fmt: skip

# Calls the chart must NOT grant (each refused as it stands).
NOT_GRANTED: dict[str, Call] = {
    "bridge reads a Secret's data": lambda k, f: k.get(path("v1", "secrets", f.ns, "subject")),
    "bridge deletes a Run": lambda k, f: k.delete(path(RUN_API, "runs", f.ns, "subject"), missing_ok=False),
    "bridge creates a Job": lambda k, f: k.create(path("batch/v1", "jobs", f.ns), job(f.unique("job"))),
    "worker reads a Secret": lambda k, f: k.get(path("v1", "secrets", f.ns, "subject")),
    "worker writes a Run's status": lambda k, f: k.patch(run_url(f, sub="status"), {"status": {"message": "no"}}),
    "worker creates pods directly": lambda k, f: k.create(path("v1", "pods", f.ns), pod(f.unique("pod"))),
}  # fmt: skip


def job(name: str) -> dict[str, Any]:
    """A suspended sandbox-shaped Job (the chart's admission policy admits no other from the worker)."""
    return {"metadata": {"name": name}, "spec": {"suspend": True, "template": {"spec": {
        "restartPolicy": "Never", "serviceAccountName": "ksquad-sandbox", "automountServiceAccountToken": False,
        "runtimeClassName": "gvisor", "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
        "containers": [{"name": "x", "image": AGENT_IMAGE, "securityContext": {"allowPrivilegeEscalation": False}}]}}}}  # fmt: skip


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeSelector": {"never": "true"},
                                                 "containers": [{"name": "x", "image": "x"}]}}  # fmt: skip


async def renew(kube: Kube, url: str) -> Any:
    """A Lease update carries the resourceVersion it read, as the bridge's renewal does."""
    return await kube.replace(url, await kube.get(url))


async def update(kube: Kube, url: str) -> Any:
    """PUT an object back (the worker replaces its outputs ConfigMap; the bridge its Lease): needs get too,
    so the object is read as the admin made it."""
    return await kube.replace(url, {"metadata": {"name": url.rsplit("/", 1)[1]}})


async def deleted(kube: Kube, f: Fixture, plural: str) -> Any:
    return await kube.delete(
        path("batch/v1" if plural == "jobs" else "v1", plural, f.ns, "victim"), missing_ok=False
    )


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
    def __init__(self, cluster: ControlPlane, ns: str, docs: list[dict[str, Any]]) -> None:
        self.cluster, self.ns, self.docs = cluster, ns, docs
        self.roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
        self.kubes: dict[str, Kube] = {}

    def apply_role(self, role: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(role))

    async def outcome(self, role: str, call: Call) -> int:
        """The HTTP status of the call (200 when it went through), as the role's ServiceAccount."""
        account = "ksquad-bridge" if role.startswith("ksquad-bridge") else "ksquad-worker"
        try:
            await call(self.kubes[account], Fixture(self.ns))
        except ApiError as err:
            return err.status
        return 200


@pytest.fixture(scope="module")
async def rbac(ksquad_cluster: ControlPlane) -> AsyncIterator[Rbac]:
    ns = f"rbac-{uuid.uuid4().hex[:6]}"
    ksquad_cluster.kubectl("create", "namespace", ns)
    ksquad_cluster.wait_for_default_service_account(ns)
    docs = chart.render({"namespaces": [ns]})
    chart.apply(ksquad_cluster, docs, {"ServiceAccount", "Role", "RoleBinding", "ValidatingAdmissionPolicy",
                                       "ValidatingAdmissionPolicyBinding"})  # fmt: skip
    admin = lambda *a, **kw: ksquad_cluster.kubectl(*a, **kw)  # noqa: E731
    for kind, name in (("Run", "subject"),):
        admin("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": RUN_API, "kind": kind,
              "metadata": {"name": name, "namespace": ns}, "spec": {"agents": ["dev-1"]}}))  # fmt: skip
    for kind in ("Agent", "ModelEndpoint", "Tool", "MCPServer", "Skill", "Team", "Project"):
        spec = {"ModelEndpoint": {"url": "http://x"}, "Tool": {"mcpServerRef": "m", "toolName": "t"},
                "MCPServer": {"url": "http://x"}}.get(kind, {})  # fmt: skip
        admin("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": RUN_API, "kind": kind,
              "metadata": {"name": "subject", "namespace": ns}, "spec": spec}))  # fmt: skip
    admin("create", "secret", "generic", "subject", "-n", ns, "--from-literal=k=v")
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
    admin("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "Event", "metadata": {
        "name": "subject", "namespace": ns}, "involvedObject": {"kind": "Run", "name": "subject", "namespace": ns},
        "reason": "Rbac", "message": "rbac"}))  # fmt: skip
    admin("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
          "metadata": {"name": "rbac-subject", "namespace": chart.RELEASE_NAMESPACE}, "spec": {}}))  # fmt: skip
    state = Rbac(ksquad_cluster, ns, docs)
    for account in ("ksquad-bridge", "ksquad-worker"):
        token = admin(
            "create", "token", account, "-n", chart.RELEASE_NAMESPACE, "--duration=1h"
        ).stdout.strip()
        state.kubes[account] = Kube(
            Config.from_kubeconfig(ksquad_cluster.token_kubeconfig(f"{account}-{ns}", token, ns))
        )
    yield state
    for kube in state.kubes.values():
        await kube.close()


def test_every_granted_rule_has_a_call_that_needs_it(rbac: Rbac) -> None:
    assert granted(rbac.docs) == set(CALLS), (
        "each rule of the chart is exercised, and nothing else is granted"
    )


@pytest.mark.parametrize(("rule", "breaks"), [(k, v[1]) for k, v in CALLS.items()],
                         ids=[f"{r}:{g or 'core'}/{res}:{v}" for r, g, res, v in CALLS])  # fmt: skip
async def test_removing_a_rule_refuses_the_call_that_needs_it(
    rbac: Rbac, rule: tuple[str, str, str, str], breaks: str
) -> None:
    role, group, resource, verb = rule
    call = CALLS[rule][0]
    if verb == "delete":
        recreate_victim(rbac, resource)
    assert await rbac.outcome(role, call) < 400, "the chart's rules allow it"
    if verb == "delete":
        recreate_victim(rbac, resource)
    rbac.apply_role(without(rbac.roles[role], group, resource, verb))
    try:
        status = 0
        for _ in range(50):  # the authorizer sees Role changes within moments
            status = await rbac.outcome(role, call)
            if status == 403:
                break
            await asyncio.sleep(0.1)
        assert status == 403, f"without {rule}, {breaks} breaks: the call must be refused"
    finally:
        rbac.apply_role(rbac.roles[role])


def recreate_victim(rbac: Rbac, resource: str) -> None:
    doc = {"apiVersion": "batch/v1", "kind": "Job", **job("victim")} if resource == "jobs" else {
        "apiVersion": "v1", "kind": "Pod", **pod("victim")}  # fmt: skip
    rbac.cluster.kubectl("delete", resource, "victim", "-n", rbac.ns, "--wait=true", "--ignore-not-found")
    rbac.cluster.kubectl("apply", "-n", rbac.ns, "-f", "-", input=yaml.safe_dump(doc))


@pytest.mark.parametrize("what", list(NOT_GRANTED))
async def test_what_the_chart_does_not_grant_is_refused(rbac: Rbac, what: str) -> None:
    role = "ksquad-bridge" if what.startswith("bridge") else "ksquad-worker"
    assert await rbac.outcome(role, NOT_GRANTED[what]) == 403
