"""A throwaway PostgreSQL server: Debian's binaries, a temporary data directory, a free port on the test bed's
service address (the cluster's pods reach it there).

PostgreSQL refuses to run as root, so when the tests run as root the server runs as the `postgres` user
that Debian's package creates.
"""

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from testbed.isolate import free_port, service_address


class PostgresUnavailable(RuntimeError):
    pass


def find_bindir() -> Path:
    """The newest Debian PostgreSQL server's bin directory."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(p.split("/")[4]))
    if not candidates:
        raise PostgresUnavailable(
            "no PostgreSQL server under /usr/lib/postgresql/*/bin: `make test` installs Debian's "
            "`postgresql` package; run `make postgres-server` or `apt-get install postgresql`"
        )
    return Path(candidates[-1]).parent


@dataclass
class PostgresServer:
    database: str = "ksquad"
    user: str = "ksquad"
    host: str = field(default_factory=service_address)
    port: int = 0
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="ksquad-pg-")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """SQLAlchemy URL for psycopg 3."""
        return self.url_of(self.database)

    def url_of(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{database}"

    def _server_args(self) -> list[str]:
        return [
            "-D",
            str(self.root / "data"),
            "-h",
            self.host,
            "-p",
            str(self.port),
            "-k",
            str(self.root),
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=300",
        ]

    def _as_server_user(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        try:
            pwd.getpwnam("postgres")
        except KeyError as err:
            raise PostgresUnavailable(
                "running as root, and there is no `postgres` user to run the server"
            ) from err
        return ["runuser", "-u", "postgres", "--"]

    def start(self) -> None:
        bindir = find_bindir()
        prefix = self._as_server_user()
        data = self.root / "data"
        if prefix:
            shutil.chown(self.root, "postgres", "postgres")
        subprocess.run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(data),
                "-U",
                self.user,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            check=True,
            capture_output=True,
        )
        # Trust on the node's network too: the cluster's pods (the chart's worker) connect from there.
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host all all samenet trust\n")
        self.port = self.port or free_port(self.host)
        self.resume()
        self.create_database(self.database)

    def _wait_ready(self, bindir: Path, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise PostgresUnavailable(
                    f"postgres exited with {self.process.returncode}: {self.log_tail()}"
                )
            ready = subprocess.run(
                [str(bindir / "pg_isready"), "-h", self.host, "-p", str(self.port), "-U", self.user],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise PostgresUnavailable(
            f"postgres not ready on {self.host}:{self.port} after {timeout}s: {self.log_tail()}"
        )

    def create_database(self, name: str) -> str:
        """A fresh database on this server; returns its SQLAlchemy URL."""
        subprocess.run(
            [str(find_bindir() / "createdb"), "-h", self.host, "-p", str(self.port), "-U", self.user, name],
            check=True,
            capture_output=True,
        )
        return self.url_of(name)

    def halt(self) -> None:
        """Stop the server, keeping its data (a database outage); `resume` starts it again on the same port."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            self.process.wait(30)

    def resume(self) -> None:
        bindir = find_bindir()
        log = (self.root / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [*self._as_server_user(), str(bindir / "postgres"), *self._server_args()],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready(bindir)

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "postgres.log").read_text()[-2000:]
        return ""

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then remove everything."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
