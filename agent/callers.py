"""Who may call an agent: only its attempt's caller, the worker.

The worker sends a token as `Authorization: Bearer <token>` on every A2A request. The agent answers JSON-RPC
only when the token checks; its card, /healthz, /readyz and /ksquad/stats are public (they hold nothing of a run).
How the agent checks a token depends on where it runs:

- A sandbox (a cold Job's pod, a warm pod, a local agent of `ksquad dev`) knows only the token's SHA-256, never
  the token:
  - a pod reads it from its own annotation `ksquad.io/caller-token-sha256`, through a downward-API volume of its
    annotations (KSQUAD_POD_ANNOTATIONS names the file). A cold Job carries the annotation in its pod template; a
    warm pod gets it in the claim's guarded label patch, and the kubelet rewrites the file some time later, so a
    request that comes first waits for it (bounded, CALLER_WAIT_SECONDS). Once read, the hash is kept: a pod
    serves one attempt and is never rebound.
  - a local agent gets it in its environment (KSQUAD_CALLER_TOKEN_SHA256), which only its own user can read.
  The token itself is `sandbox_token()`: an HMAC of the attempt (namespace, run uid, attempt, fence) under a key
  only the worker holds (KSQUAD_SANDBOX_TOKEN_KEY_FILE). Every worker replica, and a restarted one, makes the
  same token for the same attempt, so nothing has to carry it: it is in no workflow history, spec or log.
- A shared endpoint agent (Agent.spec.endpoint, no sandbox) serves many attempts of many namespaces and cannot
  learn per-attempt hashes. It shares a key with the worker (KSQUAD_ENDPOINT_TOKEN_KEY_FILE, on both sides) and
  checks `endpoint_token()`: signed claims naming the attempt (namespace, run uid, attempt, fence), the
  credentials it may use and when the token expires. It then runs only that attempt's contract, reads only the
  credentials the token names, from that namespace's directory (agent.credentials), and keeps each attempt's
  tasks apart (the task store is partitioned by the caller's scope).
An agent with none of these configured answers no JSON-RPC at all.
"""

import asyncio
import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger("ksquad.agent")

TOKEN_SHA256_ANNOTATION = "ksquad.io/caller-token-sha256"
POD_ANNOTATIONS_ENV = "KSQUAD_POD_ANNOTATIONS"  # a downward-API file of the pod's annotations
TOKEN_SHA256_ENV = "KSQUAD_CALLER_TOKEN_SHA256"  # a local agent's
ENDPOINT_KEY_ENV = "KSQUAD_ENDPOINT_TOKEN_KEY_FILE"  # a shared endpoint agent's (and the worker's)
SANDBOX_KEY_ENV = "KSQUAD_SANDBOX_TOKEN_KEY_FILE"  # the worker's only
CALLER_WAIT_SECONDS = float(os.environ.get("KSQUAD_CALLER_WAIT_SECONDS", "30"))
ENDPOINT_TOKEN_SECONDS = 300  # a token is checked when a request starts; the worker makes one per request
CLOCK_SKEW_SECONDS = 60
_SANDBOX_CONTEXT = b"ksquad.io/sandbox-caller/v1\n"
_ENDPOINT_PREFIX = "ksquad-e1."
ITEM_TOKEN_PREFIX = "ksquad-i1."
ITEM_KEY_ENV = (
    "KSQUAD_ITEM_TOKEN_KEY_FILE"  # the worker's and ksquad-api's: an attempt's access to its work item
)
ITEM_TOKEN_SECONDS = (
    7 * 86400
)  # an attempt may run for days; its fence, not the expiry, ends what it may write


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def read_key(path: str | Path) -> bytes:
    """A token key file: at least 32 bytes, base64 (what `head -c32 /dev/urandom | base64` makes) or raw."""
    data = Path(path).read_bytes()
    try:
        decoded = base64.b64decode(data.strip(), validate=True)
    except ValueError:
        decoded = b""
    if len(decoded) >= 32:
        return decoded
    if len(data) >= 32:
        return data
    raise ValueError(f"the token key in {path} is shorter than 32 bytes")


# --- tokens (the worker makes them; the format is defined once, here) ----------------------------------------


def sandbox_token(key: bytes, namespace: str, uid: str, attempt: int, fence: int) -> str:
    attempt_id = f"{namespace}\n{uid}\n{attempt}\n{fence}".encode()
    return _b64(hmac.new(key, _SANDBOX_CONTEXT + attempt_id, hashlib.sha256).digest())


def token_sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Claims:
    """What a shared endpoint's caller may do: one attempt, with these credentials, until `expires`."""

    namespace: str
    uid: str
    attempt: int
    fence: int
    credentials: frozenset[tuple[str, str]]  # (secret, key)
    expires: int

    @property
    def scope(self) -> str:
        return f"{self.namespace}/{self.uid}/a{self.attempt}"


def _signed(prefix: str, key: bytes, payload: dict[str, Any]) -> str:
    body = prefix + _b64(json.dumps(payload, separators=(",", ":")).encode())
    return body + "." + _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())


def _verified(prefix: str, key: bytes, token: str) -> Any:
    """The payload of a token `_signed` made with `key`, or None (another format, another key, altered)."""
    if not token.startswith(prefix) or token.count(".") != 2:
        return None
    body, _, signature = token.rpartition(".")
    try:
        expected = hmac.new(key, body.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, _unb64(signature)):
            return None
        return json.loads(_unb64(body.removeprefix(prefix)))
    except ValueError:
        return None


