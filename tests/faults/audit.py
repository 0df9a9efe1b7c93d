"""What every fault test checks at the end, on the embedded stack: each run ended, in exactly one workflow,
reached exactly one terminal phase, and made exactly one model call per attempt (a retried activity that
re-sent the same A2A message was recognised by the agent, not run again)."""

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client

from dev.stack import DevStack
from testbed.embedded import NAMESPACE, run_docs
from workflows.status import Phase


def task_of(name: str) -> str:
    return f"task of {name}"


def runs(prefix: str, count: int) -> list[dict[str, Any]]:
    """Runs of the instant agent, each with its own task text, so the model's calls can be told apart."""
    docs = run_docs(prefix, count)
    for doc in docs:
        doc["spec"]["inputs"] = {"task": task_of(doc["metadata"]["name"])}
    return docs


async def unfinished(dev: DevStack, names: set[str]) -> int:
    objects = await dev.runs.objects.of_kind("Run", NAMESPACE)
    return sum(
        1
        for r in objects
        if r.name in names and not Phase((r.status or {}).get("phase") or "Pending").terminal
    )


async def executions_per_run(client: Client) -> Counter[str]:
    return Counter([w.id async for w in client.list_workflows('WorkflowType = "RunWorkflow"')])


@dataclass
class Audit:
    phases: Counter[str] = field(default_factory=Counter)
    missing_workflows: set[str] = field(default_factory=set)
    doubled_workflows: dict[str, int] = field(default_factory=dict)
    calls_not_attempts: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (calls, attempts)
    terminal_events: Counter[str] = field(default_factory=Counter)
    model_calls: int = 0

    def assert_nothing_lost_or_doubled(self, names: set[str], context: str) -> None:
        assert self.phases == {"Succeeded": len(names)}, f"{context}: {self.phases}"
        assert not self.missing_workflows, f"{context}: runs without a workflow: {self.missing_workflows}"
        assert not self.doubled_workflows, (
            f"{context}: runs with more than one workflow: {self.doubled_workflows}"
        )
        assert not self.calls_not_attempts, f"{context}: model calls != attempts: {self.calls_not_attempts}"
        wrong = {n: c for n, c in self.terminal_events.items() if c != 1}
        assert not wrong and len(self.terminal_events) == len(names), (
            f"{context}: each run reaches a terminal phase exactly once: {wrong or self.terminal_events}"
        )


async def audit(dev: DevStack, names: set[str]) -> Audit:
    assert dev.scripted is not None
    result = Audit()
    executions = await executions_per_run(dev.client)
    result.missing_workflows = {n for n in names if f"{NAMESPACE}/{n}" not in executions}
    result.doubled_workflows = {w: c for w, c in executions.items() if c > 1 and w.split("/", 1)[1] in names}
    calls = Counter(c.task for c in dev.scripted.calls)
    for run in await dev.runs.objects.of_kind("Run", NAMESPACE):
        if run.name not in names:
            continue
        status = run.status or {}
        result.phases[status.get("phase") or ""] += 1
        attempts = int(status.get("attempt") or 0)
        result.model_calls += calls[task_of(run.name)]
        if calls[task_of(run.name)] != attempts:
            result.calls_not_attempts[run.name] = (calls[task_of(run.name)], attempts)
        for event in await dev.store.events(run.uid):
            if event.kind == "phase" and Phase(event.data["phase"]).terminal:
                result.terminal_events[run.name] += 1
    return result
