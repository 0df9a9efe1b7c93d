"""`ksquad-agent`: the reference sandbox agent as an A2A server (JSON-RPC binding).

    ksquad-agent --host $(POD_IP) --port 8080

Serves the agent card at `/.well-known/agent-card.json`, A2A JSON-RPC at `/`, `/healthz` (alive),
`/readyz` (ready to take a task: it has a contract or can get one in the first message) and `/ksquad/stats`
(what it was asked to do). JSON-RPC answers only the attempt's caller (agent.callers: a bearer token checked
against the hash the sandbox was given, or a shared endpoint's signed token); the rest is public. On SIGTERM it
cancels its tasks (each reports CANCELED), then stops.
"""

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import signal
import socket
from pathlib import Path
from types import FrameType

import uvicorn
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill
from starlette.applications import Starlette
from starlette.authentication import BaseUser
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

import tracing
from agent.callers import Caller, Check, check_from_env
from agent.contract import contract_from_env
from agent.executor import KsquadAgentExecutor
from agent.task_store import RetainingTaskStore

log = logging.getLogger("ksquad.agent")


def agent_card(url: str, name: str = "ksquad-agent") -> AgentCard:
    return AgentCard(
        name=name,
        description="ksquad's reference sandbox agent: a model and MCP tools, driven by an execution contract.",
        version="0.1.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json"],
        skills=[
            AgentSkill(
                id="run",
                name="Run a ksquad work item",
                description="Carries out a Run's task.",
                tags=["ksquad"],
            )
        ],
    )


def staged_toolchains() -> list[str]:
    """The files the sandbox's init containers staged for this agent's skills."""
    root = Path(os.environ.get("KSQUAD_TOOLCHAINS_DIR", "/opt/ksquad/toolchains"))
    if not root.is_dir():
        return []
    return sorted(str(f.relative_to(root)) for f in root.rglob("*") if f.is_file())


PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/ksquad/stats", "/.well-known/agent-card.json"})


class CallerUser(BaseUser):
    """The authenticated caller as Starlette (and so the a2a-sdk's call context) sees it: its scope is the
    user name the task store partitions tasks by."""

    def __init__(self, caller: Caller) -> None:
        self.caller = caller

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def display_name(self) -> str:
        return self.caller.scope


class CallerAuth:
    """Every request but the public paths carries the attempt's token, or is refused with 401 before the a2a-sdk
    sees it. The caller goes into the request's scope (`auth`), where the executor reads it."""

    def __init__(self, app: ASGIApp, check: Check) -> None:
        self.app = app
        self.check = check

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        result = await self.check.caller(token) if token else "no bearer token"
        if isinstance(result, str):
            client = scope.get("client") or ("?", 0)
            log.warning("refused %s %s from %s: %s", scope["method"], scope["path"], client[0], result)
            response = JSONResponse(
                {"error": f"unauthorized: {result}"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
            )
            await response(scope, receive, send)
            return
        scope["user"], scope["auth"] = CallerUser(result), result
        await self.app(scope, receive, send)


def _bearer(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


def build_app(executor: KsquadAgentExecutor, url: str, check: Check) -> ASGIApp:
    card = agent_card(url)
    handler = DefaultRequestHandler(agent_executor=executor, task_store=RetainingTaskStore(), agent_card=card)

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def readyz(_: Request) -> JSONResponse:
        return JSONResponse({"ready": True, "contract": executor.env_contract is not None})

    async def stats(_: Request) -> JSONResponse:
        staged = await asyncio.to_thread(staged_toolchains)
        return JSONResponse(
            {
                **dataclasses.asdict(executor.stats),
                "toolchains": staged,
                "conversations": len(executor.conversations),
            }
        )

    routes = [Route("/healthz", healthz), Route("/readyz", readyz), Route("/ksquad/stats", stats)]
    app = Starlette(
        routes=routes + create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/")
    )
    return tracing.TracedHttp(CallerAuth(app, check))


class AgentServer(uvicorn.Server):
    """uvicorn, but SIGTERM first cancels the agent's tasks so each reports CANCELED to its watchers."""

    def __init__(self, config: uvicorn.Config, executor: KsquadAgentExecutor) -> None:
        super().__init__(config)
        self.executor = executor
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self._draining is None and self.executor.running:
            log.info("SIGTERM: cancelling %d task(s)", len(self.executor.running))
            self._draining = asyncio.get_event_loop().create_task(self._drain(sig, frame))
            return
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await super().shutdown(sockets)
        # uvicorn raises the signal that stopped it again once it is done (the exit status says SIGTERM), and no
        # atexit handler runs then: the task's last spans go out now.
        await asyncio.to_thread(tracing.flush)

    async def _drain(self, sig: int, frame: FrameType | None) -> None:
        await self.executor.cancel_all()
        await asyncio.sleep(0.5)  # let the CANCELED events reach the open streams
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="ksquad-agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default=os.environ.get("KSQUAD_AGENT_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("KSQUAD_AGENT_PORT", "8080")))
    parser.add_argument(
        "--url",
        default=os.environ.get("KSQUAD_AGENT_URL"),
        help="the URL the agent card advertises (default: http://<host>:<port>/)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("a2a").setLevel(logging.WARNING)
    tracing.configure_or_exit("ksquad-agent")
    # What the imports built lives as long as the process: no garbage collection walks it again, nor does the
    # interpreter's exit (the worker's imports and exit: about a fifth less CPU).
    gc.freeze()
    executor = KsquadAgentExecutor(contract_from_env())
    advertised = args.host if args.host not in ("0.0.0.0", "::") else os.environ.get("POD_IP", "127.0.0.1")
    url = args.url or f"http://{advertised}:{args.port}/"
    config = uvicorn.Config(
        build_app(executor, url, check_from_env()),
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="off",
    )
    log.info("ksquad-agent serving A2A at %s", url)
    asyncio.run(AgentServer(config, executor).serve())


if __name__ == "__main__":
    main()