def endpoint_token(key: bytes, claims: Claims) -> str:
    payload = {
        "ns": claims.namespace,
        "uid": claims.uid,
        "attempt": claims.attempt,
        "fence": claims.fence,
        "creds": sorted([s, k] for s, k in claims.credentials),
        "exp": claims.expires,
    }
    return _signed(_ENDPOINT_PREFIX, key, payload)


def verify_endpoint_token(key: bytes, token: str, now: float | None = None) -> Claims | None:
    data = _verified(_ENDPOINT_PREFIX, key, token)
    if data is None:
        return None
    try:
        claims = Claims(
            namespace=str(data["ns"]),
            uid=str(data["uid"]),
            attempt=int(data["attempt"]),
            fence=int(data["fence"]),
            credentials=frozenset((str(s), str(k)) for s, k in data["creds"]),
            expires=int(data["exp"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if claims.expires + CLOCK_SKEW_SECONDS < (time.time() if now is None else now):
        return None
    return claims


@dataclass(frozen=True)
class ItemAccess:
    """What an attempt's token lets its agent do: read and write its Run's work item (`item`, "" for none) and its
    checkpoints, read and add to its squad's memories (`memory`), as that attempt.
    ksquad-api (or the embedded API) checks the token's signature and that the claim is still the attempt's (its
    uid and fence), and writes for the person the claim records: the token, readable by the sandbox, names nobody."""

    namespace: str
    item: str
    run: str  # "<namespace>/<name>"
    uid: str
    attempt: int
    fence: int
    expires: int
    memory: tuple[str, ...] = ()  # the squad memories it reads and adds to: "teams/<name>", "projects/<name>"


def item_token(key: bytes, access: ItemAccess) -> str:
    return _signed(ITEM_TOKEN_PREFIX, key, dataclasses.asdict(access))


def verify_item_token(key: bytes, token: str, now: float | None = None) -> ItemAccess | None:
    data = _verified(ITEM_TOKEN_PREFIX, key, token)
    try:
        access = ItemAccess(**data) if isinstance(data, dict) else None
        if access is not None:
            access = dataclasses.replace(access, memory=tuple(str(m) for m in access.memory))
    except TypeError:
        return None
    if access is None or access.expires + CLOCK_SKEW_SECONDS < (time.time() if now is None else now):
        return None
    return access


# --- checking (the agent) ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: the worker for this sandbox (`claims` None), or for one attempt (a shared
    endpoint's). `scope` partitions the task store: a caller sees only its own scope's tasks."""

    scope: str
    claims: Claims | None = None


class Check(Protocol):
    async def caller(self, token: str) -> Caller | str:
        """The caller, or why the token is refused."""
        ...


class NoCallers:
    async def caller(self, token: str) -> Caller | str:
        return (
            f"this agent was started without caller authentication ({POD_ANNOTATIONS_ENV}, {TOKEN_SHA256_ENV} "
            f"or {ENDPOINT_KEY_ENV}): it answers no one"
        )


class TokenHash:
    """A sandbox's check: the token's SHA-256 is the one given at start, or the one in the pod's annotation."""

    def __init__(self, sha256: str | None = None, annotations: Path | None = None) -> None:
        self.sha256 = sha256.strip().lower() if sha256 else None
        self.annotations = annotations

    async def caller(self, token: str) -> Caller | str:
        expected = self.sha256 or await self._from_annotation()
        if expected is None:
            return f"no {TOKEN_SHA256_ANNOTATION} annotation on this pod after {CALLER_WAIT_SECONDS:.0f}s"
        if not hmac.compare_digest(token_sha256(token), expected):
            return "the token is not this attempt's"
        return Caller(scope="worker")

    async def _from_annotation(self) -> str | None:
        """A warm pod learns its hash when it is claimed: wait, bounded, for the kubelet to write it."""
        if self.annotations is None:
            return None
        deadline = time.monotonic() + CALLER_WAIT_SECONDS
        while True:
            value = await asyncio.to_thread(pod_annotation, self.annotations, TOKEN_SHA256_ANNOTATION)
            if value:
                self.sha256 = value.strip().lower()  # kept: a pod serves one attempt
                return self.sha256
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(0.1)


class EndpointKey:
    """A shared endpoint's check: a token signed with the key it shares with the worker, not yet expired."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    async def caller(self, token: str) -> Caller | str:
        claims = verify_endpoint_token(self.key, token)
        if claims is None:
            return "the token is not signed with this endpoint's key, or it expired"
        return Caller(scope=claims.scope, claims=claims)


def pod_annotation(path: Path, name: str) -> str | None:
    """One annotation from a downward-API file (`key="value"` lines, values quoted as Go does)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key == name:
            try:
                parsed: Any = json.loads(value)
            except json.JSONDecodeError:
                return None
            return parsed if isinstance(parsed, str) else None
    return None


def check_from_env() -> Check:
    """The caller check this agent was configured with (a shared endpoint's key, then a pod's annotation file,
    then a hash given at start), or NoCallers."""
    if os.environ.get(ENDPOINT_KEY_ENV):
        return EndpointKey(read_key(os.environ[ENDPOINT_KEY_ENV]))
    if os.environ.get(POD_ANNOTATIONS_ENV):
        return TokenHash(annotations=Path(os.environ[POD_ANNOTATIONS_ENV]))
    if os.environ.get(TOKEN_SHA256_ENV):
        return TokenHash(sha256=os.environ[TOKEN_SHA256_ENV])
    log.warning("no caller authentication configured: every JSON-RPC request will be refused")
    return NoCallers()
