"""`ksquad dev` as the user runs it: its own process in its own directory, driven through the `ksquad` CLI
(each command a real process too). Every port is a free one, so a developer's own `ksquad dev` is left alone."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dev.binaries import dying_with_parent

KSQUAD = str(Path(sys.executable).with_name("ksquad"))
FREE_PORTS = ["--temporal-port", "0", "--ui-port", "0", "--api-port", "0", "--model-port", "0"]


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


async def ksquad(cwd: Path, *args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
    proc = await asyncio.create_subprocess_exec(
        *dying_with_parent([KSQUAD, *args]),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        raise AssertionError(
            f"ksquad {' '.join(args)} did not finish in {timeout}s: {out.decode()} {err.decode()}"
        ) from None
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


@dataclass
class DevProcess:
    root: Path
    env: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = None
    info: dict[str, Any] = field(default_factory=dict)
    starts: int = 0
    # The API's port across restarts (0: a free one each start): a client that keeps the URL, as `ksquad runs
    # watch` does, finds the restarted stack where it was, as it does on the default ports.
    api_port: int = 0

    @property
    def state(self) -> Path:
        return self.root / ".ksquad"

    @property
    def log(self) -> Path:
        return self.root / "dev.log"

    @property
    def api_headers(self) -> dict[str, str]:
        """What the CLI sends: the bearer token of `.ksquad/api.token`."""
        return {"Authorization": f"Bearer {(self.state / 'api.token').read_text().strip()}"}

    async def start(self, within: float = 60) -> None:
        (self.state / "dev.json").unlink(missing_ok=True)
        self.starts += 1
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            self.process = await asyncio.create_subprocess_exec(
                *dying_with_parent([KSQUAD, "dev", *FREE_PORTS, "--api-port", str(self.api_port)]),
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        deadline = time.monotonic() + within
        while not (self.state / "dev.json").is_file():
            if self.process.returncode is not None:
                raise AssertionError(
                    f"ksquad dev exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"ksquad dev not up within {within}s:\n{self.log.read_text()[-3000:]}")
            await asyncio.sleep(0.1)
        self.info = json.loads((self.state / "dev.json").read_text())

    def kill(self) -> None:
        """SIGKILL: no clean shutdown of anything it runs in-process."""
        assert self.process is not None
        self.process.kill()

    async def stop(self) -> int:
        """Ctrl-C, as a user stops it."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        return self.process.returncode or 0

    async def cli(self, *args: str, timeout: float = 120) -> Result:
        return await ksquad(self.root, *args, timeout=timeout)

    async def run_json(self, name: str, namespace: str = "default") -> dict[str, Any]:
        got = await self.cli("runs", "get", f"{namespace}/{name}", "-o", "json")
        assert got.code == 0, got.err
        run: dict[str, Any] = got.json()
        return run

    async def wait_phase(
        self, name: str, phases: set[str], namespace: str = "default", within: float = 90
    ) -> dict[str, Any]:
        deadline = time.monotonic() + within
        while True:
            run = await self.run_json(name, namespace)
            if (run.get("status") or {}).get("phase") in phases:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{namespace}/{name} not in {phases} within {within}s: {run.get('status')}\n"
                    f"{self.log.read_text()[-3000:]}"
                )
            await asyncio.sleep(0.3)

    def leftover_agents(self) -> list[int]:
        """Local agents whose pid files remain (a sandbox never released)."""
        pids = []
        for pid_file in (self.state / "sandboxes").glob("*.pid"):
            pid = int(pid_file.read_text())
            if Path(f"/proc/{pid}").exists():
                pids.append(pid)
        return pids

    def kill_leftover_agents(self) -> None:
        for pid in self.leftover_agents():
            os.kill(pid, signal.SIGKILL)
