"""A placement as the worker applies it (pure): the cold Job's pod spec, and which warm pool serves a run placed
so. The cluster proofs: tests/chart/test_admission.py (what admission lets through) and tests/chart/test_placement.py
(the scheduler and a kwok node)."""

import copy
from typing import Any

from activities.sandboxes import SandboxSettings, job_manifest
from activities.sandboxes.manifests import agent_resources, placement_fields
from activities.sandboxes.ownership import placed_as, quantity
from workflows.contract import ExecutionContract, ModelRef, ResolvedAgent, RunIdentity
from workflows.spec import Placement, SandboxPolicy

GPU = Placement.model_validate(
    {
        "serviceAccountName": "gpu-runner",
        "nodeSelector": {"ksquad.io/pool": "gpu"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "resources": {"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": "1"}},
        "priorityClassName": "batch-high",
    }
)


def pod_spec(placement: Placement | None) -> dict[str, Any]:
    model = ModelRef(name="m", url="http://model.example/v1")
    agent = ResolvedAgent(name="dev-1", model=model, placement=placement)
    run = RunIdentity(namespace="payments", name="gpu", uid="uid-1", attempt=1, fence=1)
    contract = ExecutionContract(run=run, agent=agent, model=model)
    job = job_manifest(contract, SandboxPolicy(), SandboxSettings(), 600, "ab" * 32)
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


def test_a_placement_reaches_the_pod_spec_over_the_charts_defaults() -> None:
    spec = pod_spec(GPU)
    assert spec["serviceAccountName"] == "gpu-runner"
    assert spec["automountServiceAccountToken"] is False, "a placed sandbox still gets no token"
    assert spec["nodeSelector"] == {"ksquad.io/pool": "gpu"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["affinity"] == GPU.affinity
    assert spec["priorityClassName"] == "batch-high"
    (agent,) = spec["containers"]
    assert agent["resources"] == {
        "requests": {"cpu": "2", "memory": "512Mi"},
        "limits": {"memory": "2Gi", "nvidia.com/gpu": "1"},
    }, "the chart's requests and limits, the placement's over them key by key"


def test_without_a_placement_the_pod_is_the_charts() -> None:
    spec = pod_spec(None)
    assert spec["serviceAccountName"] == "ksquad-sandbox"
    assert not {"nodeSelector", "tolerations", "affinity", "priorityClassName"} & set(spec)
    assert spec["containers"][0]["resources"] == SandboxSettings().resources


def test_a_warm_pool_serves_only_runs_placed_as_its_template() -> None:
    settings = SandboxSettings()
    template = pod_spec(GPU)
    # As the API server returns a template: quantities rewritten, a toleration's operator left out when Equal.
    stored = copy.deepcopy(template)
    stored["containers"][0]["resources"]["requests"]["cpu"] = "2000m"
    assert placed_as(stored, placement_fields(settings, GPU), agent_resources(settings, GPU))
    assert not placed_as(stored, placement_fields(settings, None), agent_resources(settings, None)), (
        "a run placed nowhere in particular does not take a GPU pool's pod"
    )
    other = GPU.model_copy(update={"node_selector": {"ksquad.io/pool": "gpu-big"}})
    assert not placed_as(stored, placement_fields(settings, other), agent_resources(settings, other))
    plain = pod_spec(None)
    assert placed_as(plain, placement_fields(settings, None), agent_resources(settings, None))
    assert not placed_as(plain, placement_fields(settings, GPU), agent_resources(settings, GPU))
    equal = Placement.model_validate({"tolerations": [{"key": "team", "value": "a", "effect": "NoSchedule"}]})
    without_operator = pod_spec(equal)
    del without_operator["tolerations"][0]["operator"]
    assert placed_as(without_operator, placement_fields(settings, equal), agent_resources(settings, equal))


def test_quantities_compare_by_value() -> None:
    assert quantity("0.5") == quantity("500m")
    assert quantity("1Gi") == quantity("1024Mi")
    assert quantity("2k") == quantity("2e3") == quantity("2000")
    assert quantity("two") is None
