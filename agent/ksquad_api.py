"""The agent's calls to ksquad's API (its work item, its checkpoints): one request with the attempt's token, over
TLS trusting the contract's CA alone when it gives one."""

import asyncio
import ssl
from functools import lru_cache
from typing import Any

import httpx2

import tracing

TIMEOUT_SECONDS = 30.0


class ApiRefused(Exception):
    """The API answered with an error status; `status` and its reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"the API answered {status}: {reason}")
        self.status = status
        self.reason = reason


class ApiUnreachable(Exception):
    """The API did not answer (or its CA in the contract is no certificate)."""


@lru_cache(maxsize=4)
def trusting(ca: str) -> ssl.SSLContext:
    """A TLS context that trusts this CA alone: the attempt's token goes to the API whose certificate it signed,
    and to no one a public CA vouches for."""
    return ssl.create_default_context(cadata=ca)


@lru_cache(maxsize=1)
def default_trust() -> ssl.SSLContext:
    return ssl.create_default_context()


# One client per event loop and CA, its connections kept: the agent asks before every model call, and a client
# made per request spent ~30 ms building its TLS context and connecting (bench.checkpoints).
_clients: dict[tuple[int, str | None], httpx2.AsyncClient] = {}


def _client(ca: str | None) -> httpx2.AsyncClient:
    key = (id(asyncio.get_running_loop()), ca)
    client = _clients.get(key)
    if client is None or client.is_closed:
        verify = trusting(ca) if ca else default_trust()
        client = _clients[key] = httpx2.AsyncClient(timeout=TIMEOUT_SECONDS, verify=verify)
    return client


async def call(base_url: str, token: str, ca: str | None, method: str, path: str, json: Any = None) -> Any:
    """`method` `base_url` + `path` with the token; the answer's JSON. ApiRefused for a status of 300 or more,
    ApiUnreachable when nobody answers."""
    try:
        http = _client(ca)
    except ssl.SSLError as err:
        raise ApiUnreachable(f"the contract's CA for {base_url} is no PEM certificate: {err}") from None
    headers = {"Authorization": f"Bearer {token}"}
    tracing.inject(headers)  # ksquad-api's span of the request joins the attempt's trace
    try:
        response = await http.request(method, f"{base_url.rstrip('/')}{path}", json=json, headers=headers)
    except httpx2.TransportError as err:
        raise ApiUnreachable(f"the API at {base_url} does not answer: {err!r}") from None
    if response.status_code >= 300:
        try:
            reason = response.json().get("error")
        except ValueError:
            reason = None
        raise ApiRefused(response.status_code, reason or response.text[:200])
    return response.json()
