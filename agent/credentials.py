"""A credential's value, and where the agent may send it.

Where a value is read from depends on where the agent runs:
- in a sandbox (a pod of the Run's namespace, or a local process): the Secret mounted at
  `<KSQUAD_SECRETS_DIR>/<secret>/<key>` (the kubelet keeps it current), else the environment variable the
  contract names (a cold Job's secretKeyRef). The contract comes from the attempt's authenticated caller (the
  worker: agent.callers), so its names are the worker's word.
- on a shared endpoint (Agent.spec.endpoint, serving every namespace): only
  `<KSQUAD_SECRETS_DIR>/<namespace>/<secret>/<key>`, for the namespace and credentials the caller's signed token
  names. Never the environment: a variable name says nothing of the tenant it belongs to.

A value goes only to a host its Secret's owner allows (`allowed_hosts`, from the Secret's annotation
`ksquad.io/allowed-hosts`: host names, host:port or CIDRs; a CIDR matches an IP literal only, never a name,
which DNS could point anywhere). An empty list allows no host. The agent's own OPENAI_API_KEY (a hand-run agent)
goes only to its own OPENAI_BASE_URL. A Secret name or key that is not a plain file name is refused, so a
contract cannot reach other files of the agent's filesystem.
"""

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from agent.contract import Credential, secret_key_problem, secret_name_problem

SECRETS_DIR_ENV = "KSQUAD_SECRETS_DIR"
DEFAULT_SECRETS_DIR = "/var/run/ksquad/secrets"
ALLOWED_HOSTS_ANNOTATION = "ksquad.io/allowed-hosts"


class CredentialError(Exception):
    """A credential the agent will not read or send; the message says why."""


class CredentialMissing(CredentialError):
    """Not mounted and not in the environment: the model will answer 401, so it is reported as such."""


def check_names(credential: Credential) -> None:
    """The contract's parser refuses these already; checked again where the path is made."""
    problem = secret_name_problem(credential.secret_name) or secret_key_problem(credential.key)
    if problem:
        raise CredentialError(problem)


def host_allowed(url: str, allowed: list[str]) -> bool:
    """Whether `url`'s host is in `allowed` (host, host:port, or a CIDR holding the host's IP literal)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    if not host:
        return False
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for entry in (e.strip().lower() for e in allowed):
        if "/" in entry:
            try:
                if ip is not None and ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                continue
            continue
        entry_host, entry_port = _split_host_port(entry)
        if entry_host.rstrip(".") == host and (entry_port is None or entry_port == port):
            return True
    return False


def _split_host_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6]:port or [v6]
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, int(port) if port.isdigit() else None
    return entry, None  # a name, an IPv4 address, or a bare IPv6 address


@dataclass(frozen=True)
class Credentials:
    """How this agent reads credentials: from the sandbox's own mounts and environment (`namespace` None), or, on
    a shared endpoint, from the mounts of the caller's namespace, for the credentials the caller may use."""

    namespace: str | None = None
    permitted: frozenset[tuple[str, str]] | None = None  # (secret, key) a shared endpoint's caller may use

    def value(self, credential: Credential) -> str:
        check_names(credential)
        if self.permitted is not None and (credential.secret_name, credential.key) not in self.permitted:
            raise CredentialError(
                f"credential {credential.secret_name}/{credential.key} is not one the caller's token names"
            )
        root = Path(os.environ.get(SECRETS_DIR_ENV, DEFAULT_SECRETS_DIR))
        if self.namespace is not None:
            if secret_name_problem(self.namespace) or "." in self.namespace:  # a namespace is a DNS label
                raise CredentialError(f"namespace {self.namespace!r} is not a namespace name")
            root = root / self.namespace
        mounted = root / credential.secret_name / credential.key
        if mounted.is_file():
            return mounted.read_text().strip()
        if self.namespace is None and credential.env and credential.env in os.environ:
            return os.environ[credential.env]
        where = f"${credential.env}" if self.namespace is None else "the environment (a shared endpoint)"
        raise CredentialMissing(
            f"credential {credential.secret_name}/{credential.key} is not mounted at {mounted} nor set in {where}"
        )

    def for_url(self, credential: Credential | None, url: str | None) -> str:
        """The key to send to the model at `url`, after checking its Secret's owner allows that host."""
        if credential is None:
            own_url = os.environ.get("OPENAI_BASE_URL")
            if url is None or (own_url and url.rstrip("/") == own_url.rstrip("/")):
                return os.environ.get("OPENAI_API_KEY", "unused")
            return "unused"  # the agent's own key goes to its own endpoint only
        check_names(credential)
        if not url or not host_allowed(url, credential.allowed_hosts):
            host = urlsplit(url or "").netloc or "(no URL)"
            raise CredentialError(
                f"credential {credential.secret_name} may not be sent to {host}: that host is not in the "
                f"Secret's annotation {ALLOWED_HOSTS_ANNOTATION} "
                f"({', '.join(credential.allowed_hosts) or 'empty: no host allowed'})"
            )
        return self.value(credential)
