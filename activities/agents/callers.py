"""The worker as an agent's caller (agent.callers has the agent's side and the token formats).

- Every A2A request of an attempt carries `Authorization: Bearer <token>`, made afresh for each request:
  - to a sandbox (cold, warm, local): `sandbox_token`, an HMAC of the attempt (namespace, run uid, attempt, fence)
    under the worker's sandbox key. acquire_sandbox gives the sandbox only its SHA-256 (a cold Job's pod
    template annotation, a warm pod's claim patch, a local agent's environment), and invoke_agent makes the same
    token from the same key, so the token is carried by nothing: no workflow history, no spec, no log.
  - to a shared endpoint (Agent.spec.endpoint): `endpoint_token`, claims of the attempt and its credentials,
    signed with the key the worker shares with that agent's deployment; none when no such key is configured (a
    third-party agent authenticates in its own way).
- The sandbox key comes from KSQUAD_SANDBOX_TOKEN_KEY_FILE (the chart's Secret; `ksquad dev`'s state directory).
  Every worker replica, and a restarted worker, must hold the same key, or it cannot reach the agents of attempts
  in flight (their next request is refused and the attempt is retried). Without it, a key of this process is made:
  fine for one process (tests), never for a deployment.
- The worker never follows an agent card off the endpoint it was given: a card whose JSON-RPC interface is on
  another scheme, host or port is refused (it would send the token, and the contract, wherever the card says).
"""

import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from a2a.client import ClientCallContext
from a2a.client.interceptors import AfterArgs, BeforeArgs, ClientCallInterceptor
from a2a.types import AgentCard

from agent.callers import (
    ENDPOINT_KEY_ENV,
    ENDPOINT_TOKEN_SECONDS,
    ITEM_KEY_ENV,
    ITEM_TOKEN_SECONDS,
    SANDBOX_KEY_ENV,
    Claims,
    ItemAccess,
    endpoint_token,
    item_token,
    read_key,
    sandbox_token,
    token_sha256,
)
from workflows.contract import CredentialRef, ExecutionContract, RunIdentity

log = logging.getLogger(__name__)
ITEM_API_ENV = "KSQUAD_ITEM_API_URL"  # where sandboxes reach the items API (with KSQUAD_ITEM_TOKEN_KEY_FILE)
ITEM_API_CA_ENV = "KSQUAD_ITEM_API_CA_FILE"  # the CA of its certificate (PEM), handed to attempts


@dataclass(frozen=True)
class ItemApi:
    """Where attempts reach their work items (ksquad-api's URL as sandboxes see it, or the embedded API) and the
    key their item tokens are signed with, shared with that API."""

    url: str
    key: bytes
    ca: str | None = None  # PEM: the one CA attempts trust for that URL (None: the sandbox's own trust store)


