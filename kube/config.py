"""Where the API server is and who we are to it: a kubeconfig, loaded by the official `kubernetes` client's
configuration loaders (what kubectl reads, so what users have), merged from every file of `$KUBECONFIG` as
kubectl merges them, its current (or a named) context and that context's namespace, client certificates,
tokens, token files, exec credential plugins (EKS, GKE, AKS, OIDC logins) and auth providers; or, in a pod,
the in-cluster service account, read here directly. The official package is imported only for a kubeconfig:
importing it loads its whole generated API client, ~10 MB of every process that does, and ksquad's processes
in a cluster (the worker, the bridge, the API) use the service account.

No credential is read once and kept. A token file (the in-cluster one, which the kubelet rotates, or a
kubeconfig's `tokenFile`) is read again whenever it changes on disk; an exec plugin runs again when its
credential expires or when the API server answers 401; any other credential is loaded again after a 401.
Key material given inline lives in a private file only while the TLS context reads it.
"""

import asyncio
import os
import ssl
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import yaml

if TYPE_CHECKING:
    from kubernetes.client import Configuration

IN_CLUSTER = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ConfigError(Exception):
    """The configuration cannot be used; the message says which file or field and why."""


class Credentials(Protocol):
    """The Authorization header of the next request, as fresh as its source allows."""

    async def authorization(self) -> str | None: ...

    async def refreshed(self) -> bool:
        """Called after a 401: load the credential again; True when there is a new one to try."""
        ...


class NoCredentials:
    async def authorization(self) -> str | None:
        return None

    async def refreshed(self) -> bool:
        return False


@dataclass
class TokenFile:
    """A bearer token read from a file whenever the file changes (the kubelet writes a projected token anew
    before the old one expires; a client that read it once keeps presenting the old one)."""

    path: Path
    _seen: tuple[int, int, int] | None = field(default=None, repr=False)
    _token: str | None = field(default=None, repr=False)

    def _read(self) -> str:
        stat = self.path.stat()
        version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if version != self._seen or self._token is None:
            token = self.path.read_text().strip()
            if not token:
                if self._token is not None:
                    # Read between a writer's truncate and its write (one that does not rename a new file into
                    # place): the token of before stands, and the file is read again at the next request.
                    return self._token
                raise ConfigError(f"the token file {self.path} is empty")
            self._seen, self._token = version, token
        return self._token

    async def authorization(self) -> str | None:
        return f"Bearer {self._read()}"

    async def refreshed(self) -> bool:
        before = self._token
        self._seen = None
        return self._read() != before


class LoadedCredentials:
    """What the official loader made of a kubeconfig user (a token, an exec plugin, an auth provider): its
    refresh hook runs before every request (it runs the plugin again once the credential expired), and after a
    401 the user is loaded anew (the plugin runs again even without an expiry)."""

    def __init__(
        self, configuration: "Configuration", load: Callable[[], "Configuration"], runs_programs: bool
    ) -> None:
        self._configuration = configuration
        self._load = load
        self._runs_programs = runs_programs  # an exec plugin or a cmd-path: keep the event loop free

    def _current(self) -> str | None:
        configuration = self._configuration
        if configuration.refresh_api_key_hook is not None:
            configuration.refresh_api_key_hook(configuration)
        token: str | None = configuration.api_key.get("BearerToken")
        return token

    async def authorization(self) -> str | None:
        if self._runs_programs:
            return await asyncio.to_thread(self._current)
        return self._current()

    async def refreshed(self) -> bool:
        from kubernetes.config.config_exception import ConfigException

        before = self._configuration.api_key.get("BearerToken")
        try:
            self._configuration = await asyncio.to_thread(self._load)
        except (ConfigException, ConfigError):
            return False
        return bool(self._configuration.api_key.get("BearerToken") != before)


