"""Recording a Run's execution never loses a status written meanwhile (found by bench.interleaved: a Run whose
workflow finished before the start's record landed kept revision 4 and no phase, its status replaced by the older
one the record had read: a state that lied for good)."""

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from store import Store
from store.objects import ObjectStore


async def test_a_status_written_between_the_records_read_and_write_is_kept(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        objects = ObjectStore(store)
        run, _ = await objects.apply("Run", "ns", "r", {"agents": ["a"]})
        execute = AsyncConnection.execute
        raced = False

        async def status_lands_after_the_read(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
            nonlocal raced
            if isinstance(statement, sa.Update) and not raced:  # the record's write: the workflow was quicker
                raced = True
                done = {"phase": "Succeeded", "workflow": {"id": "ns/r", "firstRunId": "chain-1"}}
                assert await objects.write_run_status("ns", "r", run.uid, 4, done, [])
            return await execute(self, statement, *args, **kwargs)

        AsyncConnection.execute = status_lands_after_the_read  # type: ignore[method-assign]
        try:
            recorded = await objects.record_run_chain("ns", "r", run.uid, "chain-1")
        finally:
            AsyncConnection.execute = execute  # type: ignore[method-assign]
        assert raced, "the status landed between the record's read and its write"
        assert recorded == "chain-1"
        stored = await objects.get("Run", "ns", "r")
        assert stored is not None and stored.status is not None
        assert stored.status["phase"] == "Succeeded", stored.status
    finally:
        await store.close()


async def test_a_run_its_workflow_was_started_for_shows_pending_until_the_workflow_says_more(
    tmp_path: Path,
) -> None:
    """The embedded stack's acknowledgement (the bridge's on a cluster): the workflow sends its first status with
    its next change, and a Run must not sit without a phase meanwhile (a store outage can make that a while)."""
    store = await Store.open(f"sqlite:///{tmp_path / 'ksquad.db'}")
    try:
        objects = ObjectStore(store)
        run, _ = await objects.apply("Run", "ns", "r", {"agents": ["a"]})
        assert await objects.record_run_chain("ns", "r", run.uid, "chain-1") == "chain-1"
        stored = await objects.get("Run", "ns", "r")
        assert stored is not None and stored.status is not None
        assert (stored.status["phase"], stored.status["reason"]) == ("Pending", "WorkflowStarted")
        running = {"phase": "Running", "workflow": {"id": "ns/r", "firstRunId": "chain-1"}}
        assert await objects.write_run_status("ns", "r", run.uid, 2, running, [])
        assert await objects.record_run_chain("ns", "r", run.uid, "chain-1") == "chain-1"
        stored = await objects.get("Run", "ns", "r")
        assert stored is not None and stored.status is not None and stored.status["phase"] == "Running"
    finally:
        await store.close()
