"""Squad memory on the embedded default (Temporal's dev server, the worker, SQLite, local sandboxes of the reference
agent, the scripted model, ksquad's API): a Run of Team `payments` remembers a decision (the model calls
`ksquad_remember`); the next Run of that Team starts with it in its conversation, attributed to the first Run; a Run
of Team `search` sees none of it; the developer finds it by text, adds, edits, exports and deletes entries with the
CLI."""

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dev.stack import DevStack, dev_stack
from testbed.embedded import stack_options, wait_terminal

NS = "bench"  # wait_terminal's namespace
API = "ksquad.io/v1alpha1"
DECISION = "Payment tests freeze the clock; never sleep in them"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "first": [
        {"tool_calls": [{"name": "ksquad_remember", "arguments": {"kind": "decision", "text": DECISION}}]},
        {"text": "remembered"},
    ],
    "second": [{"text": "read it"}],
    "third": [{"text": "read nothing"}],
}


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as stack:
        yield stack


def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, "metadata": {"name": name, "namespace": NS}, "spec": spec}


def run(name: str, team: str, agent: str) -> dict[str, Any]:
    return obj(
        "Run", name, {"teamRef": team, "agents": [agent], "inputs": {"task": "Fix the payment tests."}}
    )


async def test_a_teams_next_run_reads_what_the_last_one_remembered_and_another_team_does_not(
    dev: DevStack,
) -> None:
    agents = [
        obj("Agent", a, {"modelEndpointRef": "local", "model": a}) for a in ("first", "second", "third")
    ]
    await dev.runs.apply(
        [
            *agents,
            obj("Team", "payments", {"agents": ["first"]}),
            obj("Team", "search", {"agents": ["third"]}),
        ]
    )
    await dev.runs.apply([run("remembers", "payments", "first")])
    assert await wait_terminal(dev, ["remembers"], within=90) == {"remembers": "Succeeded"}
    await dev.runs.apply([run("recalls", "payments", "second"), run("elsewhere", "search", "third")])
    assert await wait_terminal(dev, ["recalls", "elsewhere"], within=90) == {
        "recalls": "Succeeded",
        "elsewhere": "Succeeded",
    }

    assert dev.scripted is not None
    calls = {c.model: c for c in dev.scripted.calls}
    assert calls["first"].tool_results == ["remembered in teams/payments as entry 1"]
    recalled = "\n".join(calls["second"].context)
    assert f"[decision] {DECISION} (by {NS}/remembers attempt 1)" in recalled, calls["second"].context
    assert not any(DECISION in text for text in calls["third"].context), (
        "Team search reads only its own memory"
    )

    (entry,) = await dev.store.memory(NS, "teams", "payments")
    remembers = await dev.runs.get(NS, "remembers")
    assert (entry.kind, entry.author.run, entry.author.run_uid, entry.author.user) == (
        "decision",
        f"{NS}/remembers",
        remembers.uid,
        dev.runs.user,
    )

    async def ksquad(*args: str) -> str:
        """The CLI, as the developer runs it (its own process; the stack's API answers from this test's loop)."""
        cli = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "cli.main", "--state-dir", str(dev.state_dir), "memory"),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(cli.communicate(), 60)
        assert cli.returncode == 0, err.decode()
        return out.decode()

    found = json.loads(await ksquad("list", "team/payments", "-n", NS, "--search", "freeze", "-o", "json"))
    assert [e["text"] for e in found["entries"]] == [DECISION]
    assert "entry 2 added" in await ksquad(
        "add", "team/payments", "-n", NS, "--kind", "link", "https://ci/payments"
    )
    assert "entry 1 changed" in await ksquad(
        "edit", "team/payments", "1", "-n", NS, "--kind", "decision", "Freeze it"
    )
    exported = [json.loads(line) for line in (await ksquad("export", "team/payments", "-n", NS)).splitlines()]
    assert [(e["id"], e["kind"], e["text"], e.get("edited_by")) for e in exported] == [
        (1, "decision", "Freeze it", dev.runs.user),
        (2, "link", "https://ci/payments", None),
    ]
    assert "entry 2 deleted" in await ksquad("delete", "team/payments", "2", "-n", NS)
    assert "Freeze it" in await ksquad("list", "team/payments", "-n", NS)
