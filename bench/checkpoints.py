"""The cost of durable agent progress per model turn (agent.journal, api.attempts): what the reference agent adds
to each turn of a model call and one tool call, measured against the model call itself in the same run.

Each turn records its steps as the agent does: the turn and the tool call it starts (one write, before the tool
runs), then the tool's result (one write, before the next model call: it is also the fence check). The steps go
over HTTP to the attempts API (sealed with a codec key, fenced on the attempt's claim) into the store: SQLite (the
embedded default) and PostgreSQL (a cluster). The baseline is a call to the scripted model answering at once, with
the agent's own client: a floor for a model turn (a real one takes from half a second to minutes).

    python -m bench.checkpoints [--turns N]

Reports per turn: milliseconds (p50/p99) of the two writes, bytes sent and bytes stored, the fence check alone
(a model call with nothing new to record), and the ratio to the model call's p50.
"""

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from starlette.applications import Starlette

from agent.callers import ItemAccess, item_token
from agent.contract import AttemptApi, Model
from agent.journal import Journal
from agent.model import complete
from agent.scripted_model import ScriptedModel, build_app
from api.attempts import attempt_routes
from api.errors import ROUTING_ERRORS
from bench.stats import percentiles, report
from store import Holder, Store, work_item_key
from store.schema import agent_checkpoints
from temporal_client.codec import EncryptionCodec
from testbed.asgi import serving
from testbed.postgres import PostgresServer

KEY = b"k" * 32
TURN_TEXT = "I will look at the test's clock handling first. " * 20  # about 1 KB of reasoning
TOOL_RESULT = "line of a file the tool read\n" * 140  # about 4 KB of tool output


async def measure(store_url: str, turns: int) -> dict[str, Any]:
    store = await Store.open(store_url)
    run = Holder("uid-bench", "bench/checkpoints", "bench@example.com")
    fence = (await store.claim(work_item_key("bench", "ITEM-1"), run, 3600)).fence
    codec = EncryptionCodec(os.urandom(32))
    app = Starlette(routes=attempt_routes(store, KEY, codec), exception_handlers=ROUTING_ERRORS)
    access = ItemAccess("bench", "ITEM-1", run.run, run.uid, 1, fence, 2**40)
    writes, checks = [], []
    sent = 0
    async with serving(app, host="127.0.0.1") as url:
        api = AttemptApi(url=url, token=item_token(KEY, access))
        journal = Journal(api)
        await journal.read()
        for step in range(1, turns + 6):
            call = {
                "id": f"call-{step}",
                "type": "function",
                "function": {"name": "notes", "arguments": "{}"},
            }
            turn = {"role": "assistant", "content": TURN_TEXT, "tool_calls": [call]}
            result = {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT}
            before = journal.bytes
            t0 = time.perf_counter()
            journal.add(step, "turn", {"message": turn})
            journal.add(step, "tool-started", {"id": call["id"], "name": "notes"})
            await journal.flush()
            journal.add(step, "tool", {"message": result})
            journal.model_called()  # the next model call asks: this flush writes the result and is the check
            await journal.flush()
            elapsed = (time.perf_counter() - t0) * 1000
            journal.model_called()
            t0 = time.perf_counter()
            await journal.flush()  # a model call with nothing new to record: the fence check alone
            check = (time.perf_counter() - t0) * 1000
            if step > 5:  # the first few warm up connections and the database
                writes.append(elapsed)
                checks.append(check)
                sent += journal.bytes - before
        async with store.engine.connect() as c:
            stored = (
                await c.execute(sa.select(sa.func.sum(sa.func.length(agent_checkpoints.c.payload))))
            ).scalar()
        steps = len(await store.checkpoints(run.uid))
    await store.close()
    return {
        "per_turn": percentiles(writes),
        "fence_check": percentiles(checks),
        "bytes_sent_per_turn": round(sent / turns),
        "bytes_stored_per_turn": round(int(stored or 0) / (turns + 5)),
        "clear_bytes_per_turn": len(json.dumps([TURN_TEXT, TOOL_RESULT])),
        "steps": steps,
    }


async def model_floor(turns: int) -> dict[str, float]:
    state = ScriptedModel()
    state.load({"models": {"bench": [{"text": TURN_TEXT}]}})
    samples = []
    async with serving(build_app(state), host="127.0.0.1") as url:
        model = Model(name="bench", url=f"{url}/v1")
        messages = [{"role": "user", "content": TOOL_RESULT}]
        for i in range(turns + 5):
            t0 = time.perf_counter()
            await complete(model, messages, [])
            if i >= 5:
                samples.append((time.perf_counter() - t0) * 1000)
    return percentiles(samples)


async def main(turns: int) -> None:
    floor = await model_floor(turns)
    results: dict[str, Any] = {"turns": turns, "model_call": floor}
    with tempfile.TemporaryDirectory() as tmp:
        results["sqlite"] = await measure(f"sqlite:///{Path(tmp) / 'bench.db'}", turns)
    postgres = PostgresServer()
    postgres.start()
    try:
        results["postgresql"] = await measure(postgres.create_database("checkpoints"), turns)
    finally:
        postgres.stop()
    for where in ("sqlite", "postgresql"):
        results[where]["ratio_to_model_call_p50"] = round(
            results[where]["per_turn"]["p50_ms"] / floor["p50_ms"], 2
        )
    report("checkpoints", results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=500)
    asyncio.run(main(parser.parse_args().turns))
