"""After the suite: every credential the tests handed out is looked for where ksquad must never copy it.

- The control plane's audit log (testbed/controlplane.py's AUDIT_POLICY): every Job, Pod,
  ConfigMap, Event, NetworkPolicy and ksquad object written during the session, as it was sent. Every sandbox
  Pod (a Pod carrying ksquad.io/ labels) must also run as non-root, without a service-account token. No Job or
  Pod may hold any Run's inputs or any Agent's system prompt or Skill's instructions (as the Runs, Agents and
  Skills written during the session carried them): those reach a sandbox over A2A only.
- Every workflow history on the session's Temporal server, as stored (payloads included), and in every embedded
  stack's Temporal database left under the session's temporary directory (`<state>/temporal.db`, with its
  write-ahead log: `ksquad dev` and the embedded tests' stacks), as its bytes.
- Every log file under the session's temporary directory (the bridge's, the worker's, `ksquad dev`'s).

The secrets are the values the tests put in credential Secrets or hand to the stacks as API keys."""

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from testbed.agents import MODEL_KEY, ROTATED_MODEL_KEY
from testbed.controlplane import audit_events_at

SECRET_VALUES = (MODEL_KEY, ROTATED_MODEL_KEY, "sk-test-dev")


@dataclass
class ScanReport:
    scanned: int = 0  # objects, histories or files
    sandbox_pods: int = 0
    leaks: list[str] = field(default_factory=list)
    insecure_pods: list[str] = field(default_factory=list)
    private_texts: int = 0  # Runs' inputs, Agents' prompts, Skills' instructions looked for in Jobs and Pods
    texts_in_pods: list[str] = field(default_factory=list)


def _leaked(content: str | bytes, where: str, report: ScanReport) -> None:
    data = content.encode() if isinstance(content, str) else content
    for secret in SECRET_VALUES:
        if secret.encode() in data:
            report.leaks.append(f"{where} holds {secret[:6]}…")


def _private_texts(events: list[dict[str, Any]]) -> set[str]:
    """What Run authors wrote that only a sandbox's A2A message may carry (long enough not to match by chance)."""
    texts: set[str] = set()
    for event in events:
        obj, resource = event.get("requestObject") or {}, event.get("objectRef", {}).get("resource")
        if not isinstance(obj, dict):  # a JSON patch's operations: no object to read a spec from
            continue
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            continue
        inputs = spec.get("inputs")  # an invalid Run (the fuzz tests) may carry anything here
        if resource == "runs" and isinstance(inputs, dict):
            texts.update(str(v) for v in inputs.values())
        elif resource == "agents":
            texts.add(str(spec.get("systemPrompt") or ""))
        elif resource == "skills":
            texts.add(str(spec.get("instructions") or ""))
    return {t for t in texts if len(t) >= 12}


def scan_audit_log(path: Path) -> ScanReport:
    """Every write the audit log at `path` recorded, the files the API server rotated it into (`audit-<time>.log`
    beside it) first: a long session's early writes are there."""
    report = ScanReport()
    if not path.is_file():
        raise FileNotFoundError(f"no audit log at {path}: nothing to scan, which proves nothing")
    events = audit_events_at(path)
    private = _private_texts(events)
    report.private_texts = len(private)
    for event in events:
        obj: dict[str, Any] | list[Any] | None = event.get("requestObject")  # a list: a JSON patch
        if not obj:
            continue
        ref = event.get("objectRef", {})
        where = f"{event.get('verb')} {ref.get('resource')}/{ref.get('subresource') or ''} {ref.get('namespace')}/{ref.get('name')}"
        report.scanned += 1
        _leaked(json.dumps(obj), where, report)
        if ref.get("resource") in ("jobs", "pods"):
            text = json.dumps(obj)
            report.texts_in_pods += [
                f"{where} holds {t[:24]!r}" for t in private if json.dumps(t)[1:-1] in text
            ]
        if (
            isinstance(obj, dict)
            and ref.get("resource") == "pods"
            and event.get("verb") == "create"
            and not ref.get("subresource")
        ):
            labels = obj.get("metadata", {}).get("labels", {})
            if any(k.startswith("ksquad.io/") for k in labels):
                report.sandbox_pods += 1
                spec = obj.get("spec", {})
                if spec.get("automountServiceAccountToken") is not False:
                    report.insecure_pods.append(f"{where}: mounts a service-account token")
                if spec.get("securityContext", {}).get("runAsNonRoot") is not True:
                    report.insecure_pods.append(f"{where}: may run as root")
                containers = spec.get("containers", []) + spec.get("initContainers", [])
                if any(
                    (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False
                    for c in containers
                ):
                    report.insecure_pods.append(f"{where}: a container may escalate privileges")
    return report


async def scan_histories(client: Client) -> ScanReport:
    report = ScanReport()
    async for execution in client.list_workflows():
        history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
        report.scanned += 1
        # The protobuf as stored: payload bytes appear as they are (JSON would show them base64-encoded).
        _leaked(
            b"".join(e.SerializeToString() for e in history.events), f"the history of {execution.id}", report
        )
    return report


def scan_temporal_databases(root: Path) -> ScanReport:
    """The embedded stacks' Temporal servers, which end with their stacks: each database file as stored (SQLite
    pages and the write-ahead log beside them), histories, search attributes and memos included."""
    report = ScanReport()
    for database in root.rglob("temporal.db"):
        report.scanned += 1
        for part in (database, database.with_name(f"{database.name}-wal")):
            if part.is_file():
                _leaked(part.read_bytes(), f"the Temporal database {part}", report)
    return report


def scan_logs(root: Path) -> ScanReport:
    report = ScanReport()
    for log in root.rglob("*.log"):
        if log.is_file():
            report.scanned += 1
            _leaked(log.read_bytes(), str(log), report)
    return report
