"""`ksquad-worker` against a Temporal frontend that requires client certificates (mutual TLS), as the chart's
`temporal.mtls` mounts them: without a certificate nothing connects; with one the worker is ready; when the
mounted certificate is rotated in place, the worker stops by itself (the SDK cannot swap a live connection's
certificate) and, started again as its Deployment would, connects with the new one. A worker without the seal key
refuses to start, saying why."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from dev.binaries import dying_with_parent
from temporal_client.codec import ensure_key_file
from temporal_client.connection import TemporalSettings
from testbed.isolate import free_port
from testbed.pki import Pki
from testbed.postgres import PostgresServer
from testbed.temporal_server import temporal_server
from tests.worker.test_worker_readiness import until

WORKER = str(Path(sys.executable).with_name("ksquad-worker"))


async def test_the_worker_connects_by_certificate_and_restarts_when_it_is_rotated(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    pki = Pki(tmp_path / "pki")
    async with temporal_server(postgres, tmp_path / "temporal", pki) as server:
        refused = TemporalSettings(address=server.target, tls_ca_file=pki.ca, tls_server_name="localhost")
        with pytest.raises(
            RuntimeError
        ):  # TLS, but no client certificate: the frontend refuses the handshake
            await refused.connect()
        # An API key with the certificate, from the environment as the chart sets it: over TLS, the key carried.
        keyed_pair = pki.issue("keyed", "ksquad-worker")
        keyed = await TemporalSettings.from_env(
            {
                "KSQUAD_TEMPORAL_ADDRESS": server.target,
                "KSQUAD_TEMPORAL_API_KEY": "cloud-key",
                "KSQUAD_TEMPORAL_TLS_CERT_FILE": str(keyed_pair.cert),
                "KSQUAD_TEMPORAL_TLS_KEY_FILE": str(keyed_pair.key),
                "KSQUAD_TEMPORAL_TLS_CA_FILE": str(pki.ca),
                "KSQUAD_TEMPORAL_TLS_SERVER_NAME": "localhost",
            }
        ).connect()
        assert keyed.api_key == "cloud-key"
        assert (await keyed.workflow_service.get_system_info(GetSystemInfoRequest())).server_version

        mounted = tmp_path / "temporal-tls"  # as the chart mounts the kubernetes.io/tls Secret
        mounted.mkdir()
        first = pki.issue("worker-1", "ksquad-worker")
        (mounted / "tls.crt").write_bytes(first.cert.read_bytes())
        (mounted / "tls.key").write_bytes(first.key.read_bytes())
        ensure_key_file(tmp_path / "seal.key")
        port = free_port("127.0.0.1")
        env = {
            **os.environ,
            "KSQUAD_TEMPORAL_ADDRESS": server.target,
            "KSQUAD_TEMPORAL_TLS_CERT_FILE": str(mounted / "tls.crt"),
            "KSQUAD_TEMPORAL_TLS_KEY_FILE": str(mounted / "tls.key"),
            "KSQUAD_TEMPORAL_TLS_CA_FILE": str(pki.ca),
            "KSQUAD_TEMPORAL_TLS_SERVER_NAME": "localhost",
            "KSQUAD_DATABASE_URL": f"sqlite:///{tmp_path / 'worker.db'}",
            "KSQUAD_HEALTH_PORT": str(port),
            "KSQUAD_SANDBOX_BACKEND": "local",
            "KSQUAD_SEAL_KEY_FILE": str(tmp_path / "seal.key"),
        }
        log = tmp_path / "worker.log"

        def start() -> subprocess.Popen[bytes]:
            with log.open("ab") as out:
                return subprocess.Popen(
                    dying_with_parent([WORKER]), env=env, stdout=out, stderr=subprocess.STDOUT
                )

        worker = start()
        try:
            assert (await until(port, 200, within=60))["temporal"] is True, log.read_text()[-2000:]
            second = pki.issue("worker-2", "ksquad-worker")  # the Secret rotated: the kubelet swaps the files
            (mounted / "tls.key").write_bytes(second.key.read_bytes())
            (mounted / "tls.crt").write_bytes(second.cert.read_bytes())
            for _ in range(60):
                if worker.poll() is not None:
                    break
                await asyncio.sleep(0.5)
            assert worker.poll() == 0, "the worker stopped cleanly once its certificate changed"
            assert "the Temporal client certificate changed" in log.read_text()
            worker = start()  # its Deployment starts it again
            assert (await until(port, 200, within=60))["temporal"] is True, log.read_text()[-2000:]
        finally:
            worker.terminate()
            worker.wait(30)

    del env["KSQUAD_SEAL_KEY_FILE"]
    done = subprocess.run([WORKER], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "KSQUAD_SEAL_KEY_FILE is not set" in done.stderr, done.stderr
