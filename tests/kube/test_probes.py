"""The health endpoints every ksquad process serves: a taken health port fails the process at once, saying which
port, instead of leaving it running and never ready (CI: a worker whose port another process took between the
test's choice and its bind logged uvicorn's error, shut its Temporal worker down and hung for 90 s)."""

import asyncio
import base64
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from dev.devserver import DevServer
from kube.probes import Probes


def taken_port() -> socket.socket:
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))
    holder.listen()
    return holder


async def test_probes_answer_and_a_taken_port_fails_entering_with_the_port_named() -> None:
    with taken_port() as holder:
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=f"the health port {port}: Address already in use"):
            async with Probes(port, lambda: True):
                pass
    free = taken_port()
    port = free.getsockname()[1]
    free.close()
    async with (
        Probes(port, lambda: False, lambda: {"store": False}),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        assert (await http.get("/healthz")).json() == {"ok": True, "store": False}
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.json()) == (503, {"ready": False, "store": False})


async def test_a_worker_whose_health_port_is_taken_exits_non_zero_naming_it(
    dev_server: DevServer, tmp_path: Path
) -> None:
    seal_key = tmp_path / "seal.key"
    seal_key.write_text(base64.b64encode(secrets.token_bytes(32)).decode())
    with taken_port() as holder:
        port = holder.getsockname()[1]
        env = {
            **os.environ,
            "KSQUAD_TEMPORAL_ADDRESS": dev_server.target,
            "KSQUAD_DATABASE_URL": f"sqlite:///{tmp_path / 'ksquad.db'}",
            "KSQUAD_SANDBOX_BACKEND": "local",
            "KSQUAD_SEAL_KEY_FILE": str(seal_key),
            "KSQUAD_HEALTH_PORT": str(port),
        }
        worker = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "worker.main"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert worker.returncode != 0
    assert f"the health port {port}: Address already in use" in worker.stderr, worker.stderr[-2000:]
