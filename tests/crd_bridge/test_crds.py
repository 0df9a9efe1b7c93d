"""The CRDs are generated from the pydantic models, the committed copy matches, and the real API server
accepts the seed's Run and rejects invalid ones with messages naming the field."""

import json
from pathlib import Path

import pytest
import yaml

from crd_bridge.crds import render
from testbed.controlplane import ControlPlane

ROOT = Path(__file__).parents[2]
CRDS = ROOT / "charts" / "ksquad" / "crds" / "ksquad.io.yaml"
SEED = ROOT / "examples" / "fix-flaky-tests.yaml"


def test_the_committed_crds_are_the_generated_ones() -> None:
    assert CRDS.read_text() == render(), "run `python -m crd_bridge.crds > charts/ksquad/crds/ksquad.io.yaml`"


@pytest.fixture
def crds(ksquad_cluster: ControlPlane) -> ControlPlane:
    return ksquad_cluster


def run_manifest(name: str, namespace: str, **spec: object) -> str:
    doc = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"agents": ["dev-1"], **spec},
    }
    return yaml.safe_dump(doc)


def test_the_seed_run_applies_unchanged_and_shows_its_columns(crds: ControlPlane, namespace: str) -> None:
    seed = yaml.safe_load(SEED.read_text())
    seed["metadata"]["namespace"] = namespace
    crds.kubectl("apply", "-f", "-", input=yaml.safe_dump(seed))
    got = json.loads(crds.kubectl("get", "kr", "fix-flaky-tests", "-n", namespace, "-o", "json").stdout)
    assert got["spec"]["sandboxPolicy"] == {"runtimeClass": "gvisor", "class": "interactive"}, (
        "defaults applied"
    )
    assert got["spec"]["retryPolicy"]["backoffSeconds"] == 10
    table = crds.kubectl("get", "ksquad", "-n", namespace).stdout
    assert table.split("\n")[0].split() == ["NAME", "PHASE", "AGENT", "ATTEMPT", "RESUME-AT", "AGE"]
    crds.kubectl(
        "patch",
        "kr",
        "fix-flaky-tests",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": {"phase": "Running", "agent": "dev-1", "attempt": 1, "revision": 3}}),
    )
    row = crds.kubectl("get", "kr", "fix-flaky-tests", "-n", namespace, "--no-headers").stdout.split()
    assert row[1:4] == ["Running", "dev-1", "1"]
    # A paused run's resume time, in the future: kubectl printed a `date` column as <invalid>.
    paused = {
        "phase": "Paused",
        "pauseReason": "RateLimited",
        "resumeAt": "2099-01-01T00:00:00Z",
        "revision": 4,
    }
    crds.kubectl(
        "patch",
        "kr",
        "fix-flaky-tests",
        "-n",
        namespace,
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": paused}),
    )
    row = crds.kubectl("get", "kr", "fix-flaky-tests", "-n", namespace, "--no-headers").stdout.split()
    assert row[4] == "2099-01-01T00:00:00Z", row


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"retryPolicy": {"maxRetries": 50}}, "spec.retryPolicy.maxRetries: Invalid value: 50"),
        (
            {"sandboxPolicy": {"runtimeClass": "docker"}},
            'spec.sandboxPolicy.runtimeClass: Unsupported value: "docker"',
        ),
        ({"timeouts": {"claimSeconds": -5}}, "spec.timeouts.claimSeconds: Invalid value: -5"),
        ({"retryPolicy": {"backoffSeconds": 60, "maxBackoffSeconds": 5}}, "spec.retryPolicy: Invalid value"),
        ({"agents": []}, "name at least one agent in spec.agents"),
        ({"agents": ["Not_A_Name"]}, "spec.agents[0]"),
        ({"retryPolicy": {"maxRetries": -1}}, "spec.retryPolicy.maxRetries: Invalid value: -1"),
        ({"retryPolicy": {"backoffSeconds": 0}}, "spec.retryPolicy.backoffSeconds: Invalid value: 0"),
        ({"timeouts": {"runSeconds": 10**9}}, "spec.timeouts.runSeconds: Invalid value"),
        ({"timeouts": {"pausedSeconds": 0}}, "spec.timeouts.pausedSeconds: Invalid value: 0"),
        ({"sandboxPolicy": {"class": "realtime"}}, 'spec.sandboxPolicy.class: Unsupported value: "realtime"'),
        ({"teamRef": "Payments Squad"}, "spec.teamRef: Invalid value"),
        ({"workItemRef": "w" * 2000}, "spec.workItemRef: Too long"),
        # with the chart's MutatingAdmissionPolicy installed, the API server reports this one while applying the
        # policy's patch (".spec.inputs.task: expected string"), before schema validation: still named
        ({"inputs": {"task": 7}}, "spec.inputs.task"),
        ({"model": ""}, "spec.model: Invalid value"),
        ({"inputs": {"log": "x" * 270_000}}, "spec.inputs.log: Too long"),
    ],
)
def test_invalid_runs_are_rejected_naming_the_field(
    crds: ControlPlane, namespace: str, spec: dict[str, object], words: str
) -> None:
    done = crds.kubectl("apply", "-f", "-", input=run_manifest("bad", namespace, **spec), check=False)
    assert done.returncode != 0
    assert words in done.stderr, done.stderr


