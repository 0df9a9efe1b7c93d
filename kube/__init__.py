"""A small async Kubernetes API client on httpx, shared by the activities (sandboxes, outputs), the bridge, the
API and the CLI.

Objects are plain dicts, as the API serves them. Where the server is and who we are come from `kube.config`
(the official client's kubeconfig and in-cluster loaders; credentials refreshed, never read once and kept);
requests are get, list, create, patch (merge, strategic, JSON, server-side apply), delete and watch, with errors
that keep the API's status and message.
"""

import asyncio
import builtins
import copy
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Literal
from urllib.parse import quote

import httpx

from kube.config import Config, ConfigError, Credentials, TokenFile

__all__ = [
    "ApiError",
    "BearerToken",
    "Config",
    "ConfigError",
    "Kube",
    "TokenFile",
    "Unreachable",
    "path",
    "reflect",
]
log = logging.getLogger(__name__)

Obj = dict[str, Any]
PatchType = Literal["merge", "strategic", "json", "apply"]
_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}
_METADATA_ONLY = "application/json;as=PartialObjectMetadata"


class ApiError(Exception):
    """A failed API call: `status` is the HTTP status (404, 409, 422, 403...), `reason` the API's reason."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Unreachable(Exception):
    """The API server could not be reached (connection refused, timeout): retry later."""


def segment(name: str) -> str:
    """A namespace or a name as one path segment (no object is named "." or "..", which would climb)."""
    if name in (".", ".."):
        raise ValueError(f"{name!r} is not a Kubernetes name")
    return quote(name, safe=":")


def path(
    api_version: str,
    plural: str,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The REST path of a resource: ("batch/v1", "jobs", "ns", "x") -> /apis/batch/v1/namespaces/ns/jobs/x.
    The namespace and the name are escaped: a name from a request ("../../api/v1/...", "x?watch=1") is one
    segment, never another path or a query."""
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespace:
        base += f"/namespaces/{segment(namespace)}"
    base += f"/{plural}"
    if name:
        base += f"/{segment(name)}"
    if subresource:
        base += f"/{subresource}"
    return base


