"""The local backend (the embedded default): the reference agent as a local process per attempt."""

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

import tracing
from activities.agents.callers import CallerKeys, process_keys
from activities.sandboxes.manifests import (
    SandboxSettings,
    job_name,
    sandbox_failed,
    small_outputs,
)
from agent.callers import TOKEN_SHA256_ENV
from workflows.activity_types import (
    OutputsRequest,
    PublishedOutputs,
    Sandbox,
    SandboxRelease,
    SandboxRequest,
)
from workflows.contract import CredentialRef, ExecutionContract

log = logging.getLogger(__name__)


def _agent_pid(pid_file: Path) -> int | None:
    """The pid in `pid_file` while it is a live local agent (not a pid recycled for something else)."""
    try:
        pid = int(pid_file.read_text())
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().split(") ")[-1].startswith("Z"):
                return None  # exited, not yet reaped
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return pid if b"agent.server" in cmdline.read() else None
    except (OSError, ValueError):
        return None


# What a local agent inherits from the process that starts it: how to run and reach TLS endpoints, where to send
# its spans, nothing else (no API key, cloud credential or token of the developer's environment).
LOCAL_AGENT_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    *tracing.EXPORT_ENV,
)


@dataclass(frozen=True)
class LocalModel:
    """The model the developer configured for the embedded default, and the key only it may receive."""

    url: str
    credential: CredentialRef
    api_key: str


class LocalSandboxes:
    """The embedded default: the reference agent as a local process on its own loopback address, with a minimal
    environment: the local model's key goes to an agent only when every model of its contract that names that
    key is the local model itself (a ModelEndpoint pointing elsewhere never receives it). Any local user can
    reach a loopback address, so the agent answers only the holder of the attempt's caller token: it is started
    with the token's hash in its environment (agent.callers), which only this user can read."""

    def __init__(
        self,
        settings: SandboxSettings,
        local_model: LocalModel | None = None,
        log_dir: Path | None = None,
        heartbeat: Callable[..., None] = lambda *_: None,
        keys: CallerKeys | None = None,
    ) -> None:
        self.settings = settings
        self.local_model = local_model
        self.log_dir = log_dir or Path(".ksquad/sandboxes")
        self.heartbeat = heartbeat
        self.keys = keys or process_keys()
        self.processes: dict[str, asyncio.subprocess.Process] = {}

    def environment(self, contract: ExecutionContract) -> dict[str, str]:
        env = {k: os.environ[k] for k in LOCAL_AGENT_ENV if k in os.environ}
        env["PYTHONUNBUFFERED"] = "1"
        env[TOKEN_SHA256_ENV] = self.keys.sandbox_token_sha256(contract.run)
        local = self.local_model
        if local is not None:
            models = [
                m for m in contract.models() if m.credential and m.credential.env == local.credential.env
            ]
            if models and all((m.url or "").rstrip("/") == local.url.rstrip("/") for m in models):
                env[local.credential.env] = local.api_key
            elif models:
                log.warning(
                    "%s: the local model's key is not given to a model at %s",
                    contract.run.name,
                    ", ".join(sorted({m.url or "-" for m in models})),
                )
        return env

    async def acquire(self, req: SandboxRequest) -> Sandbox:
        contract = req.contract
        name = job_name(contract.run.name, contract.run.attempt)
        host = "127.0.0.1"
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.log_dir / f"{contract.run.namespace}_{name}.log").open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agent.server",
                "--host",
                host,
                "--port",
                str(port),
                env=self.environment(contract),
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes[name] = process
        # The agent outlives this worker (as a Job outlives a worker pod): a restarted worker finds it by this
        # file to stop it at release, and the retried agent activity resubscribes to its task meanwhile.
        self._pid_file(name).write_text(str(process.pid))
        endpoint = f"http://{host}:{port}/"
        deadline = time.monotonic() + req.timeout_seconds
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                if process.returncode is not None:
                    raise sandbox_failed(f"local agent {name} exited with {process.returncode}")
                try:
                    if (await http.get(f"{endpoint}readyz", timeout=1)).status_code == 200:
                        return Sandbox(name=name, kind="local", endpoint=endpoint)
                except httpx.TransportError:
                    pass
                self.heartbeat(f"waiting for local agent {name}")
                await asyncio.sleep(0.05)
        process.kill()
        raise sandbox_failed(f"local agent {name} not ready within {req.timeout_seconds}s")

    def _pid_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.pid"

    async def release(self, rel: SandboxRelease) -> None:
        name = rel.sandbox.name
        process = self.processes.pop(name, None)
        pid_file = self._pid_file(name)
        if process is None:
            await self._release_orphan(pid_file)
            return
        pid_file.unlink(missing_ok=True)
        if process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.settings.termination_grace_seconds)
        except TimeoutError:
            process.kill()
            await process.wait()

    async def _release_orphan(self, pid_file: Path) -> None:
        """An agent started by an earlier worker process: SIGTERM, then SIGKILL after the grace period."""
        pid = _agent_pid(pid_file)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                for _ in range(int(self.settings.termination_grace_seconds * 10)):
                    if _agent_pid(pid_file) is None:
                        break
                    await asyncio.sleep(0.1)
                else:
                    os.kill(pid, signal.SIGKILL)
        pid_file.unlink(missing_ok=True)  # noqa: ASYNC240 (a small local file)

    async def publish_outputs(self, req: OutputsRequest) -> PublishedOutputs:
        return PublishedOutputs(outputs=small_outputs(req.outputs))
