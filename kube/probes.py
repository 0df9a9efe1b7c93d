"""Liveness and readiness endpoints for a process's Kubernetes probes, and its Prometheus metrics, served beside
its real work."""

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping

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
        self.port = port
        self.server = _QuietServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Probes":
        # Bound here, not by uvicorn in its task: a port already taken then fails the process at once with the
        # port in the error, where uvicorn's sys.exit inside a task left a worker half shut down and never ready.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind(("0.0.0.0", self.port))
        except OSError as err:
            listener.close()
            raise OSError(err.errno, f"the health port {self.port}: {err.strerror}") from None
        self.task = asyncio.create_task(self.server.serve(sockets=[listener]))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


class Readiness:
    """Ready while every dependency answers: each check (store ping, Temporal health, the API server...) runs
    every few seconds; `details()` says which one does not, for /healthz and /readyz."""

    def __init__(self, checks: Mapping[str, Callable[[], Awaitable[bool]]], every: float = 5.0) -> None:
        self.checks = checks
        self.every = every
        self.state = dict.fromkeys(checks, False)

    @property
    def ready(self) -> bool:
        return all(self.state.values())

    def details(self) -> dict[str, object]:
        return dict(self.state)

    async def check(self) -> None:
        for name, check in self.checks.items():
            try:
                self.state[name] = await asyncio.wait_for(check(), self.every)
            except Exception:  # a dependency that fails to answer is not ready, whatever the error
                self.state[name] = False

    async def watch(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.every)
