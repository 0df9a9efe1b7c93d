"""How every ksquad process connects to Temporal: where (the settings the chart gives the worker and the
bridge), the pydantic data converter (the workflows' wire format), credentials (TLS, API key), and ksquad's
search attributes registered."""

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client, Interceptor
from temporalio.common import RawValue
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

import tracing
from temporal_client.codec import IN_CLEAR, UNREADABLE, EncryptionCodec, KeyRing
from temporal_client.proofs import SignalProver, Signing
from temporal_client.seal import Sealer
from workflows import search_attributes as sa

log = logging.getLogger(__name__)
CODEC_KEY_FILE_ENV = "KSQUAD_CODEC_KEY_FILE"  # the active key: it encrypts
CODEC_KEYS_ENV = "KSQUAD_CODEC_KEYS"  # a directory of keys that decrypt too (the mounted Secret)
CODEC_ACCEPT_PLAINTEXT_ENV = "KSQUAD_CODEC_ACCEPT_PLAINTEXT"  # "true": payloads in clear are read (migration)


class RefusedInClear(ValueError):
    """A payload that came in clear was to become an argument or a result of ksquad's code."""


class RefusedUnreadable(ValueError):
    """A payload the codec could not decrypt was to be read (temporal_client.codec.UNREADABLE)."""


class KsquadPayloadConverter(PydanticPayloadConverter):
    """Pydantic models as JSON; with a codec, no typed argument or result from a payload that came in clear (the
    codec marks it, temporal_client.codec): a RunInput or a signal's answer written by someone without the key is
    refused (a workflow started so never runs; a signal so is dropped, the SDK logs why). Untyped payloads, which
    ksquad's code never acts on (the server's "ACTIVITY_ID_NOT_STARTED" in a cancellation), are read as they are."""

    def from_payloads(self, payloads: Sequence[Payload], type_hints: list[type] | None = None) -> list[Any]:
        hints: list[Any] = list(type_hints) if type_hints else [None] * len(payloads)
        for payload, hint in zip(payloads, hints, strict=False):
            if hint is RawValue:  # kept raw, to be read later (a workflow's inbox reads its signals so)
                continue
            if UNREADABLE in payload.metadata:
                why = payload.metadata[UNREADABLE].decode(errors="replace")
                raise RefusedUnreadable(f"refused a payload the codec cannot decrypt: {why}")
            if IN_CLEAR in payload.metadata and hint is not None and hint is not Any:
                name = getattr(hint, "__name__", str(hint))
                raise RefusedInClear(
                    f"refused a {name} in clear: ksquad acts only on payloads encrypted with a key of its codec ring "
                    "(send it through the codec endpoint, e.g. temporal --codec-endpoint; "
                    f"{CODEC_ACCEPT_PLAINTEXT_ENV}=true reads histories written before the codec)"
                )
        return super().from_payloads(payloads, type_hints)


def data_converter(codec: PayloadCodec | None = None) -> DataConverter:
    """ksquad's wire format: pydantic models as JSON, encrypted by `codec` when there is one, failures' messages
    and stack traces with them (a provider's error text or a model's question would be in clear otherwise)."""
    if codec is None:
        return pydantic_data_converter
    return dataclasses.replace(
        pydantic_data_converter,
        payload_converter_class=KsquadPayloadConverter,
        payload_codec=codec,
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )


def codec_from_env() -> EncryptionCodec | None:
    """The codec of the key ring the environment names (`KSQUAD_CODEC_KEY_FILE` encrypts; it and the keys in
    the directory `KSQUAD_CODEC_KEYS` decrypt), or None (payloads in clear)."""
    path = os.environ.get(CODEC_KEY_FILE_ENV)
    if not path:
        return None
    directory = os.environ.get(CODEC_KEYS_ENV)
    accept_plaintext = os.environ.get(CODEC_ACCEPT_PLAINTEXT_ENV, "").lower() in ("1", "true", "yes")
    return EncryptionCodec(
        KeyRing.from_files(Path(path), Path(directory) if directory else None), accept_plaintext
    )


async def connect(
    target: str,
    namespace: str = "default",
    *,
    api_key: str | None = None,
    tls: bool = False,
    server_root_ca: bytes | None = None,
    client_cert: tuple[bytes, bytes] | None = None,
    server_name: str | None = None,
    codec: PayloadCodec | None = None,
    runtime: Runtime | None = None,
) -> Client:
    """A client with ksquad's data converter (and payload codec); `api_key` (Temporal Cloud) implies TLS, and so
    does `client_cert` (certificate and key, PEM: mutual TLS). `runtime` carries the SDK's metrics exporter
    (temporal_client.telemetry)."""
    tls_config: TLSConfig | bool = tls or api_key is not None
    if server_root_ca is not None or client_cert is not None or server_name is not None:
        tls_config = TLSConfig(
            server_root_ca_cert=server_root_ca,
            client_cert=client_cert[0] if client_cert else None,
            client_private_key=client_cert[1] if client_cert else None,
            domain=server_name,
        )
    return await Client.connect(
        target,
        namespace=namespace,
        data_converter=data_converter(codec),
        api_key=api_key,
        tls=tls_config,
        runtime=runtime,
        interceptors=temporal_tracing(),
    )


