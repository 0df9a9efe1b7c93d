"""`ksquad-worker` is ready only while it can work: its store and Temporal both answer (the chart's
readinessProbe takes a worker that lost its database out of service, and back once it returns)."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx

from dev.binaries import dying_with_parent
from dev.devserver import DevServer
from temporal_client.codec import ensure_key_file
from testbed.isolate import free_port
from testbed.postgres import PostgresServer

WORKER = str(Path(sys.executable).with_name("ksquad-worker"))


async def readyz(port: int) -> tuple[int, dict[str, object]]:
    async with httpx.AsyncClient() as http:
        response = await http.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        details = (await http.get(f"http://127.0.0.1:{port}/healthz", timeout=5)).json()
    return response.status_code, details


async def until(port: int, status: int, within: float = 30) -> dict[str, object]:
    details: dict[str, object] = {}
    for _ in range(int(within / 0.5)):
        try:
            code, details = await readyz(port)
            if code == status:
                return details
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)
    raise AssertionError(f"/readyz never answered {status} within {within}s: {details}")


async def test_the_worker_is_unready_while_its_database_is_down(
    outage_postgres: PostgresServer, dev_server: DevServer, task_queue: str, tmp_path: Path
) -> None:
    port = free_port("127.0.0.1")
    env = {
        **os.environ,
        "KSQUAD_TEMPORAL_ADDRESS": dev_server.target,
        "KSQUAD_DATABASE_URL": outage_postgres.dsn,
        "KSQUAD_TASK_QUEUE": task_queue,
        "KSQUAD_HEALTH_PORT": str(port),
        "KSQUAD_SANDBOX_BACKEND": "local",
        "KSQUAD_SEAL_KEY_FILE": str(tmp_path / "seal.key"),
    }
    ensure_key_file(tmp_path / "seal.key")
    with (tmp_path / "worker.log").open("wb") as log:
        worker = subprocess.Popen(dying_with_parent([WORKER]), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        assert await until(port, 200) == {"ok": True, "store": True, "temporal": True}
        outage_postgres.halt()
        assert (await until(port, 503))["store"] is False, "a worker without its database is not ready"
        outage_postgres.resume()
        assert (await until(port, 200))["store"] is True, "and ready again once it is back"
        assert worker.poll() is None, "it waited, it did not die"
    finally:
        worker.terminate()
        worker.wait(30)
