"""A corpus of invalid Runs (invalid-runs.yaml, plus inputs of 300 KB) through both front doors:

- `ksquad run -f` against `ksquad dev`: the whole file is refused, each document's bad field named, nothing
  applied;
- `kubectl apply --server-side` against the control plane, with the bridge running as the chart deploys it:
  either the CRD's schema refuses it (the apiserver names the field), or the bridge does (the Run ends Failed
  with reason InvalidSpec and the field in its message) and no workflow is started. (Client-side apply copies
  the object into an annotation, which kubectl caps at 256 KB before anything of ours sees it.)

Hypothesis fuzzing of RunSpec and Retry-After parsing is in tests/workflows/test_spec.py and test_policies.py.
"""

import asyncio
import copy
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.service import RPCError, RPCStatusCode

from tests.crd_bridge.conftest import StackFactory
from tests.support.dev import DevProcess
from workflows.spec import MAX_INPUTS_BYTES

CORPUS = Path(__file__).with_name("invalid-runs.yaml")
OVERSIZE = {"case": "inputs of 300 KB", "spec": {"inputs": {"log": "x" * 300_000}}, "field": "spec.inputs"}


def corpus() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = yaml.safe_load(CORPUS.read_text())
    return [*cases, OVERSIZE]


def manifest(index: int, case: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    spec = {"agents": ["dev-1"], **copy.deepcopy(case.get("spec", {}))}
    doc: dict[str, Any] = {
        "apiVersion": "ksquad.io/v1alpha1",
        "kind": "Run",
        "metadata": {"name": f"bad-{index:02d}"},
        "spec": spec,
        **case.get("top", {}),
    }
    if namespace:
        doc["metadata"]["namespace"] = namespace
    return doc


def names_field(text: str, field: str) -> bool:
    """`field` (a dotted path) appears in `text` as a path, list indexes written either way."""
    text = re.sub(r"\[(\d+)\]", r".\1", text)
    return re.search(rf"(?<![\w]){re.escape(field)}(?![\w])", text) is not None


async def test_invalid_runs_are_refused_by_ksquad_run_with_each_field_named(
    tmp_path: Path, fault_counts: Counter[str]
) -> None:
    cases = corpus()
    path = tmp_path / "invalid.yaml"
    path.write_text(yaml.safe_dump_all([manifest(i, c) for i, c in enumerate(cases)]))
    dev = DevProcess(tmp_path)
    await dev.start()
    try:
        result = await dev.cli("run", "-f", str(path))
        listed = await dev.cli("runs", "list", "-o", "json")
    finally:
        await dev.stop()
    assert result.code == 1
    lines = result.err.splitlines()
    for i, case in enumerate(cases):
        mine = [line for line in lines if line.strip().startswith(f"document {i + 1} (Run bad-{i:02d})")]
        assert any(names_field(line, case["field"]) for line in mine), (
            f"{case['case']}: {mine or result.err[:2000]}"
        )
    assert len(result.err) < 20_000, "oversize input is named, not echoed back"
    assert str(MAX_INPUTS_BYTES) in result.err
    assert listed.json()["items"] == [], "nothing of the file was applied"
    fault_counts["bad_input.embedded_cases"] += len(cases)


async def test_invalid_runs_are_refused_on_a_cluster_by_the_schema_or_by_the_bridge(
    start_stack: StackFactory, fault_counts: Counter[str]
) -> None:
    stack = await start_stack()
    by_schema, by_bridge = [], []
    cases = [(case, manifest(i, case, stack.namespace)) for i, case in enumerate(corpus())]

    def apply(doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return stack.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(doc), check=False)

    # Applied together (each its own kubectl, as a user would), then each answer read on its own.
    applied = await asyncio.gather(*(asyncio.to_thread(apply, doc) for _, doc in cases))
    accepted = []
    for (case, doc), done in zip(cases, applied, strict=True):
        if done.returncode != 0:
            assert names_field(done.stderr, case["field"]), f"{case['case']}: {done.stderr[:2000]}"
            assert len(done.stderr) < 20_000
            by_schema.append(case["case"])
        else:
            accepted.append((case, doc))
    runs = await asyncio.gather(
        *(
            stack.wait_phase(doc["metadata"]["name"], {"Failed", "Pending", "Succeeded"}, within=60)
            for _, doc in accepted
        )
    )
    for (case, doc), run in zip(accepted, runs, strict=True):
        status = run["status"]
        assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec"), f"{case['case']}: {status}"
        assert names_field(status["message"], case["field"]), f"{case['case']}: {status['message']}"
        assert len(status["message"]) < 5_000
        with pytest.raises(RPCError) as described:  # no workflow was started for it
            await stack.temporal.get_workflow_handle(
                f"{stack.namespace}/{doc['metadata']['name']}"
            ).describe()
        assert described.value.status == RPCStatusCode.NOT_FOUND, f"{case['case']}: {described.value}"
        by_bridge.append(case["case"])
    print(f"refused by the CRD schema: {len(by_schema)}; by the bridge: {by_bridge}")
    # They were accepted, then Failed with no Event: an admission rule now names spec.inputs.
    assert OVERSIZE["case"] in by_schema, "300 KB of inputs are refused when applied"
    fault_counts["bad_input.cluster_cases"] += len(by_schema) + len(by_bridge)
    fault_counts["bad_input.cluster_refused_by_schema"] += len(by_schema)
    fault_counts["bad_input.cluster_refused_by_bridge"] += len(by_bridge)
