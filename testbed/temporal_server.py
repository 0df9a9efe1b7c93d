"""Temporal as users run it: the production server (frontend, history, matching and worker services of
`temporal-server`, built from the Go module proxy by testbed/build-temporal.sh and cached), on the test bed's
PostgreSQL for both persistence and visibility, its schemas set up by Temporal's own SQL tool, the namespace
made and ksquad's search attributes registered with the temporal CLI exactly as docs/operating.md says."""

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from temporalio.client import Client
from temporalio.service import TLSConfig

from dev.binaries import dying_with_parent, find_binary
from dev.devserver import CLI_TYPES
from testbed.isolate import free_port
from testbed.pki import KeyPair, Pki
from testbed.postgres import PostgresServer
from workflows import search_attributes

log = logging.getLogger(__name__)
BUILD_SCRIPT = Path(__file__).with_name("build-temporal.sh")
SCHEMAS = {"temporal": "temporal", "visibility": "visibility"}  # database kind -> schema folder


class TemporalServerError(RuntimeError):
    pass


def low_free_port(host: str) -> int:
    """A free port below 32768: Temporal keeps its services' ports in a smallint column of the cluster
    membership table, so the kernel's ephemeral ports (32768 and up) fail its first heartbeat."""
    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise TemporalServerError("no free port below 32768")


