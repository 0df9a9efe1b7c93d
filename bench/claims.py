"""Claim-plus-release latency on PostgreSQL and SQLite, against a bare write round trip on the same database.

    python -m bench.claims [--iterations N]

For each database: N sequential claim+release pairs on distinct work items (each pair is two transactions
with fence checks and history rows), and, as the baseline measured in the same run, N pairs of bare
single-row UPDATE transactions on the same engine. Prints JSON.
"""

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.stats import percentiles, report
from store import Holder, Store
from testbed.postgres import PostgresServer


async def measure(url: str, iterations: int) -> dict[str, Any]:
    store = await Store.open(url)
    holder = Holder("bench-uid", "bench/run", "bench@example.com")
    try:
        async with store.engine.begin() as conn:
            await conn.execute(
                sa.text("CREATE TABLE IF NOT EXISTS bench_baseline (id INTEGER PRIMARY KEY, n INTEGER)")
            )
            await conn.execute(sa.text("DELETE FROM bench_baseline"))
            await conn.execute(sa.text("INSERT INTO bench_baseline (id, n) VALUES (1, 0)"))
        for i in range(20):  # warm the pool and the caches
            claim = await store.claim(f"warm-{i}", holder, 60)
            await store.release(f"warm-{i}", holder, claim.fence)
        pairs, bare = [], []
        for i in range(iterations):
            t0 = time.perf_counter()
            claim = await store.claim(f"wi-{i}", holder, 60)
            await store.release(f"wi-{i}", holder, claim.fence)
            pairs.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            for _ in range(2):
                async with store.engine.begin() as conn:
                    await conn.execute(sa.text("UPDATE bench_baseline SET n = n + 1 WHERE id = 1"))
            bare.append((time.perf_counter() - t0) * 1000)
    finally:
        await store.close()
    claim_stats, bare_stats = percentiles(pairs), percentiles(bare)
    return {
        "claim_release": claim_stats,
        "baseline_two_bare_updates": bare_stats,
        "ratio_p50": round(claim_stats["p50_ms"] / bare_stats["p50_ms"], 2),
    }


async def main(iterations: int) -> None:
    postgres = PostgresServer()
    postgres.start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            results = {
                "postgresql": await measure(postgres.dsn, iterations),
                "sqlite": await measure(f"sqlite:///{Path(tmp) / 'bench.db'}", iterations),
            }
    finally:
        postgres.stop()
    report("claims", {"iterations": iterations, **results})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=1000)
    asyncio.run(main(parser.parse_args().iterations))
