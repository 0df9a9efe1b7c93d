"""The end-of-suite scanner (tests.support.secret_scan) finds what it looks for: a credential in a Pod's env or
in a log, a sandbox pod that could run as root with a token, and a Run's task text in a Job. (The scan itself runs when the session's
control plane and Temporal server stop: see tests/conftest.py.)"""

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from dev.devserver import DevServer
from testbed.agents import MODEL_KEY
from tests.support.secret_scan import scan_audit_log, scan_logs, scan_temporal_databases


def pod_created(name: str, spec: Any) -> str:
    return json.dumps(
        {
            "verb": "create",
            "objectRef": {"resource": "pods", "namespace": "ns", "name": name},
            "requestObject": {"metadata": {"labels": {"ksquad.io/run": "r"}}, "spec": spec},
        }
    )


def test_the_scanner_finds_a_copied_credential_and_an_unlocked_sandbox() -> None:
    # Not under the session's tmp_path: the end-of-suite scan of it would find these planted secrets.
    with tempfile.TemporaryDirectory() as tmp:
        scan_planted(Path(tmp))


def scan_planted(tmp_path: Path) -> None:
    locked = {
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True},
        "containers": [{"name": "agent", "securityContext": {"allowPrivilegeEscalation": False}}],
    }
    leaky = {
        **locked,
        "containers": [
            {
                "name": "agent",
                "env": [{"name": "KEY", "value": MODEL_KEY}],
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
    }
    unlocked = {"containers": [{"name": "agent"}]}
    audit = tmp_path / "audit.log"
    audit.write_text(
        "\n".join(
            [pod_created("fine", locked), pod_created("leaky", leaky), pod_created("unlocked", unlocked)]
        )
        + "\n"
    )
    report = scan_audit_log(audit)
    assert report.scanned == 3 and report.sandbox_pods == 3
    assert len(report.leaks) == 1 and "ns/leaky" in report.leaks[0]
    assert MODEL_KEY not in report.leaks[0], "the report names where, not the secret"
    assert {p.split(":")[0].split()[-1] for p in report.insecure_pods} == {"ns/unlocked"}
    assert len(report.insecure_pods) == 3, "token, root and privilege escalation each named"

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "worker.log").write_text(f"calling the model with {MODEL_KEY}\n")
    (tmp_path / "logs" / "bridge.log").write_text("nothing to see\n")
    logs = scan_logs(tmp_path / "logs")
    assert logs.scanned == 2 and len(logs.leaks) == 1 and "worker.log" in logs.leaks[0]


def test_the_scanner_finds_a_runs_task_in_a_job() -> None:
    task = "Rotate the ledger keys before Friday."
    run = {
        "verb": "create",
        "objectRef": {"resource": "runs", "namespace": "ns", "name": "r"},
        "requestObject": {"spec": {"inputs": {"task": task}}},
    }
    agent = {
        "verb": "create",
        "objectRef": {"resource": "agents", "namespace": "ns", "name": "a"},
        "requestObject": {"spec": {"systemPrompt": "You are the ledger keeper."}},
    }
    job: dict[str, Any] = {
        "verb": "create",
        "objectRef": {"resource": "jobs", "namespace": "ns", "name": "r-exec-1"},
        "requestObject": {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "agent",
                                "env": [
                                    {"name": "CONTRACT", "value": json.dumps({"inputs": {"task": task}})}
                                ],
                            }
                        ]
                    }
                }
            }
        },
    }
    clean = {**job, "objectRef": {**job["objectRef"], "name": "r-exec-2"}, "requestObject": {"spec": {}}}
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit.log"
        audit.write_text("\n".join(json.dumps(e) for e in (job, run, agent, clean)) + "\n")  # the Job first
        report = scan_audit_log(audit)
    assert report.private_texts == 2
    assert report.texts_in_pods == ["create jobs/ ns/r-exec-1 holds 'Rotate the ledger keys b'"]


def test_the_scanner_reads_the_logs_the_api_server_rotated_and_refuses_a_missing_one() -> None:
    leaky = {"containers": [{"name": "agent", "env": [{"name": "KEY", "value": MODEL_KEY}]}]}
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit.log"
        (Path(tmp) / "audit-2026-12-07T04-50-00.000.log").write_text(pod_created("early", leaky) + "\n")
        audit.write_text(pod_created("late", {}) + "\n")
        report = scan_audit_log(audit)
        assert report.scanned == 2
        assert len(report.leaks) == 1 and "ns/early" in report.leaks[0], "the rotated log's write is scanned"
        audit.unlink()
        with pytest.raises(FileNotFoundError, match="proves nothing"):
            scan_audit_log(audit)


def test_a_json_patch_is_scanned_too() -> None:
    """A JSON patch's body is a list of operations, not an object: scanned as it is, with no spec to read."""
    patch = {
        "verb": "patch",
        "objectRef": {"resource": "runs", "namespace": "ns", "name": "r"},
        "requestObject": [{"op": "add", "path": "/metadata/annotations/x", "value": MODEL_KEY}],
    }
    with tempfile.TemporaryDirectory() as tmp:
        audit = Path(tmp) / "audit.log"
        audit.write_text(json.dumps(patch) + "\n")
        report = scan_audit_log(audit)
    assert report.scanned == 1 and len(report.leaks) == 1 and "ns/r" in report.leaks[0]


async def test_the_scanner_reads_an_embedded_stacks_temporal_database() -> None:
    """A key copied into a workflow's start input (a client without the codec) is found in the database file the
    embedded server leaves, as `ksquad dev` and the embedded tests' stacks leave theirs; a clean one is not."""
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (("leaky", f"call the model with {MODEL_KEY}"), ("clean", "nothing to see")):
            async with DevServer(db_file=Path(tmp) / name / "temporal.db", ui=False) as server:
                client = await Client.connect(server.target)
                await client.start_workflow("Anything", text, id=name, task_queue="nobody-polls")
        report = scan_temporal_databases(Path(tmp))
    assert report.scanned == 2
    assert len(report.leaks) == 1 and "/leaky/temporal.db" in report.leaks[0], report.leaks