def temporal_binaries() -> Path:
    """The cached server, SQL tool and schemas, building what is missing (minutes the first time)."""
    done = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if done.returncode != 0:
        raise TemporalServerError(
            f"building Temporal's server failed ({BUILD_SCRIPT.name}, exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass
class TemporalServer:
    postgres: PostgresServer
    root: Path
    namespace: str = "default"
    port: int = 0
    ip: str = "127.0.0.1"
    # Mutual TLS on the frontend: a serving certificate and client certificates from this CA, and no client
    # without one (as a cluster that authenticates its workers by certificate runs it).
    pki: Pki | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    admin: KeyPair | None = field(default=None, repr=False)  # the client certificate the test bed itself uses

    def tls_config(self) -> TLSConfig | None:
        if self.pki is None or self.admin is None:
            return None
        return TLSConfig(
            server_root_ca_cert=self.pki.ca.read_bytes(),
            client_cert=self.admin.cert.read_bytes(),
            client_private_key=self.admin.key.read_bytes(),
        )

    @property
    def target(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.root / "temporal-server.log"

    def _sql_tool(self, bins: Path, database: str, *args: str) -> None:
        cmd = [
            str(bins / "temporal-sql-tool"),
            "--plugin",
            "postgres12",
            "--ep",
            self.postgres.host,
            "-p",
            str(self.postgres.port),
            "-u",
            self.postgres.user,
            "--db",
            database,
            *args,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise TemporalServerError(
                f"temporal-sql-tool {' '.join(args)}: {done.stdout}{done.stderr}"[-3000:]
            )

    def _schemas(self, bins: Path) -> dict[str, str]:
        """One database per store, each brought to the newest schema version by Temporal's SQL tool."""
        suffix = uuid.uuid4().hex[:8]
        databases = {"temporal": f"temporal_{suffix}", "visibility": f"temporal_visibility_{suffix}"}
        for kind, database in databases.items():
            self._sql_tool(bins, database, "create-database")
            self._sql_tool(bins, database, "setup-schema", "-v", "0.0")
            versioned = bins / "schema" / "postgresql" / "v12" / SCHEMAS[kind] / "versioned"
            self._sql_tool(bins, database, "update-schema", "-d", str(versioned))
        return databases

    def _config(self, databases: dict[str, str]) -> Path:
        ports = {name: low_free_port(self.ip) for name in ("frontend", "history", "matching", "worker")}
        members = {name: low_free_port(self.ip) for name in ports}
        self.port = ports["frontend"]

        def store(database: str, conns: int) -> dict[str, object]:
            return {
                "sql": {
                    "pluginName": "postgres12",
                    "databaseName": database,
                    "connectAddr": f"{self.postgres.host}:{self.postgres.port}",
                    "connectProtocol": "tcp",
                    "user": self.postgres.user,
                    "password": "",
                    "maxConns": conns,
                    "maxIdleConns": conns,
                    "maxConnLifetime": "1h",
                }
            }

        config = {
            "log": {"stdout": True, "level": "warn"},
            "persistence": {
                "defaultStore": "default",
                "visibilityStore": "visibility",
                "numHistoryShards": 4,
                "datastores": {
                    "default": store(databases["temporal"], 20),
                    "visibility": store(databases["visibility"], 10),
                },
            },
            "global": {
                **self._tls(),
                "membership": {"maxJoinDuration": "30s", "broadcastAddress": self.ip},
                "metrics": {
                    "prometheus": {
                        "framework": "tally",
                        "timerType": "histogram",
                        "listenAddress": f"{self.ip}:{free_port(self.ip)}",
                    }
                },
            },
            "services": {
                name: {"rpc": {"grpcPort": port, "membershipPort": members[name], "bindOnIP": self.ip}}
                for name, port in ports.items()
            },
            "clusterMetadata": {
                "enableGlobalNamespace": False,
                "failoverVersionIncrement": 10,
                "masterClusterName": "active",
                "currentClusterName": "active",
                "clusterInformation": {
                    "active": {
                        "enabled": True,
                        "initialFailoverVersion": 1,
                        "rpcName": "frontend",
                        "rpcAddress": self.target,
                    }
                },
            },
            "dcRedirectionPolicy": {"policy": "noop"},
            "dynamicConfigClient": {
                "filepath": str(self.root / "config" / "dynamic.yaml"),
                "pollInterval": "10s",
            },
        }
        folder = self.root / "config"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "production.yaml").write_text(yaml.safe_dump(config))
        (folder / "dynamic.yaml").write_text(
            yaml.safe_dump(
                {
                    # as a production cluster is tuned to: ksquad's search attributes are Keyword/Int/Datetime
                    "system.forceSearchAttributesCacheRefreshOnRead": [{"value": True}],
                    "frontend.enableUpdateWorkflowExecution": [{"value": True}],
                    # task queues dispatch round the fairness keys ksquad sets (a run's namespace)
                    "matching.enableFairness": [{"value": True}],
                }
            )
        )
        return folder

    def _tls(self) -> dict[str, object]:
        if self.pki is None:
            return {}
        frontend = self.pki.issue("temporal-frontend", "temporal-frontend", server=True, addresses=(self.ip,))
        system = self.pki.issue("temporal-system-worker", "temporal-system-worker")
        self.admin = self.pki.issue("temporal-admin", "temporal-admin")
        ca = [str(self.pki.ca)]
        client = {"rootCaFiles": ca, "serverName": "localhost"}
        return {
            "tls": {
                "frontend": {
                    "server": {
                        "certFile": str(frontend.cert),
                        "keyFile": str(frontend.key),
                        "requireClientAuth": True,
                        "clientCaFiles": ca,
                    },
                    "client": client,
                },
                "systemWorker": {"certFile": str(system.cert), "keyFile": str(system.key), "client": client},
            }
        }

    def _cli(self, *args: str) -> None:
        tls = (
            [
                "--tls-cert-path",
                str(self.admin.cert),
                "--tls-key-path",
                str(self.admin.key),
                "--tls-ca-path",
                str(self.pki.ca),
            ]
            if self.pki is not None and self.admin is not None
            else []
        )
        done = subprocess.run(
            [str(find_binary("temporal")), *args, "--address", self.target, *tls],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise TemporalServerError(f"temporal {' '.join(args)}: {done.stdout}{done.stderr}"[-2000:])

    async def start(self) -> None:
        bins = await asyncio.to_thread(temporal_binaries)
        self.root.mkdir(parents=True, exist_ok=True)
        databases = await asyncio.to_thread(self._schemas, bins)
        folder = self._config(databases)
        with self.log_file.open("ab") as out:
            self.process = subprocess.Popen(
                dying_with_parent(
                    [
                        str(bins / "temporal-server"),
                        "--root",
                        str(self.root),
                        "--config",
                        str(folder.relative_to(self.root)),
                        "--env",
                        "production",
                        "start",
                        "--services",
                        "frontend,history,matching,worker",
                    ]
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )
        await self._wait_ready()
        # As docs/operating.md tells an operator of a self-hosted cluster: the namespace, then the attributes.
        await asyncio.to_thread(self._cli, "operator", "namespace", "create", "--namespace", self.namespace)
        flags: list[str] = []
        for key in search_attributes.ALL:
            kind = key.indexed_value_type.name.removeprefix("INDEXED_VALUE_TYPE_")
            flags += ["--name", key.name, "--type", CLI_TYPES[kind]]
        await asyncio.to_thread(
            self._cli, "operator", "search-attribute", "create", "--namespace", self.namespace, *flags
        )

    async def _wait_ready(self, timeout: float = 120) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise TemporalServerError(f"temporal-server exited: {self.log_tail()}")
            try:
                client = await Client.connect(
                    self.target, namespace="temporal-system", tls=self.tls_config() or False
                )
                if await client.service_client.check_health():
                    return
            except Exception:  # not up yet: refused, or the services still joining
                pass
            await asyncio.sleep(0.5)
        raise TemporalServerError(f"temporal-server not ready in {timeout}s: {self.log_tail()}")

    def log_tail(self) -> str:
        return self.log_file.read_text(errors="replace")[-3000:] if self.log_file.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.asynccontextmanager
async def temporal_server(
    postgres: PostgresServer, root: Path, pki: Pki | None = None
) -> AsyncIterator[TemporalServer]:
    server = TemporalServer(postgres, root, pki=pki)
    try:
        await server.start()
        yield server
    finally:
        server.stop()
