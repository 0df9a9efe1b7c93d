"""The work item as the coordination record, on the embedded default (Temporal's dev server, the worker, SQLite,
local sandboxes of the reference agent, the scripted model, the API over HTTP): a person makes an item and
comments; a Run on it fails its first attempt and says so on the item; the retry, in a new sandbox, reads that
and the person's comment, succeeds, says so, publishes its answer to the item and marks it done; each entry is
attributed, and the Run's ending is recorded last, once, by the orchestrator; a write with the first attempt's
fence after the retry claimed is refused with 409 and is not in the item. A Run cancelled and a Run timed out,
whose agent wrote no ending, have theirs recorded by ksquad."""

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.callers import ItemAccess, item_token, read_key
from dev.stack import ITEM_KEY_FILE, TOKEN_FILE, DevStack, dev_stack
from store import work_item_key
from store.work_items import ORCHESTRATOR
from testbed.embedded import stack_options, wait_terminal
from workflows.signals import RunSignal

NS = "bench"  # wait_terminal's namespace
API = "ksquad.io/v1alpha1"
SCRIPT: dict[str, list[dict[str, Any]]] = {
    "fixer": [{"error": 500}, {"text": "froze the clock in the test"}],
    "held": [{"hold": True, "text": "too late"}],
}


@pytest.fixture
async def dev(tmp_path: Path) -> AsyncIterator[DevStack]:
    async with dev_stack(stack_options(tmp_path / ".ksquad", SCRIPT)) as stack:
        yield stack


async def ended_on_item(api: httpx.AsyncClient, item: str, within: float = 15) -> list[dict[str, Any]]:
    """The item's entries once the orchestrator has recorded a Run's ending on it (the Run's phase is mirrored a
    moment before the workflow's last step records it)."""
    deadline = time.monotonic() + within
    while True:
        entries: list[dict[str, Any]] = (await api.get(f"/items/{NS}/{item}/entries")).json()["entries"]
        if any(e["kind"] == "ended" for e in entries) or time.monotonic() > deadline:
            return entries
        await asyncio.sleep(0.1)


