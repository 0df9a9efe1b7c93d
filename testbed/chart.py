"""The Helm chart, rendered by the real helm (built into the test cache) and applied piecewise in tests.

The piecewise tests use their own release namespace: ksquad-system belongs to tests/chart/, which installs
the chart there with `helm install`, as the README tells a user."""

import subprocess
from pathlib import Path
from typing import Any

import yaml

from activities.sandboxes.manifests import SandboxSettings
from testbed.controlplane import ControlPlane, cached_binaries_dir

CHART = Path(__file__).parents[1] / "charts" / "ksquad"
RELEASE_NAMESPACE = "ksquad-tests"
# What the test cluster serves, as `helm install` would discover it.
KUBE_VERSION = "1.36.3"
SERVED = ["admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]


def render(
    values: dict[str, Any],
    namespace: str = RELEASE_NAMESPACE,
    kube_version: str = KUBE_VERSION,
    api_versions: list[str] = SERVED,
) -> list[dict[str, Any]]:
    flags = ["--kube-version", kube_version, *(f"--api-versions={v}" for v in api_versions)]
    done = subprocess.run(
        [
            str(cached_binaries_dir() / "helm"),
            "template",
            "ksquad",
            str(CHART),
            "--namespace",
            namespace,
            "--values",
            "-",
            *flags,
        ],
        input=yaml.safe_dump(values),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


SERVED_NAMESPACES_POLICY = "ksquad-served-namespaces"


def apply(
    cluster: ControlPlane, docs: list[dict[str, Any]], kinds: set[str] | None = None
) -> list[dict[str, Any]]:
    """Apply the rendered objects of `kinds` (all when None); the release namespace is made when needed. Never
    the policy that refuses Runs outside the rendered namespaces: the test bed applies the chart's parts for many
    namespaces side by side (a stack each), and it would refuse every other's Runs (`helm install` in tests/chart
    installs it)."""
    chosen = [
        d
        for d in docs
        if (kinds is None or d["kind"] in kinds) and d["metadata"]["name"] != SERVED_NAMESPACES_POLICY
    ]
    if any(d["metadata"].get("namespace") == RELEASE_NAMESPACE for d in chosen):
        cluster.kubectl("create", "namespace", RELEASE_NAMESPACE, check=False)
    if chosen:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(chosen))
    return chosen


def worker_settings(docs: list[dict[str, Any]]) -> SandboxSettings:
    """The worker's sandbox settings exactly as the chart gives them (its ConfigMap ksquad-sandbox): the pools with
    the templates the chart rendered."""
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ksquad-sandbox"]
    return SandboxSettings.model_validate(yaml.safe_load(config["data"]["sandbox.yaml"]))
