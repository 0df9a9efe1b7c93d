"""Sandboxes are ours because Kubernetes says so, never because of a label anyone may write.

Whoever may create pods in a Run's namespace can label one `job-name=<run>-exec-<n>` or `ksquad.io/state=warm`,
and a Job or ReplicaSet controller adopts an orphan pod whose labels match its selector (a Job's selector is its
own uid, which anyone who can read the Job knows). So a pod is a sandbox only when:
- its controller (the ownerReference with `controller: true`) is the Job the worker created for the attempt, or a
  ReplicaSet of the chart's pools (name from the worker's settings, uid read from the cluster); and
- its spec is the pod template ksquad made: the attempt's Job's own, or for a pool the template the chart
  rendered (never what the live ReplicaSet says: an editor could change that). Only what the scheduler and
  admission assign to a pod may differ (its node, its priority and preemption policy from its PriorityClass, the
  RuntimeClass's overhead, and the not-ready and unreachable tolerations that DefaultTolerationSeconds adds); a
  container, an environment variable, a volume, a host alias, a node selector or a toleration more is a
  difference.
A Job found under the attempt's name (409 on create) is taken only when an earlier try of the same activity
recorded its uid: the worker made it. Anything else fails the attempt with the reason.
"""

import copy
import re
from decimal import Decimal
from typing import Any

from kube import Obj

# Set on a pod after its controller made it (scheduling and admission, from objects no tenant writes), so not in the
# template.
ASSIGNED_POD_FIELDS = frozenset({"nodeName", "priority", "preemptionPolicy", "overhead"})
# The tolerations admission adds to every pod (DefaultTolerationSeconds): beside the template's, nothing else.
ADMISSION_TOLERATIONS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def controller(obj: Obj) -> Obj | None:
    for ref in obj["metadata"].get("ownerReferences", []):
        if ref.get("controller"):
            return dict(ref)
    return None


def controlled_by(obj: Obj, kind: str, owner: Obj) -> bool:
    ref = controller(obj)
    return (
        ref is not None
        and ref.get("kind") == kind
        and ref.get("uid") == owner["metadata"]["uid"]
        and ref.get("name") == owner["metadata"]["name"]
    )


def spec_difference(pod_spec: Obj, template_spec: Obj) -> str | None:
    """Where a pod's spec differs from the template it must run (None: it is what the controller makes)."""
    pod = {k: v for k, v in pod_spec.items() if k not in ASSIGNED_POD_FIELDS}
    template = {k: v for k, v in as_pod(template_spec).items() if k not in ASSIGNED_POD_FIELDS}
    added = [
        t
        for t in pod.get("tolerations", [])
        if t not in template.get("tolerations", [])
        and t.get("key") in ADMISSION_TOLERATIONS
        and t.get("effect") == "NoExecute"
        and t.get("operator") == "Exists"
    ]
    if added:
        pod["tolerations"] = [t for t in pod["tolerations"] if t not in added]
        if not pod["tolerations"] and "tolerations" not in template:
            del pod["tolerations"]
    return _difference(pod, template, "spec")


def template_difference(live: Obj, pinned: Obj) -> str | None:
    """Where a live ReplicaSet's pod template differs from the one it must make (None: the same)."""
    for part in ("labels", "annotations"):
        found = _difference(
            live.get("metadata", {}).get(part) or {},
            pinned.get("metadata", {}).get(part) or {},
            f"metadata.{part}",
        )
        if found:
            return found
    return _difference(live.get("spec", {}), pinned.get("spec", {}), "spec")


def as_pod(template_spec: Obj) -> Obj:
    """A pod template's spec with the defaults the API server gives a Pod only, never a template (SetDefaults_Pod):
    enableServiceLinks true, and each container's requests taken from its limits where it has none."""
    spec = copy.deepcopy(template_spec)
    spec.setdefault("enableServiceLinks", True)
    for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        resources = container.get("resources") or {}
        for name, value in (resources.get("limits") or {}).items():
            resources.setdefault("requests", {}).setdefault(name, value)
    return spec


