"""A real model, locally: llama.cpp's OpenAI-compatible server serving SmolLM2-135M-Instruct (build-llama-server.sh:
built once from llama-cpp-python's source, cached with the test binaries). What it answers is the model's own:
tests assert that whatever it produces is handled (an answer, a tool call, usage), never what it says.

One slot (`--parallel 1`) by default: a second request waits for the first, as llama.cpp queues rather than
refuses. `OneSlotGate` stands in front as the gateways operators put before self-hosted models do: past its one
request in flight it answers 429 with Retry-After, without reaching the model."""

import asyncio
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from testbed.asgi import serving
from testbed.isolate import free_port, service_address
from testbed.served import serving_process

BUILD_SCRIPT = Path(__file__).with_name("build-llama-server.sh")
MODEL_NAME = "smollm2-135m-instruct"


class LocalModelError(Exception):
    pass


def cached_llama_server() -> Path:
    """The cache directory with `llama-server` and `smollm2.gguf`, built first when missing."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise LocalModelError(
            f"building llama-server failed ({BUILD_SCRIPT.name}, exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class LocalModel:
    url: str  # the OpenAI base URL (…/v1)
    name: str
    log: Path
    process: subprocess.Popen[bytes]


@asynccontextmanager
async def serving_local_model(
    root: Path, slots: int = 1, api_key: str | None = None, context: int = 8192
) -> AsyncIterator[LocalModel]:
    cache = await asyncio.to_thread(cached_llama_server)
    host, port = service_address(), free_port()
    log = root / f"llama-server-{port}.log"
    command = [
        str(cache / "llama-server"),
        "--model",
        str(cache / "smollm2.gguf"),
        "--alias",
        MODEL_NAME,
        "--host",
        host,
        "--port",
        str(port),
        "--parallel",
        str(slots),
        "--ctx-size",
        str(context * slots),
        "--threads",
        "2",
        # A 135M model can go on until its context is full (thousands of tokens at a few a second on a busy CI
        # machine): the server bounds each answer, as an operator bounds a shared model's.
        "--n-predict",
        "160",
        "--jinja",  # the model's chat template, tools included
        "--no-webui",
        *(["--api-key", api_key] if api_key else []),
    ]
    base = f"http://{host}:{port}"
    async with serving_process("llama-server", command, f"{base}/health", log) as process:
        yield LocalModel(f"{base}/v1", MODEL_NAME, log, process)


@dataclass
class OneSlotGate:
    """One request in flight to the model behind it; another meanwhile gets 429 with Retry-After."""

    upstream: str  # the model's base URL (…/v1)
    retry_after: int = 2
    url: str = ""
    busy: bool = False
    refused: int = 0
    served: int = 0

    def app(self) -> Starlette:
        async def forward(request: Request) -> Response:
            if self.busy:
                self.refused += 1
                return JSONResponse(
                    {"error": {"message": "the model is busy: one request at a time", "type": "rate_limit"}},
                    status_code=429,
                    headers={"Retry-After": str(self.retry_after)},
                )
            self.busy = True
            client = httpx.AsyncClient(timeout=httpx.Timeout(30, read=600))
            try:
                upstream = await client.send(
                    client.build_request(
                        request.method,
                        f"{self.upstream}/{request.path_params['rest']}",
                        content=await request.body(),
                        headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
                    ),
                    stream=True,
                )
            except BaseException:
                self.busy = False
                await client.aclose()
                raise

            async def body() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                finally:
                    await upstream.aclose()
                    await client.aclose()
                    self.busy = False
                    self.served += 1

            return StreamingResponse(
                body(),
                status_code=upstream.status_code,
                media_type=upstream.headers.get("content-type"),
            )

        return Starlette(routes=[Route("/v1/{rest:path}", forward, methods=["GET", "POST"])])


@asynccontextmanager
async def gated(upstream: str, retry_after: int = 2) -> AsyncIterator[OneSlotGate]:
    gate = OneSlotGate(upstream, retry_after)
    async with serving(gate.app()) as url:
        gate.url = f"{url}/v1"
        yield gate


def main(argv: list[str]) -> int:
    """`python -m testbed.local_model COMMAND...`: COMMAND with OPENAI_BASE_URL, OPENAI_MODEL and OPENAI_API_KEY
    pointing at the local model, served for as long as it runs (what `make demo MODEL=local` does)."""
    import os
    import sys
    import tempfile

    if not argv:
        print("usage: python -m testbed.local_model COMMAND...", file=sys.stderr)
        return 2

    async def run() -> int:
        print("the local model: building llama-server once (minutes; cached after) and loading SmolLM2-135M")
        with tempfile.TemporaryDirectory(prefix="ksquad-local-model.") as root:
            async with serving_local_model(Path(root), api_key="ksquad-local") as model:
                env = {**os.environ, "OPENAI_BASE_URL": model.url, "OPENAI_MODEL": model.name}
                env["OPENAI_API_KEY"] = "ksquad-local"
                done = await asyncio.create_subprocess_exec(*argv, env=env)
                return await done.wait()

    return asyncio.run(run())


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
