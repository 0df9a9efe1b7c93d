"""Serve an ASGI app (Starlette, an MCP server, the scripted model) in the test's event loop, on the test bed's
service address (where the cluster's pods reach it too)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import uvicorn

from testbed.isolate import free_port, service_address


@asynccontextmanager
async def serving(
    app: Any,
    host: str | None = None,
    lifespan: Literal["auto", "on", "off"] = "auto",
    tls: tuple[Path, Path] | None = None,
) -> AsyncIterator[str]:
    """Yields the base URL (`http://host:port`, or https with `tls`: certificate and key files) while uvicorn
    serves `app`."""
    host = host or service_address()
    port = free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan=lifespan)
    if tls is not None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan=lifespan,
            ssl_certfile=str(tls[0]),
            ssl_keyfile=str(tls[1]),
        )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started:
            break
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    else:
        raise RuntimeError(f"uvicorn did not start on {host}:{port}")
    try:
        yield f"{'https' if tls else 'http'}://{host}:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, 10)
        except TimeoutError:  # a request still in flight (a model told to think for minutes): drop it
            server.force_exit = True
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
