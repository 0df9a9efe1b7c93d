"""A server of the test bed as its own process (llama.cpp's server, mcp-proxy, another framework's agent): started,
waited for until a URL of it answers 200, stopped with the test."""

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from dev.binaries import dying_with_parent


@asynccontextmanager
async def serving_process(
    what: str,
    command: list[str],
    ready_url: str,
    log: Path,
    env: dict[str, str] | None = None,
    within: float = 120,
) -> AsyncIterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        dying_with_parent(command), env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            deadline = asyncio.get_running_loop().time() + within
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{what} exited {process.returncode}: {log.read_text()[-3000:]}")
                try:
                    if (await http.get(ready_url)).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if asyncio.get_running_loop().time() > deadline:
                    raise RuntimeError(
                        f"{what} did not answer {ready_url} in {within:.0f} s: {log.read_text()[-3000:]}"
                    )
                await asyncio.sleep(0.1)
        yield process
    finally:
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, 10)
        except subprocess.TimeoutExpired:
            process.kill()