def test_every_resource_kind_is_served(crds: ControlPlane, namespace: str) -> None:
    kinds = crds.kubectl("api-resources", "--api-group=ksquad.io", "-o", "name").stdout.split()
    assert sorted(kinds) == sorted(
        f"{p}.ksquad.io"
        for p in ("runs", "agents", "modelendpoints", "tools", "mcpservers", "skills", "teams", "projects")
    )
    agent = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Agent",
        "metadata": {"name": "dev-1", "namespace": namespace},
        "spec": {"model": "gpt-x", "modelEndpointRef": "openai", "allowedTools": ["notes"]},
    }
    crds.kubectl("apply", "-f", "-", input=yaml.safe_dump(agent))
    assert "gpt-x" in crds.kubectl("get", "kagent", "-n", namespace).stdout


def test_a_run_name_longer_than_a_label_value_is_refused(crds: ControlPlane, namespace: str) -> None:
    done = crds.kubectl("apply", "-f", "-", input=run_manifest("r" * 64, namespace), check=False)
    assert done.returncode != 0
    assert "metadata.name: at most 63 characters" in done.stderr, done.stderr


def test_a_runs_spec_cannot_change_once_it_exists(crds: ControlPlane, namespace: str) -> None:
    # Edits were accepted and silently ignored (the workflow runs the spec it started with).
    crds.kubectl("apply", "-f", "-", input=run_manifest("fixed", namespace))
    crds.kubectl("apply", "-f", "-", input=run_manifest("fixed", namespace))  # the same spec: fine
    done = crds.kubectl(
        "apply", "-f", "-", input=run_manifest("fixed", namespace, model="another"), check=False
    )
    assert done.returncode != 0
    assert "spec cannot change once the Run exists" in done.stderr, done.stderr


def test_kubectl_explain_describes_each_field_of_a_runs_spec(crds: ControlPlane) -> None:
    # 14 descriptions for ~160 fields: kubectl explain said nothing of most.
    for path, fields in {
        "runs.spec": [
            "agents",
            "teamRef",
            "workItemRef",
            "inputs",
            "sandboxPolicy",
            "retryPolicy",
            "timeouts",
        ],
        "runs.spec.retryPolicy": ["maxRetries", "backoffSeconds", "maxBackoffSeconds"],
        "runs.spec.timeouts": [
            "claimSeconds",
            "runSeconds",
            "pausedSeconds",
            "queuedSeconds",
            "rateLimitedSeconds",
        ],
    }.items():
        explained = crds.kubectl("explain", path).stdout
        for field in fields:
            described = (
                explained.split(f"  {field}\t", 1)[1].split("\n\n", 1)[0]
                if f"  {field}\t" in explained
                else ""
            )
            assert len(described.split("\n")) >= 2, f"{path}.{field} has no description:\n{explained}"


def test_inputs_too_large_in_all_are_refused_naming_spec_inputs(crds: ControlPlane, namespace: str) -> None:
    # Each value fits, together they do not: accepted, then Failed with no Event, before the admission rule.
    # (create, not apply: apply's last-applied annotation would be refused first, and CEL rules with it)
    inputs = {"a": "x" * 140_000, "b": "y" * 140_000}
    done = crds.kubectl(
        "create", "-f", "-", input=run_manifest("too-much", namespace, inputs=inputs), check=False
    )
    assert done.returncode != 0
    assert "spec.inputs: more than 262144 characters in all" in done.stderr, done.stderr[:2000]


@pytest.mark.parametrize("key", ["../token", "..data", "apiKey/../../etc", "."])
def test_a_credential_key_is_a_secrets_key_never_a_path(crds: ControlPlane, namespace: str, key: str) -> None:
    """A warm pod and an endpoint agent read a credential as a file under its Secret's mount: an editor's key
    of "../token" would reach the pod's other files (its service-account token, say)."""
    for kind, spec in (
        ("Agent", {"modelEndpointRef": "m", "credentialSecretRef": {"name": "model-key", "key": key}}),
        (
            "ModelEndpoint",
            {"url": "https://api.example/v1", "credentialSecretRef": {"name": "model-key", "key": key}},
        ),
    ):
        doc = {
            "apiVersion": "ksquad.io/v1alpha1",
            "kind": kind,
            "metadata": {"name": "k", "namespace": namespace},
        }
        done = crds.kubectl("apply", "-f", "-", input=yaml.safe_dump({**doc, "spec": spec}), check=False)
        assert done.returncode != 0, f"{kind} with key {key!r} was accepted"
        assert "spec.credentialSecretRef.key: Invalid value" in done.stderr, done.stderr


def test_an_mcp_server_of_a_transport_the_agent_does_not_speak_is_refused(
    crds: ControlPlane, namespace: str
) -> None:
    """The agent speaks streamable HTTP and the older HTTP+SSE transport; `stdio` (a process in the sandbox) is
    refused, naming the field, and `sse` is taken."""
    doc = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "MCPServer",
        "metadata": {"name": "m", "namespace": namespace},
    }
    spec = {"url": "https://mcp.example/mcp", "transport": "stdio"}
    done = crds.kubectl("apply", "-f", "-", input=yaml.safe_dump({**doc, "spec": spec}), check=False)
    assert done.returncode != 0, "a stdio MCPServer was accepted"
    assert 'spec.transport: Unsupported value: "stdio"' in done.stderr, done.stderr
    sse = crds.kubectl(
        "apply", "-f", "-", input=yaml.safe_dump({**doc, "spec": {**spec, "transport": "sse"}})
    )
    assert sse.returncode == 0
    accepted = crds.kubectl("apply", "-f", "-", input=yaml.safe_dump({**doc, "spec": {"url": spec["url"]}}))
    assert accepted.returncode == 0