async def test_a_retry_reads_what_the_failed_attempt_and_a_person_wrote_and_a_stale_holder_writes_nothing(
    dev: DevStack,
) -> None:
    token = (dev.state_dir / TOKEN_FILE).read_text().strip()
    async with httpx.AsyncClient(base_url=dev.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
        made = await api.post(
            f"/items/{NS}",
            json={"id": "PAY-9", "title": "test_payment_retry is flaky", "body": "It fails one run in ten."},
        )
        assert made.status_code == 201, made.text
        await api.post(f"/items/{NS}/PAY-9/comments", json={"body": "Look at the clock the test reads."})
        await dev.runs.apply(
            [
                {
                    "apiVersion": API,
                    "kind": "Agent",
                    "metadata": {"name": "fixer", "namespace": NS},
                    "spec": {"modelEndpointRef": "local", "model": "fixer"},
                },
                {
                    "apiVersion": API,
                    "kind": "Run",
                    "metadata": {"name": "fix-pay-9", "namespace": NS},
                    "spec": {
                        "agents": ["fixer"],
                        "inputs": {"task": "Fix the flaky test."},
                        "workItemRef": "PAY-9",
                        "retryPolicy": {"backoffSeconds": 1, "maxBackoffSeconds": 1},
                    },
                },
            ]
        )
        assert await wait_terminal(dev, ["fix-pay-9"], within=90) == {"fix-pay-9": "Succeeded"}
        entries = await ended_on_item(api, "PAY-9")
        item = (await api.get(f"/items/{NS}/PAY-9")).json()

        # The stale holder: attempt 1's token, with attempt 1's fence, after the retry claimed.
        history = await dev.store.claim_history(work_item_key(NS, "PAY-9"))
        first_fence = history[0].fence
        run = await dev.runs.get(NS, "fix-pay-9")
        stale = ItemAccess(NS, "PAY-9", f"{NS}/fix-pay-9", run.uid, 1, first_fence, int(time.time()) + 600)
        late = await api.post(
            f"/items/{NS}/PAY-9/comments",
            json={"body": "attempt 1, late"},
            headers={"Authorization": f"Bearer {item_token(read_key(dev.state_dir / ITEM_KEY_FILE), stale)}"},
        )
        after = (await api.get(f"/items/{NS}/PAY-9/entries")).json()["entries"]

    developer = dev.runs.user
    said = [
        (e["author"].get("run"), e["author"].get("attempt"), e["body"])
        for e in entries
        if e["kind"] in ("created", "comment")
    ]
    assert said[:2] == [
        (None, None, "test_payment_retry is flaky"),
        (None, None, "Look at the clock the test reads."),
    ]
    assert said[2][:2] == (f"{NS}/fix-pay-9", 1) and "Attempt 1 of run" in said[2][2], said
    assert "failed: " in said[2][2] and "HTTP 500" in said[2][2], said[2]
    assert said[3:] == [
        (
            f"{NS}/fix-pay-9",
            2,
            f"Attempt 2 of run {NS}/fix-pay-9 finished: its answer is the Run's (its status and its artifact `answer`)",
        )
    ]
    states = [(e["author"].get("attempt"), e["data"]["state"]) for e in entries if e["kind"] == "state"]
    assert states == [(1, "in-progress"), (2, "done")], "the first attempt took it up, the retry finished it"
    published = [(e["author"].get("attempt"), e["data"]["name"]) for e in entries if e["kind"] == "artifact"]
    assert published == [(2, "answer")], entries
    *by_people_and_runs, ended = entries
    assert all(e["author"]["user"] == developer for e in by_people_and_runs), (
        "each entry is the developer's, by hand or by run"
    )
    assert (ended["kind"], ended["author"]["user"], ended["author"]["run"]) == (
        "ended",
        ORCHESTRATOR,
        f"{NS}/fix-pay-9",
    )
    assert ended["body"] == f"{NS}/fix-pay-9 ended Succeeded (Succeeded) after 2 attempts", ended
    assert ended["data"]["phase"] == "Succeeded" and ended["fence"] is None
    fences = {e["author"].get("attempt"): e["fence"] for e in by_people_and_runs if e["author"].get("run")}
    assert fences[1] < fences[2], "each attempt wrote under its own claim's fence"
    assert item["state"] == "done"

    assert dev.scripted is not None
    calls = dev.scripted.calls
    first, retry = [c for c in calls if c.model == "fixer"]
    assert any("Look at the clock the test reads." in text for text in first.context), first.context
    assert any("Attempt 1 of run" in text and "HTTP 500" in text for text in retry.context), retry.context

    assert late.status_code == 409 and "no longer holds" in late.json()["error"], late.text
    assert after == entries, "the stale write is not in the item"


async def test_every_ending_is_recorded_on_the_item_once_whether_or_not_the_agent_wrote(
    dev: DevStack,
) -> None:
    """A Run cancelled while its agent waits for the model, and one whose only attempt outlives its deadline: the
    agent wrote no ending of its own, ksquad records each on its item, once, with the phase and reason."""
    assert dev.scripted is not None
    dev.scripted.held = True
    token = (dev.state_dir / TOKEN_FILE).read_text().strip()
    async with httpx.AsyncClient(base_url=dev.api_url, headers={"Authorization": f"Bearer {token}"}) as api:
        for item in ("PAY-11", "PAY-12"):
            made = await api.post(f"/items/{NS}", json={"id": item, "title": f"{item} is flaky"})
            assert made.status_code == 201, made.text

        def run(name: str, item: str, **spec: Any) -> dict[str, Any]:
            return {
                "apiVersion": API,
                "kind": "Run",
                "metadata": {"name": name, "namespace": NS},
                "spec": {"agents": ["holder"], "inputs": {"task": "Wait."}, "workItemRef": item, **spec},
            }

        await dev.runs.apply(
            [
                {
                    "apiVersion": API,
                    "kind": "Agent",
                    "metadata": {"name": "holder", "namespace": NS},
                    "spec": {"modelEndpointRef": "local", "model": "held"},
                },
                run("cancelled", "PAY-11"),
                run("timed-out", "PAY-12", timeouts={"runSeconds": 2}, retryPolicy={"maxRetries": 0}),
            ]
        )
        deadline = time.monotonic() + 60
        while dev.scripted.in_flight < 2:
            assert time.monotonic() < deadline, "both Runs' model calls are held"
            await asyncio.sleep(0.1)
        await dev.runs.signal(NS, "cancelled", RunSignal.CANCEL, "not needed any more")
        assert await wait_terminal(dev, ["cancelled", "timed-out"], within=90) == {
            "cancelled": "Cancelled",
            "timed-out": "Failed",
        }
        endings = {}
        for item in ("PAY-11", "PAY-12"):
            entries = await ended_on_item(api, item)
            endings[item] = [(e["author"]["user"], e["body"]) for e in entries if e["kind"] == "ended"]
    dev.scripted.held = False
    assert endings == {
        "PAY-11": [(ORCHESTRATOR, f"{NS}/cancelled ended Cancelled (Cancelled) after 1 attempt")],
        "PAY-12": [(ORCHESTRATOR, f"{NS}/timed-out ended Failed (RunTimeout) after 1 attempt")],
    }