@dataclass(frozen=True)
class CallerKeys:
    sandbox: bytes  # the worker's own: sandboxes learn only hashes of what it makes
    endpoint: bytes | None = None  # shared with the shared endpoint agents' deployments
    items: ItemApi | None = None  # None: attempts get no access to their work item

    @classmethod
    def from_env(cls) -> "CallerKeys":
        endpoint_file = os.environ.get(ENDPOINT_KEY_ENV)
        endpoint = read_key(endpoint_file) if endpoint_file else None
        item_file, item_url = os.environ.get(ITEM_KEY_ENV), os.environ.get(ITEM_API_ENV)
        ca_file = os.environ.get(ITEM_API_CA_ENV)
        ca = Path(ca_file).read_text() if ca_file else None
        items = ItemApi(item_url, read_key(item_file), ca) if item_file and item_url else None
        sandbox_file = os.environ.get(SANDBOX_KEY_ENV)
        if sandbox_file:
            return cls(read_key(sandbox_file), endpoint, items)
        log.warning(
            "%s is not set: sandbox tokens come from a key of this process; a restarted worker or another "
            "replica cannot reach the agents of attempts in flight",
            SANDBOX_KEY_ENV,
        )
        return cls(process_keys().sandbox, endpoint, items)

    def attempt_access(self, run: RunIdentity, memory: tuple[str, ...] = ()) -> dict[str, Any] | None:
        """The contract's `attemptApi` for this attempt (agent.contract.AttemptApi): ksquad-api's URL for sandboxes
        and a token for this attempt alone, for its checkpoints (api.attempts), its Run's work item and the squad
        memories named (api.memory: its Team's and its Project's). Made when
        the attempt's message is, so it is in no workflow history, spec or log; None without an items API."""
        if self.items is None:
            return None
        access = ItemAccess(
            namespace=run.namespace,
            item=run.work_item_ref or "",
            run=f"{run.namespace}/{run.name}",
            uid=run.uid,
            attempt=run.attempt,
            fence=run.fence,
            expires=int(time.time()) + ITEM_TOKEN_SECONDS,
            memory=memory,
        )
        granted: dict[str, Any] = {"url": self.items.url, "token": item_token(self.items.key, access)}
        if memory:
            granted["memory"] = list(memory)
        if self.items.ca:
            granted["ca"] = self.items.ca
        return granted

    def work_item_access(self, run: RunIdentity) -> dict[str, str] | None:
        """The contract's `workItem` for this attempt (agent.contract.WorkItemAccess): the API and a token for its
        Run's item (the attempt's token: it reaches that item alone)."""
        granted = self.attempt_access(run)
        if granted is None or run.work_item_ref is None:
            return None
        return {
            "url": granted["url"],
            "token": granted["token"],
            **({"ca": granted["ca"]} if "ca" in granted else {}),
            "namespace": run.namespace,
            "id": run.work_item_ref,
        }

    def sandbox_token(self, run: RunIdentity) -> str:
        return sandbox_token(self.sandbox, run.namespace, run.uid, run.attempt, run.fence)

    def sandbox_token_sha256(self, run: RunIdentity) -> str:
        """What the attempt's sandbox is given: it can check the token, never make it."""
        return token_sha256(self.sandbox_token(run))

    def token(self, contract: ExecutionContract) -> str | None:
        """The token for one request of this attempt to its agent."""
        if not contract.agent.endpoint:
            return self.sandbox_token(contract.run)
        if self.endpoint is None:
            return None
        run = contract.run
        claims = Claims(
            namespace=run.namespace,
            uid=run.uid,
            attempt=run.attempt,
            fence=run.fence,
            credentials=frozenset((c.secret_name, c.key) for c in credential_refs(contract)),
            expires=int(time.time()) + ENDPOINT_TOKEN_SECONDS,
        )
        return endpoint_token(self.endpoint, claims)


@cache
def process_keys() -> CallerKeys:
    """A sandbox key of this process, for tests and a worker started without one (see the module's docstring)."""
    return CallerKeys(secrets.token_bytes(32))


def credential_refs(contract: ExecutionContract) -> list[CredentialRef]:
    """Every credential the attempt may use: its models' (ExecutionContract.models) and the agent's own."""
    refs = [m.credential for m in contract.models() if m.credential]
    if contract.agent.credential:
        refs.append(contract.agent.credential)
    return refs


class BearerToken(ClientCallInterceptor):
    """Adds the attempt's token to every A2A request of a client, made when the request is."""

    def __init__(self, token: Callable[[], str | None]) -> None:
        self.token = token

    async def before(self, args: BeforeArgs) -> None:
        token = self.token()
        if token is None:
            return
        context = args.context or ClientCallContext()
        context.service_parameters = {
            **(context.service_parameters or {}),
            "Authorization": f"Bearer {token}",
        }
        args.context = context

    async def after(self, args: AfterArgs) -> None:
        return None


def off_endpoint(card: AgentCard, endpoint: str) -> str | None:
    """A JSON-RPC interface of the card on another scheme, host or port than `endpoint`, or None."""
    for interface in card.supported_interfaces:
        if interface.protocol_binding.upper() != "JSONRPC":
            continue
        if _origin(urljoin(endpoint, interface.url)) != _origin(endpoint):
            return interface.url or "(no URL)"
    return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1  # no valid port: matches nothing
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").rstrip("."), port or {"http": 80, "https": 443}.get(scheme)
