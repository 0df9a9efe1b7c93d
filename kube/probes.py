"""Liveness and readiness endpoints for a process's Kubernetes probes, and its Prometheus metrics, served beside
its real work."""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class _QuietServer(uvicorn.Server):
    """uvicorn that leaves signal handling to the process it serves."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Probes:
    """`/healthz` answers while the process lives; `/readyz` answers 200 while `ready()` is true (and says which
    dependency is not); `/metrics` is `metrics()`, in Prometheus' text format, when given."""

    def __init__(
        self,
        port: int,
        ready: Callable[[], bool],
        details: Callable[[], dict[str, object]] = dict,
        metrics: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        async def healthz(_: Request) -> JSONResponse:
            return JSONResponse({"ok": True, **details()})

        async def readyz(_: Request) -> JSONResponse:
            ok = ready()
            return JSONResponse({"ready": ok, **details()}, status_code=200 if ok else 503)

        async def exposition(_: Request) -> Response:
            assert metrics is not None
            return Response(await metrics(), media_type=METRICS_CONTENT_TYPE)

        routes = [Route("/healthz", healthz), Route("/readyz", readyz)]
        if metrics is not None:
            routes.append(Route("/metrics", exposition))
        app = Starlette(routes=routes)
        self.server = _QuietServer(
            uvicorn.Config(app, host="0.0.0.0", port=port, log_level="warning", lifespan="off")
        )
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Probes":
        self.task = asyncio.create_task(self.server.serve())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