def temporal_tracing() -> list[Interceptor]:
    """Temporal's spans (starts, signals; a worker's workflows and activities: the client's interceptors that are
    also worker interceptors are the worker's) when this process traces (tracing.configure)."""
    if not tracing.enabled():
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor(tracing.tracer())]


@dataclass(frozen=True)
class TemporalSettings:
    """Where the worker and the bridge find Temporal, from KSQUAD_TEMPORAL_* (the chart sets them)."""

    address: str = "127.0.0.1:7233"  # the frontend, host:port
    namespace: str = "default"
    api_key: str | None = None  # Temporal Cloud's; implies TLS
    tls: bool = False
    # Mutual TLS: the client certificate and key (PEM files: a mounted kubernetes.io/tls Secret, which
    # cert-manager or an operator rotates in place), the CA the server's certificate is checked against, and the
    # name it must carry. A certificate implies TLS.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_server_name: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> "TemporalSettings":
        def path(name: str) -> Path | None:
            value = env.get(name)
            return Path(value) if value else None

        return cls(
            address=env.get("KSQUAD_TEMPORAL_ADDRESS", cls.address),
            namespace=env.get("KSQUAD_TEMPORAL_NAMESPACE", cls.namespace),
            api_key=env.get("KSQUAD_TEMPORAL_API_KEY") or None,
            tls=env.get("KSQUAD_TEMPORAL_TLS", "").lower() in ("1", "true", "yes"),
            tls_cert_file=path("KSQUAD_TEMPORAL_TLS_CERT_FILE"),
            tls_key_file=path("KSQUAD_TEMPORAL_TLS_KEY_FILE"),
            tls_ca_file=path("KSQUAD_TEMPORAL_TLS_CA_FILE"),
            tls_server_name=env.get("KSQUAD_TEMPORAL_TLS_SERVER_NAME") or None,
        )

    def tls_files(self) -> list[Path]:
        return [f for f in (self.tls_cert_file, self.tls_key_file, self.tls_ca_file) if f is not None]

    async def connect(self, codec: PayloadCodec | None = None, runtime: Runtime | None = None) -> Client:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise SystemExit(
                "KSQUAD_TEMPORAL_TLS_CERT_FILE and KSQUAD_TEMPORAL_TLS_KEY_FILE go together (mutual TLS needs both)"
            )
        client_cert = None
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            client_cert = (self.tls_cert_file.read_bytes(), self.tls_key_file.read_bytes())
        return await connect(
            self.address,
            self.namespace,
            api_key=self.api_key,
            tls=self.tls,
            server_root_ca=self.tls_ca_file.read_bytes() if self.tls_ca_file else None,
            client_cert=client_cert,
            server_name=self.tls_server_name,
            codec=codec,
            runtime=runtime,
        )


def files_fingerprint(files: list[Path]) -> str:
    """What the files hold now (a missing one counts as empty): it changes when a mounted Secret is rotated."""
    digest = hashlib.sha256()
    for file in files:
        with contextlib.suppress(OSError):
            digest.update(file.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


async def stop_when_changed(
    files: list[Path], stop: asyncio.Event, program: str, every: float = 10.0
) -> None:
    """Set `stop` when any of `files` changes: the SDK cannot swap a connection's client certificate, so a
    process whose certificate was rotated stops cleanly and its Deployment starts it again with the new one."""
    if not files:
        return
    seen = files_fingerprint(files)
    while not stop.is_set():
        await asyncio.sleep(every)
        if files_fingerprint(files) != seen:
            log.warning("%s: the Temporal client certificate changed; stopping to reconnect with it", program)
            stop.set()
            return


def with_converter(client: Client, codec: PayloadCodec | None = None) -> Client:
    """The same connection, with ksquad's data converter (for clients made by test environments)."""
    config = client.config()
    config["data_converter"] = data_converter(codec)
    return Client(**config)


def with_signing(client: Client, sealer: Sealer, default: Signing | None = None) -> Client:
    """The same connection, signing the signals it sends (temporal_client.proofs): as `SIGNING` says at the time,
    else as `default` (None: the signals sent outside such a context carry no proof)."""
    config = client.config()
    prover = SignalProver(sealer.signals, client.data_converter.payload_converter, default)
    others = [i for i in config["interceptors"] if not isinstance(i, SignalProver)]
    config["interceptors"] = [*others, prover]
    return Client(**config)


async def register_search_attributes(client: Client) -> list[str]:
    """Register ksquad's custom search attributes that the namespace lacks; return the ones added."""
    try:
        existing = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
        known = set(existing.custom_attributes)
    except RPCError as err:
        if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server only adds
            raise
        known = set()
    missing = {
        k.name: IndexedValueType.ValueType(k.indexed_value_type) for k in sa.ALL if k.name not in known
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)


async def temporal_answers(client: Client) -> bool:
    """Temporal's frontend answers its health check (for readiness probes)."""
    try:
        return bool(await client.service_client.check_health(timeout=timedelta(seconds=5)))
    except RPCError:
        return False
