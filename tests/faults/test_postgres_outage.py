"""PostgreSQL (the claims store) stopped while runs hold claims and more wait to claim, on the embedded stack
with the worker as its own process: claims fail closed (no run gets past Claiming, no agent is called without
its claim), the runs holding claims wait, and once the database is back every run finishes, each work item
claimed and released exactly once."""

import asyncio
from collections import Counter
from pathlib import Path

from store import Store, work_item_key
from testbed.embedded import MODEL, NAMESPACE, bench_stack, start_workers, stop_workers, wait_terminal
from testbed.postgres import PostgresServer
from tests.faults.audit import audit, runs, task_of

IN_FLIGHT = 6
DURING = 6
DOWN_SECONDS = 15


async def test_claims_fail_closed_while_postgres_is_down_and_runs_go_on_after(
    tmp_path: Path, outage_postgres: PostgresServer, fault_counts: Counter[str]
) -> None:
    script = {MODEL: [{"delay": 3, "text": "ok"}]}
    async with bench_stack(tmp_path, script, serve_worker=False) as (dev, _agent):
        assert dev.scripted is not None
        first, later = runs("held", IN_FLIGHT), runs("waiting", DURING)
        for doc in first + later:
            doc["spec"]["workItemRef"] = f"wi-{doc['metadata']['name']}"
        names = {d["metadata"]["name"] for d in first + later}
        [worker] = await start_workers(dev, 1, database_url=outage_postgres.dsn)
        try:
            await dev.runs.apply(first)
            for _ in range(300):  # every first run holds its claim and waits on the model
                if dev.scripted.in_flight == IN_FLIGHT:
                    break
                await asyncio.sleep(0.1)
            assert dev.scripted.in_flight == IN_FLIGHT
            outage_postgres.halt()
            try:
                await dev.runs.apply(later)
                await asyncio.sleep(DOWN_SECONDS)
                phases = {
                    r.name: (r.status or {}).get("phase")
                    for r in await dev.runs.objects.of_kind("Run", NAMESPACE)
                }
                assert {phases[d["metadata"]["name"]] for d in later} <= {"Pending", "Claiming"}, phases
                called = {c.task for c in dev.scripted.calls}
                assert not called & {task_of(d["metadata"]["name"]) for d in later}, (
                    "no agent ran without a claim"
                )
            finally:
                outage_postgres.resume()
            await wait_terminal(dev, sorted(names), within=300)
        finally:
            stop_workers([worker])
        result = await audit(dev, names)
        result.assert_nothing_lost_or_doubled(names, "after the PostgreSQL outage")
    store = await Store.open(outage_postgres.dsn)
    try:
        for name in sorted(names):
            history = [e.action for e in await store.claim_history(work_item_key(NAMESPACE, f"wi-{name}"))]
            assert history == ["claimed", "released"], f"{name}: {history}"
    finally:
        await store.close()
    fault_counts["postgres_outage.runs"] += len(names)
    fault_counts["postgres_outage.seconds_down"] += DOWN_SECONDS
