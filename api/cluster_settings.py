"""ksquad-api's settings, from the environment the chart sets (each variable is listed in api/cluster.py, which
`ksquad-api --help` prints): the store, the codec token, the ports and TLS files, the keys, the namespaces served,
and the bounds on what callers share (`budgets_from_env`, the chart's api.budgets), with their defaults."""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.callers import ITEM_KEY_ENV, read_key
from api.budgets import Limits, RateLimits, RequestLimits
from api.streams import STREAM_LIMITS

# Console requests a person has in flight at once (each is one or a few API server calls made as them).
CONSOLE_LIMITS = Limits(per_person=8, per_namespace=64, total=128)
# Tokens the API server refused, reviewed: a flood of made-up tokens from one client stops at its bucket, from
# many at the total, so it never becomes a flood of TokenReviews.
REFUSED_TOKENS = RateLimits(per_client=2, burst=20, total=20)
# Requests a second, once the caller is known (a person, or an attempt by its item token): a console left open in
# many tabs, a script that polls in a loop, are answered 429 past their share, before they cost a store query or an
# API server call, so what one tenant sends cannot slow another's. A console tab polls every 2 s.
REQUEST_RATE = RequestLimits(per_person=20, per_namespace=100, total=400)


@dataclass
class ApiSettings:
    database_url: str
    codec_token_file: Path | None = None
    ui_origins: frozenset[str] = frozenset()
    port: int = 8080
    health_port: int = 8081
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    items_port: int = 8443
    # With its key: the listener for sandboxes (/items/, /attempts/, /memory/; HTTPS).
    items_tls_cert_file: str | None = None
    items_tls_key_file: str | None = None
    kubeconfig: str | None = None
    item_token_key: bytes | None = (
        None  # the worker's: attempts' tokens for their work item (None: none accepted)
    )
    console_key: bytes | None = None
    namespaces: list[str] = field(default_factory=list)
    temporal_ui_url: str | None = None
    temporal_namespace: str = "default"
    stream_limits: Limits = STREAM_LIMITS
    console_limits: Limits = CONSOLE_LIMITS
    refused_tokens: RateLimits = REFUSED_TOKENS
    requests: RequestLimits = REQUEST_RATE

    @classmethod
    def from_env(cls) -> "ApiSettings":
        env = os.environ
        if not env.get("KSQUAD_DATABASE_URL"):
            raise SystemExit("ksquad-api: set KSQUAD_DATABASE_URL to the worker's store (postgresql://...)")
        token = env.get("KSQUAD_CODEC_TOKEN_FILE")
        return cls(
            database_url=env["KSQUAD_DATABASE_URL"],
            codec_token_file=Path(token) if token else None,
            ui_origins=frozenset(
                o.strip() for o in env.get("KSQUAD_API_UI_ORIGINS", "").split(",") if o.strip()
            ),
            port=int(env.get("KSQUAD_API_LISTEN_PORT", "8080")),
            health_port=int(env.get("KSQUAD_HEALTH_PORT", "8081")),
            tls_cert_file=env.get("KSQUAD_API_TLS_CERT_FILE") or None,
            tls_key_file=env.get("KSQUAD_API_TLS_KEY_FILE") or None,
            items_port=int(env.get("KSQUAD_API_ITEMS_PORT", "8443")),
            items_tls_cert_file=env.get("KSQUAD_API_ITEMS_TLS_CERT_FILE") or None,
            items_tls_key_file=env.get("KSQUAD_API_ITEMS_TLS_KEY_FILE") or None,
            kubeconfig=env.get("KUBECONFIG") or None,
            item_token_key=read_key(env[ITEM_KEY_ENV]) if env.get(ITEM_KEY_ENV) else None,
            console_key=read_key(env["KSQUAD_CONSOLE_KEY_FILE"])
            if env.get("KSQUAD_CONSOLE_KEY_FILE")
            else None,
            namespaces=[n.strip() for n in env.get("KSQUAD_NAMESPACES", "").split(",") if n.strip()],
            temporal_ui_url=env.get("KSQUAD_TEMPORAL_UI_URL") or None,
            temporal_namespace=env.get("KSQUAD_TEMPORAL_NAMESPACE") or "default",
            **budgets_from_env(env),
        )


def budgets_from_env(env: Any) -> dict[str, Any]:
    """The chart's api.budgets, from KSQUAD_API_STREAMS, KSQUAD_API_CONSOLE_REQUESTS, KSQUAD_API_REFUSED_TOKENS,
    KSQUAD_API_REQUESTS."""
    found: dict[str, Any] = {}
    for setting, field_name, kind in (
        ("KSQUAD_API_STREAMS", "stream_limits", Limits),
        ("KSQUAD_API_CONSOLE_REQUESTS", "console_limits", Limits),
        ("KSQUAD_API_REFUSED_TOKENS", "refused_tokens", RateLimits),
        ("KSQUAD_API_REQUESTS", "requests", RequestLimits),
    ):
        if env.get(setting):
            try:
                found[field_name] = kind.parse(env[setting], setting)
            except ValueError as err:
                raise SystemExit(f"ksquad-api: {err}") from None
    return found
