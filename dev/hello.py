"""`ksquad hello`: start Temporal's dev server, run a small workflow (an activity, a durable timer, a search
attribute) through a worker, show its history and the UI address. A smoke check of the Temporal side alone."""

import asyncio
import signal
import time
from pathlib import Path
from urllib.parse import quote

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from dev.devserver import DevServer, preferred_port
from worker.registry import build_worker
from workflows import search_attributes as sa
from workflows.hello import HelloWorkflow

DEFAULT_UI_PORT = 8233


async def hello(keep: bool, state_dir: Path) -> int:
    t0 = time.monotonic()
    server = DevServer(
        db_file=state_dir / "temporal.db",
        log_file=state_dir / "temporal.log",
        ui_port=preferred_port(DEFAULT_UI_PORT),
    )
    async with server:
        print(
            f"Temporal dev server up on {server.target} in {time.monotonic() - t0:.1f}s "
            f"(state in {server.db_file})"
        )
        client = await Client.connect(server.target)
        task_queue = "ksquad-demo"
        workflow_id = f"demo/hello-{int(time.time())}"
        async with build_worker(client, task_queue):
            handle = await client.start_workflow(
                HelloWorkflow.run, "ksquad", id=workflow_id, task_queue=task_queue
            )
            result = await handle.result()
        print(f"\nworkflow {workflow_id} returned: {result!r}\nits history:")
        async for event in handle.fetch_history_events():
            summary = ""
            if event.HasField("user_metadata") and event.user_metadata.HasField("summary"):
                summary = " - " + event.user_metadata.summary.data.decode().strip('"')
            print(
                f"  {event.event_id:>3} {EventType.Name(event.event_type).removeprefix('EVENT_TYPE_')}{summary}"
            )
        query = f'{sa.PHASE.name} = "Succeeded"'
        await _wait_visible(client, query, workflow_id)
        count = (await client.count_workflows(query)).count
        print(f"\nworkflows where {query}: {count} (search attributes work)")

        assert server.ui_url is not None
        async with httpx.AsyncClient() as http:
            status = (await http.get(server.ui_url)).status_code
        url = f"{server.ui_url}/namespaces/default/workflows/{quote(workflow_id, safe='')}/{handle.result_run_id}/history"
        print(f"\nTemporal UI: {server.ui_url} (HTTP {status})\nthis run:    {url}")
        if keep:
            # Stop on Ctrl-C or SIGTERM by our own handlers, as `ksquad dev` does: started from a script in the
            # background, a process inherits SIGINT ignored and would never hear Ctrl-C's signal otherwise.
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            print("\nThe dev server keeps running; Ctrl-C stops it.", flush=True)
            await stop.wait()
        else:
            print(
                f"\nThe dev server stops now; its state stays in {server.db_file}. "
                "`ksquad hello --keep` leaves the UI up."
            )
    return 0


async def _wait_visible(client: Client, query: str, workflow_id: str) -> None:
    """Visibility is eventually consistent: wait (bounded) until the workflow shows up in a listing."""
    for _ in range(50):
        async for wf in client.list_workflows(query):
            if wf.id == workflow_id:
                return
        await asyncio.sleep(0.1)