@dataclass
class Config:
    server: str
    ssl_context: ssl.SSLContext | bool
    credentials: Credentials = field(default_factory=NoCredentials)
    namespace: str = "default"
    tls_server_name: str | None = None
    proxy: str | None = None
    # The server's trust without this client's certificate, when it presents one (None: ssl_context presents none).
    tls_without_certificate: ssl.SSLContext | bool | None = None

    @classmethod
    def load(cls, kubeconfig: str | Path | None = None, context: str | None = None) -> "Config":
        """The kubeconfig at `kubeconfig` (a path, or several joined with ':'), else the files of
        $KUBECONFIG, else ~/.kube/config; else, in a pod, the in-cluster service account."""
        candidates = str(kubeconfig or os.environ.get("KUBECONFIG") or Path.home() / ".kube" / "config")
        if any(Path(p).expanduser().is_file() for p in candidates.split(os.pathsep) if p):
            return cls.from_kubeconfig(candidates, context)
        if (IN_CLUSTER / "token").is_file() and os.environ.get("KUBERNETES_SERVICE_HOST"):
            return cls.in_cluster()
        raise FileNotFoundError(f"no kubeconfig at {candidates} and not running in a cluster")

    @classmethod
    def in_cluster(cls, account: Path = IN_CLUSTER) -> "Config":
        """The pod's service account: the API server from KUBERNETES_SERVICE_HOST/PORT, its CA, and the
        projected token, read again whenever the kubelet rotates it."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ConfigError("in-cluster configuration: KUBERNETES_SERVICE_HOST/PORT are not set")
        for name in ("token", "ca.crt"):
            path = account / name
            if not path.is_file() or not path.read_bytes().strip():
                raise ConfigError(f"in-cluster configuration: {path} is missing or empty")
        namespace_file = account / "namespace"
        namespace = namespace_file.read_text().strip() if namespace_file.is_file() else "default"
        return cls(
            f"https://[{host}]:{port}"
            if ":" in host
            else f"https://{host}:{port}",  # an IPv6 address in brackets
            ssl.create_default_context(cafile=str(account / "ca.crt")),
            TokenFile(account / "token"),
            namespace=namespace,
        )

    @classmethod
    def from_kubeconfig(cls, files: str | Path, context: str | None = None) -> "Config":
        """A kubeconfig of one or several files (':'-separated): clusters, users and contexts merged, the first
        file to name one winning, and the first file's current-context, as kubectl does."""
        from kubernetes.client import Configuration
        from kubernetes.config.config_exception import ConfigException
        from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

        paths = [str(Path(p).expanduser()) for p in str(files).split(os.pathsep) if p]
        existing = [p for p in paths if Path(p).is_file()]
        if not existing:
            raise FileNotFoundError(f"no kubeconfig at {files}")
        try:
            merged = KubeConfigMerger(os.pathsep.join(existing)).config
            current = context or _first_current_context(existing)
            if merged is None or not current:
                raise ConfigError(f"the kubeconfig {files} names no current-context (pass a context)")
            with tempfile.TemporaryDirectory(prefix="ksquad-kube-") as scratch:
                configuration = Configuration()
                loader = KubeConfigLoader(
                    config_dict=merged, active_context=current, config_base_path=None, temp_file_path=scratch
                )
                loader.load_and_set(configuration)
                tls = _tls_context(configuration)
                # What a person's own token is sent over (Kube.acting_as): this client's certificate would
                # authenticate the request as this client, whatever token it carries.
                anonymous = (
                    _tls_context(configuration, client_certificate=False) if configuration.cert_file else None
                )
            context_value: dict[str, Any] = loader.current_context.get("context") or {}
        except ConfigException as err:
            raise ConfigError(f"kubeconfig {files}: {err}") from None
        user = _user_of(merged, context_value.get("user"))
        credentials: Credentials
        token_file = user.get("tokenFile")
        if token_file and not user.get("token"):
            base = Path(_file_of(merged, context_value.get("user"), "users") or existing[0]).parent
            credentials = TokenFile(base / Path(token_file).expanduser())
        elif configuration.api_key.get("BearerToken"):
            provider = user.get("auth-provider") or {}
            runs_programs = "exec" in user or "cmd-path" in (provider.get("config") or {})
            credentials = LoadedCredentials(
                configuration, _loader_without_files(merged, current), runs_programs
            )
        else:
            credentials = NoCredentials()  # client certificates only
        return cls(
            configuration.host,
            tls,
            credentials,
            namespace=context_value.get("namespace") or "default",
            tls_server_name=getattr(configuration, "tls_server_name", None),
            proxy=configuration.proxy,
            tls_without_certificate=anonymous,
        )


def _first_current_context(files: list[str]) -> str | None:
    for file in files:
        doc = yaml.safe_load(Path(file).read_text()) or {}
        if doc.get("current-context"):
            return str(doc["current-context"])
    return None


def _user_of(merged: Any, name: str | None) -> dict[str, Any]:
    for entry in merged.value.get("users") or []:
        value = entry.value if hasattr(entry, "value") else entry
        if value.get("name") == name:
            user: dict[str, Any] = dict(value.get("user") or {})
            return user
    return {}


def _file_of(merged: Any, name: str | None, kind: str) -> str | None:
    """The kubeconfig file an entry came from: relative paths in it are relative to that file."""
    for entry in merged.value.get(kind) or []:
        value = entry.value if hasattr(entry, "value") else entry
        if value.get("name") == name:
            path: str | None = getattr(entry, "path", None)
            return path
    return None


def _loader_without_files(merged: Any, context: str) -> Callable[[], "Configuration"]:
    """Loads the user's credential again (the refresh after a 401), writing no key material: the TLS context is
    made once, from the first load."""
    from kubernetes.client import Configuration
    from kubernetes.config.kube_config import KubeConfigLoader

    def load() -> Configuration:
        with tempfile.TemporaryDirectory(prefix="ksquad-kube-") as scratch:
            configuration = Configuration()
            KubeConfigLoader(
                config_dict=merged, active_context=context, config_base_path=None, temp_file_path=scratch
            ).load_and_set(configuration)
            return configuration

    return load


def _tls_context(configuration: "Configuration", client_certificate: bool = True) -> ssl.SSLContext | bool:
    if not configuration.host.startswith("https"):
        return False
    tls = (
        ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.ssl_ca_cert
        else ssl.create_default_context()
    )
    if not configuration.verify_ssl:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    if client_certificate and configuration.cert_file and configuration.key_file:
        tls.load_cert_chain(configuration.cert_file, configuration.key_file)
    return tls
