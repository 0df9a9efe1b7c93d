"""RunSpec accepts the seed's manifest verbatim and rejects bad values with messages naming the field."""

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from workflows.model import InvalidObject
from workflows.spec import MAX_INPUTS_BYTES, parse_run_manifest, parse_run_spec

SEED = Path(__file__).parents[2] / "examples" / "fix-flaky-tests.yaml"


def test_the_seed_manifest_parses_verbatim_with_defaults() -> None:
    manifest = parse_run_manifest(yaml.safe_load(SEED.read_text()))
    spec = manifest.spec
    assert (manifest.metadata.namespace, manifest.metadata.name) == ("ksquad-system", "fix-flaky-tests")
    assert spec.team_ref == "payments-squad"
    assert spec.agents == ["dev-1"]
    assert spec.work_item_ref == "wi-8123"
    assert spec.inputs == {"task": "Stabilize the flaky payment-retry test."}
    assert spec.sandbox_policy.runtime_class == "gvisor"
    assert spec.retry_policy.max_retries == 2
    assert spec.retry_policy.backoff_seconds == 10
    assert spec.retry_policy.max_backoff_seconds == 300


def test_two_retries_by_default_even_without_a_retry_policy() -> None:
    assert parse_run_spec({"agents": ["dev-1"]}).retry_policy.max_retries == 2


def test_camel_case_round_trip() -> None:
    spec = parse_run_spec(yaml.safe_load(SEED.read_text())["spec"])
    dumped = spec.model_dump(mode="json")
    assert dumped["sandboxPolicy"] == {"runtimeClass": "gvisor", "class": "interactive", "pool": None}
    assert parse_run_spec(dumped) == spec


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (
            {"retryPolicy": {"maxRetries": 50}},
            "spec.retryPolicy.maxRetries",
            "less than or equal to 20 (got 50)",
        ),
        (
            {"sandboxPolicy": {"runtimeClass": "docker"}},
            "spec.sandboxPolicy.runtimeClass",
            "'gvisor', 'kata' or 'runc'",
        ),
        (
            {"timeouts": {"claimSeconds": -5}},
            "spec.timeouts.claimSeconds",
            "greater than or equal to 1 (got -5)",
        ),
        ({"timeouts": {"runSeconds": 0}}, "spec.timeouts.runSeconds", "greater than or equal to 1"),
        ({"timeouts": {"pausedSeconds": -1}}, "spec.timeouts.pausedSeconds", "greater than or equal to 1"),
        (
            {"retryPolicy": {"backoffSeconds": 60, "maxBackoffSeconds": 5}},
            "spec.retryPolicy",
            "must not be below",
        ),
        ({"agents": ["Dev_1"]}, "spec.agents.0", "should match pattern"),
        ({"agentz": ["dev-1"]}, "spec.agentz", "unknown field"),
        ({"inputs": {"task": 7}}, "spec.inputs.task", "valid string"),
        (
            {"inputs": {"big": "x" * (MAX_INPUTS_BYTES + 1)}},
            "spec.inputs",
            f"more than the {MAX_INPUTS_BYTES} allowed",
        ),
        ({"agents": []}, "spec", "name at least one agent"),
        (
            {
                "placement": {
                    "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}}
                }
            },
            "spec.placement.affinity",
            "podAffinity: only nodeAffinity is allowed",
        ),
    ],
)
def test_invalid_specs_name_the_field(spec: dict[str, Any], field: str, words: str) -> None:
    data = {"agents": ["dev-1"], **spec}
    with pytest.raises(InvalidObject) as caught:
        parse_run_spec(data)
    problem = next((p for p in caught.value.problems if p.startswith(f"{field}:")), None)
    assert problem is not None, caught.value.problems
    assert words in problem
    assert len(str(caught.value)) < 2000, "an oversize input is named, not echoed back"


def test_a_manifest_of_the_wrong_kind_says_so() -> None:
    with pytest.raises(InvalidObject, match=r"kind: Input should be 'Run'"):
        parse_run_manifest(
            {
                "apiVersion": "ksquad.io/v1alpha1",
                "kind": "Job",
                "metadata": {"name": "x"},
                "spec": {"agents": ["a"]},
            }
        )


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
spec_keys = st.sampled_from(
    [
        "teamRef",
        "projectRef",
        "agents",
        "workItemRef",
        "inputs",
        "model",
        "modelEndpointRef",
        "sandboxPolicy",
        "retryPolicy",
        "timeouts",
        "unknown",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(spec_keys, json_values, max_size=6))
def test_fuzzed_specs_parse_or_fail_with_named_fields(data: dict[str, Any]) -> None:
    problems: list[str] = []
    try:
        spec = parse_run_spec(data)
    except InvalidObject as err:  # the only exception bad input may raise
        problems = err.problems
    else:
        assert spec.agents or spec.team_ref
        return
    assert problems
    assert all(p.startswith("spec") and ": " in p for p in problems)


def test_a_run_name_longer_than_a_label_value_is_refused_naming_metadata_name() -> None:
    # It validated, then failed at Job creation (the name labels the sandboxes; label values are 63 at most).
    manifest = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": "r" * 64},
        "spec": {"agents": ["dev-1"]},
    }
    with pytest.raises(InvalidObject, match=r"metadata\.name"):
        parse_run_manifest(manifest)
    assert parse_run_manifest({**manifest, "metadata": {"name": "r" * 63}}).metadata.name == "r" * 63