class _Authorization(httpx.Auth):
    """Every request carries the credential as it is now; after a 401 the credential is loaded again and the
    request tried once more (an exec plugin's token may be revoked before its expiry)."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        header = await self.credentials.authorization()
        if header:
            request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401 and await self.credentials.refreshed():
            header = await self.credentials.authorization()
            if header:
                request.headers["Authorization"] = header
            yield request


RETRIES_ON_429 = 3
MAX_RETRY_AFTER_SECONDS = 2.0


class BearerToken:
    """A fixed bearer token (a person's, as their browser sent it): nothing to load again after a 401."""

    def __init__(self, token: str) -> None:
        self._header = f"Bearer {token}"

    async def authorization(self) -> str | None:
        return self._header

    async def refreshed(self) -> bool:
        return False


class Kube:
    """`async with Kube(Config.load()) as kube: await kube.get(path("v1", "pods", "ns", "x"))`."""

    # Requests in flight at once (watches apart); more wait their turn here. httpx's pool scans every request it
    # holds each time one ends: with hundreds waiting on a slow API server, that scan became most of a claiming
    # worker's CPU, slowing it further (bench/sandbox_claims.py at 75 claims/s). client-go caps by rate instead.
    MAX_IN_FLIGHT = 32

    def __init__(self, config: Config, timeout: float = 30.0) -> None:
        self.config = config
        self._in_flight = asyncio.Semaphore(self.MAX_IN_FLIGHT)
        # People's requests (acting_as) wait on their own: slow ones cannot hold up this client's own.
        self._people_in_flight = asyncio.Semaphore(self.MAX_IN_FLIGHT)
        self.http = httpx.AsyncClient(
            base_url=config.server,
            auth=_Authorization(config.credentials),
            verify=config.ssl_context,
            timeout=httpx.Timeout(timeout),
            proxy=config.proxy,
        )
        # The name the server's certificate is checked against, when it is not the server's host.
        self._extensions = {"sni_hostname": config.tls_server_name} if config.tls_server_name else {}
        self._auth: httpx.Auth | None = None  # another credential than the config's (acting_as)
        self._borrowed = False
        self._without_certificate: httpx.AsyncClient | None = None

    def acting_as(self, token: str) -> "Kube":
        """A client whose every request carries `token` (a person's own credential) instead of this client's:
        the API server answers and authorises as that person. Its requests in flight are counted apart from this
        client's, with every other person's. It shares this client's connections, or, when
        this client presents a certificate (which would authenticate each request as this client), a pool of
        its own that presents none. Closing it closes nothing."""
        other = copy.copy(self)
        if self.config.tls_without_certificate is not None:
            if self._without_certificate is None:
                self._without_certificate = httpx.AsyncClient(
                    base_url=self.config.server,
                    verify=self.config.tls_without_certificate,
                    timeout=self.http.timeout,
                    proxy=self.config.proxy,
                )
            other.http = self._without_certificate
        other._auth = _Authorization(BearerToken(token))
        other._in_flight = self._people_in_flight
        other._borrowed = True
        return other

    async def __aenter__(self) -> "Kube":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if not self._borrowed:
            await self.http.aclose()
            if self._without_certificate is not None:
                await self._without_certificate.aclose()

    async def _call(self, method: str, url: str, **kwargs: Any) -> Obj:
        for tries_left in range(RETRIES_ON_429, -1, -1):
            try:
                async with self._in_flight:
                    response = await self.http.request(
                        method,
                        url,
                        extensions=self._extensions,
                        auth=self._auth or httpx.USE_CLIENT_DEFAULT,
                        **kwargs,
                    )
            except httpx.TransportError as err:
                raise Unreachable(f"{method} {url}: {type(err).__name__}: {err}") from None
            # "Too many requests" with a Retry-After (priority and fairness, a resource's storage initialising
            # after its CRD was established): asked again after it, as client-go does.
            wait = _retry_after(response)
            if wait is None or not tries_left:
                break
            await asyncio.sleep(wait)
        if response.status_code >= 400:
            raise _api_error(response)
        body: Obj = response.json()
        return body

    async def get(self, url: str) -> Obj:
        return await self._call("GET", url)

    async def list(
        self,
        url: str,
        labels: dict[str, str] | str | None = None,
        fields: str | None = None,
        limit: int | None = None,
        metadata_only: bool = False,
        continue_token: str | None = None,
    ) -> Obj:
        """`metadata_only` fetches PartialObjectMetadata: names, labels, versions; never a Secret's data. With
        `limit`, one page: the next is asked with the answer's metadata.continue as `continue_token`."""
        params: dict[str, Any] = {}
        if labels:
            params["labelSelector"] = (
                labels if isinstance(labels, str) else ",".join(f"{k}={v}" for k, v in labels.items())
            )
        if fields:
            params["fieldSelector"] = fields
        if limit:
            params["limit"] = limit
        if continue_token:
            params["continue"] = continue_token
        headers = {"Accept": f"{_METADATA_ONLY}List;g=meta.k8s.io;v=v1"} if metadata_only else {}
        return await self._call("GET", url, params=params, headers=headers)

    async def create(self, url: str, body: Obj, field_manager: str = "ksquad", dry_run: bool = False) -> Obj:
        """Create `body`; with `dry_run`, only as the API server would (defaults applied, admission asked), nothing
        stored."""
        params = {"fieldManager": field_manager, **({"dryRun": "All"} if dry_run else {})}
        return await self._call("POST", url, json=body, params=params)

    async def replace(self, url: str, body: Obj, field_manager: str = "ksquad") -> Obj:
        return await self._call("PUT", url, json=body, params={"fieldManager": field_manager})

    async def patch(
        self,
        url: str,
        body: Obj | builtins.list[Obj],
        kind: PatchType = "merge",
        field_manager: str = "ksquad",
        force: bool = False,
    ) -> Obj:
        params: dict[str, Any] = {"fieldManager": field_manager}
        if kind == "apply" and force:
            params["force"] = "true"
        return await self._call(
            "PATCH",
            url,
            content=json.dumps(body),
            params=params,
            headers={"Content-Type": _CONTENT_TYPES[kind]},
        )

    async def delete(
        self,
        url: str,
        propagation: Literal["Foreground", "Background", "Orphan"] | None = None,
        grace_seconds: int | None = None,
        missing_ok: bool = True,
    ) -> Obj | None:
        options: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation:
            options["propagationPolicy"] = propagation
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            return await self._call("DELETE", url, json=options)
        except ApiError as err:
            if err.status == 404 and missing_ok:
                return None
            raise

    async def watch(
        self,
        url: str,
        resource_version: str | None = None,
        labels: str | None = None,
        timeout_seconds: int = 300,
        bookmarks: bool = True,
        metadata_only: bool = False,
    ) -> AsyncIterator[Obj]:
        """Watch events ({"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": {...}}) until the server
        ends the stream. An ERROR event with code 410 means the resource version is gone: list again.
        `metadata_only` streams PartialObjectMetadata, as `list` does: never a Secret's data."""
        params: dict[str, Any] = {
            "watch": "true",
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true" if bookmarks else "false",
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        if labels:
            params["labelSelector"] = labels
        headers = {"Accept": f"{_METADATA_ONLY};g=meta.k8s.io;v=v1"} if metadata_only else {}
        try:
            async with self.http.stream(
                "GET",
                url,
                params=params,
                headers=headers,
                timeout=httpx.Timeout(30.0, read=timeout_seconds + 30),
                extensions=self._extensions,
                auth=self._auth or httpx.USE_CLIENT_DEFAULT,
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _api_error(response)
                async for line in response.aiter_lines():
                    if line.strip():
                        event: Obj = json.loads(line)
                        yield event
        except httpx.TransportError as err:
            raise Unreachable(f"watch {url}: {type(err).__name__}: {err}") from None


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds a 429 asks the client to wait (capped at MAX_RETRY_AFTER_SECONDS), else None."""
    if response.status_code != 429:
        return None
    try:
        return min(float(response.headers.get("retry-after", "")), MAX_RETRY_AFTER_SECONDS)
    except ValueError:
        return None


def _api_error(response: httpx.Response) -> ApiError:
    try:
        status = response.json()
        return ApiError(response.status_code, status.get("reason", ""), status.get("message", response.text))
    except (json.JSONDecodeError, ValueError, AttributeError):
        return ApiError(response.status_code, response.reason_phrase, response.text[:500])


async def reflect(
    kube: Kube,
    url: str,
    listed: Callable[[builtins.list[Obj]], None],
    changed: Callable[[str, Obj], None],
    lost: Callable[[], None] = lambda: None,
    labels: str | None = None,
    max_backoff: float = 10.0,
    keep: Callable[[Obj], bool] = lambda _: True,
    page: int = 500,
    metadata_only: bool = False,
) -> None:
    """Keep a copy of what `url` (with `labels`) holds, as client-go's reflector does, until cancelled: list
    (`listed` gets every object `keep` keeps, read `page` at a time: what is not kept is never held all at once),
    then watch from the list's version (`changed` gets ADDED, MODIFIED or DELETED and the object). A version the
    server no longer has (410 Gone) lists again; a failure calls `lost` (what the copy holds may be stale from
    now on) and lists again after a capped backoff. `metadata_only`: PartialObjectMetadata, lists and events."""
    backoff = 0.5
    while True:
        try:
            kept: builtins.list[Obj] = []
            token: str | None = None
            while True:
                answer = await kube.list(
                    url, labels=labels, limit=page, continue_token=token, metadata_only=metadata_only
                )
                kept += [obj for obj in answer.get("items") or [] if keep(obj)]
                token = answer["metadata"].get("continue") or None
                if token is None:
                    break
            listed(kept)
            version: str | None = answer["metadata"]["resourceVersion"]
            backoff = 0.5
            while version is not None:
                version = await _follow(kube, url, version, labels, changed, metadata_only)
        except (Unreachable, ApiError) as err:
            lost()
            log.warning("watching %s: %s; again in %.1fs", url, err, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)


async def _follow(
    kube: Kube,
    url: str,
    version: str,
    labels: str | None,
    changed: Callable[[str, Obj], None],
    metadata_only: bool = False,
) -> str | None:
    """Watch from `version`; the version to go on from, or None when the server no longer has it."""
    async for event in kube.watch(url, resource_version=version, labels=labels, metadata_only=metadata_only):
        kind, obj = event["type"], event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                return None
            raise ApiError(int(obj.get("code", 500)), obj.get("reason", ""), obj.get("message", ""))
        version = obj["metadata"]["resourceVersion"]
        if kind != "BOOKMARK":
            changed(kind, obj)
    return version