def _difference(actual: Any, expected: Any, where: str) -> str | None:
    if isinstance(actual, dict) and isinstance(expected, dict):
        for key in sorted(set(actual) | set(expected)):
            if key not in expected:
                return f"{where}.{key} is not in the template"
            if key not in actual:
                return f"{where}.{key} is missing"
            found = _difference(actual[key], expected[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(actual, list) and isinstance(expected, list):
        if len(actual) != len(expected):
            return f"{where} has {len(actual)} items, the template {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            found = _difference(a, e, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if actual == expected else f"{where} differs"


PLACEMENT_KEYS = ("serviceAccountName", "nodeSelector", "tolerations", "affinity", "priorityClassName")
_SUFFIXES = {
    **{s: Decimal(1000) ** i for i, s in enumerate(("", "k", "M", "G", "T", "P", "E"))},
    **{s: Decimal(1024) ** (i + 1) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    "m": Decimal("0.001"),
    "u": Decimal("0.000001"),
    "n": Decimal("0.000000001"),
}


def quantity(value: str) -> Decimal | None:
    """A Kubernetes quantity's value ("0.5" and "500m" are one), or None when it is not one."""
    found = re.fullmatch(r"([0-9.]+)(?:([eE][-+]?[0-9]+)|([a-zA-Z]*))", str(value))
    if not found or found.group(3) not in (*_SUFFIXES, None):
        return None
    try:
        number = Decimal(found.group(1) + (found.group(2) or ""))
    except ArithmeticError:
        return None
    return number * _SUFFIXES[found.group(3) or ""]


def _same_quantities(actual: dict[str, str], wanted: dict[str, str]) -> bool:
    return set(actual) == set(wanted) and all(quantity(actual[k]) == quantity(wanted[k]) for k in wanted)


def _placed(key: str, value: Any) -> Any:
    """A placement field as it means: a toleration's operator is Equal unless it says Exists."""
    if key == "tolerations" and isinstance(value, list):
        return [{**t, "operator": t.get("operator") or "Equal"} for t in value if isinstance(t, dict)]
    return value or None


def placed_as(pod_spec: Obj, fields: Obj, resources: dict[str, dict[str, str]]) -> bool:
    """Whether a pool's template is placed as the run's sandbox would be (manifests.placement_fields and
    agent_resources): the same ServiceAccount, node selector, tolerations, affinity, priority class, and the agent
    container's requests and limits (quantities compared by value: the API server rewrites "0.5" as "500m")."""
    if any(_placed(key, pod_spec.get(key)) != _placed(key, fields.get(key)) for key in PLACEMENT_KEYS):
        return False
    agent: Obj = next((c for c in pod_spec.get("containers", []) if c.get("name") == "agent"), {})
    actual = agent.get("resources", {})
    return all(
        _same_quantities(actual.get(kind, {}), resources.get(kind, {})) for kind in ("requests", "limits")
    )


def mounted_secrets(pod_spec: Obj) -> set[str]:
    """The Secrets a pod spec (a pool's template) mounts as volumes."""
    return {
        v["secret"]["secretName"]
        for v in pod_spec.get("volumes", [])
        if v.get("secret", {}).get("secretName")
    }


def not_the_attempts_job(
    job: Obj, run_uid: str, attempt: int, token_sha256: str, recorded_uid: str | None
) -> str | None:
    """Why a Job found under the attempt's name is not the one the worker made for it (None: it is)."""
    meta = job["metadata"]
    ref = controller(job)
    if ref is None or ref.get("kind") != "Run" or ref.get("uid") != run_uid:
        return "it is not controlled by the Run"
    labels = meta.get("labels", {})
    if labels.get("ksquad.io/run-uid") != run_uid or labels.get("ksquad.io/attempt") != str(attempt):
        return "it is not labelled for this attempt"
    annotations = job["spec"]["template"]["metadata"].get("annotations", {})
    if annotations.get("ksquad.io/caller-token-sha256") != token_sha256:
        return "its pod template does not carry this attempt's caller token hash"
    if recorded_uid is None:
        return "no earlier try of this activity recorded making it"
    if meta["uid"] != recorded_uid:
        return f"it is not the Job an earlier try made (uid {recorded_uid}): it was replaced"
    return None
