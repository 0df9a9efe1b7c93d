"""Where the CLI's runs live: the embedded stack (`ksquad dev`, through its API) or a cluster (kubeconfig,
through the API server; the bridge there does the rest). Both answer with Run objects as the API server
shapes them, and events as the embedded API streams them ({"seq", "kind", "message", "data"}), so the CLI
prints both the same way."""

import asyncio
import json
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from crd_bridge.resources import CANCEL_ANNOTATION, INPUT_ANNOTATION, PAUSE_ANNOTATION, PLURALS
from kube import ApiError, Config, ConfigError, Kube, Unreachable, path
from workflows.signals import RunSignal
from workflows.spec import API_VERSION
from workflows.status import Phase, not_waiting_for_input

# Where ksquad-api serves on a cluster: the annotation of a ClusterRole the chart installs (its api.url). The CLI sends
# the user's cluster credentials there, so it reads the URL only from an object no tenant can write (a namespace
# editor could otherwise point every admin's `ksquad runs watch` at their listener): a cluster-scoped one, which
# every signed-in user may read (charts/ksquad/templates/api.yaml).
LOCATOR = "ksquad-locator"
API_URL_ANNOTATION = "ksquad.io/api-url"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# An event stream that cannot be (re)connected this many times in a row is given up, after backing off 1 s, 2 s,
# 4 s... up to 30 s between tries (about three minutes in all).
RECONNECTS = 10
MAX_RECONNECT_DELAY = 30.0


class CliError(Exception):
    """What the user is told, on stderr, with exit status 1."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class Target(Protocol):
    where: str
    namespace: str  # where a name without a namespace is looked for

    async def apply(self, docs: list[Any]) -> list[dict[str, str]]: ...
    async def list(self, namespace: str | None) -> list[dict[str, Any]]: ...
    async def get(self, namespace: str, name: str) -> dict[str, Any]: ...
    async def signal(self, namespace: str, name: str, action: RunSignal, reason: str | None) -> None: ...
    async def delete(self, namespace: str, name: str) -> None: ...
    def events(self, namespace: str, name: str, after: int) -> AsyncIterator[dict[str, Any]]: ...
    async def artifact(self, namespace: str, name: str, artifact: str) -> bytes: ...
    async def items(
        self, method: str, url: str, body: dict[str, Any] | None = None, what: str = "work items"
    ) -> Any: ...
    async def usage(self, query: dict[str, str]) -> Any: ...
    async def close(self) -> None: ...


async def server_sent_events(
    http: httpx.AsyncClient,
    url: str,
    after: int,
    headers: Callable[[], Awaitable[dict[str, str]]] | None = None,
    where: str = "the API",
) -> AsyncIterator[dict[str, Any]]:
    """A run's event stream from an API of ksquad's (the embedded one or ksquad-api), until its `end`. A dropped
    connection (the API restarting, its pod replaced) is resumed with Last-Event-ID from the last event seen, so
    nothing is repeated or lost, backing off between tries; a certificate that does not verify, an answer that is not
    an event stream, or RECONNECTS failed tries in a row stop it, saying why."""
    failures, delay, last = 0, 1.0, ""
    while True:
        try:
            extra = await headers() if headers is not None else {}
            async with http.stream(
                "GET",
                url,
                headers={**extra, "Last-Event-ID": str(after)},
                timeout=httpx.Timeout(10.0, read=60.0),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    try:
                        message = response.json().get("error")
                    except (ValueError, AttributeError):
                        message = None
                    if response.status_code < 500:
                        raise CliError(message or f"HTTP {response.status_code} from {where}")
                    last = f"HTTP {response.status_code}"  # restarting, or its dependencies not back yet
                else:
                    kind = response.headers.get("content-type", "")
                    if not kind.startswith("text/event-stream"):
                        raise CliError(
                            f"{where} answered {url} with {kind or 'no content type'}, not an event stream: stopped"
                        )
                    kind, data = "message", ""
                    async for line in response.aiter_lines():
                        if line.startswith("event:"):
                            kind = line.removeprefix("event:").strip()
                        elif line.startswith("data:"):
                            data = line.removeprefix("data:").strip()
                        elif not line and data:
                            payload = json.loads(data)
                            if kind == "end":
                                return
                            after = int(payload.get("seq") or after)
                            failures, delay = 0, 1.0
                            yield payload
                            kind, data = "message", ""
                    last = "the stream ended without its end"
        except (httpx.TransportError, httpx.StreamError) as err:
            if certificate_refused(err):
                raise CliError(
                    f"{where} at {url}: its certificate does not verify ({err}): stopped"
                ) from None
            last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        except (ValueError, TypeError) as err:  # an event that is not JSON, or not an object
            raise CliError(f"{where} sent something that is not an event ({err}): stopped") from None
        failures += 1
        if failures >= RECONNECTS:
            raise CliError(f"{where} did not answer {url} {failures} times in a row (last: {last}): stopped")
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RECONNECT_DELAY)


def certificate_refused(err: BaseException) -> bool:
    """The TLS handshake refused the server's certificate: trying again changes nothing."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class EmbeddedTarget:
    def __init__(self, api: str, token: str) -> None:
        self.where = f"the embedded stack at {api}"
        self.namespace = "default"
        self.http = httpx.AsyncClient(
            base_url=api,
            timeout=httpx.Timeout(60.0, connect=5.0),
            headers={"Authorization": f"Bearer {token}"},
        )

    @classmethod
    def from_state(cls, state_dir: Path, api: str | None, token: str | None = None) -> "EmbeddedTarget":
        """The stack whose state is in `state_dir` (its API from dev.json unless given), with its token
        (`token`, else KSQUAD_API_TOKEN, else the stack's api.token, which only its user can read)."""
        if api is None:
            info = state_dir / "dev.json"
            if not info.is_file():
                raise CliError(
                    f"no embedded stack: {info} is missing. Start one with `ksquad dev` "
                    "(or pass --kubeconfig to use a cluster)"
                )
            api = str(json.loads(info.read_text())["api"])
        token = token or os.environ.get("KSQUAD_API_TOKEN")
        if not token:
            token_file = state_dir / "api.token"
            try:
                token = token_file.read_text().strip()
            except OSError as err:
                raise CliError(
                    f"cannot read the API's token {token_file} ({err.strerror}): run the command as "
                    "the user of `ksquad dev`, or set KSQUAD_API_TOKEN"
                ) from None
        return cls(api, token)

    async def _call(self, method: str, url: str, **kwargs: Any) -> Any:
        try:
            response = await self.http.request(method, url, **kwargs)
        except httpx.TransportError as err:
            raise CliError(
                f"{self.where} does not answer ({type(err).__name__}); is `ksquad dev` running?"
            ) from None
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"error": response.text}
            raise CliError(body.get("error") or f"HTTP {response.status_code}", body.get("problems"))
        return response.json() if response.content else None

    async def apply(self, docs: list[Any]) -> list[dict[str, str]]:
        result: list[dict[str, str]] = (await self._call("POST", "/apply", json={"documents": docs}))[
            "applied"
        ]
        return result

    async def list(self, namespace: str | None) -> list[dict[str, Any]]:
        params = {"namespace": namespace} if namespace else {}
        items: list[dict[str, Any]] = (await self._call("GET", "/runs", params=params))["items"]
        return items

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        run: dict[str, Any] = await self._call("GET", f"/runs/{namespace}/{name}")
        return run

    async def signal(self, namespace: str, name: str, action: RunSignal, reason: str | None) -> None:
        body = {"text": reason or ""} if action == RunSignal.INPUT else {"reason": reason}
        await self._call("POST", f"/runs/{namespace}/{name}/{action}", json=body)

    async def delete(self, namespace: str, name: str) -> None:
        await self._call("DELETE", f"/runs/{namespace}/{name}")

    async def artifact(self, namespace: str, name: str, artifact: str) -> bytes:
        response = await self.http.get(f"/runs/{namespace}/{name}/artifacts/{artifact}")
        if response.status_code >= 400:
            raise CliError(response.json().get("error") or f"HTTP {response.status_code}")
        return response.content

    async def events(self, namespace: str, name: str, after: int) -> AsyncIterator[dict[str, Any]]:
        """The run's events (server-sent), resuming after the last one seen if the connection drops."""
        async for event in server_sent_events(self.http, f"/runs/{namespace}/{name}/events", after):
            yield event

    async def items(
        self, method: str, url: str, body: dict[str, Any] | None = None, what: str = "work items"
    ) -> Any:
        """Work items (api/items.py) and squad memory (api/memory.py), as the developer."""
        return await self._call(method, url, json=body)

    async def usage(self, query: dict[str, str]) -> Any:
        """Model usage summed (api/usage.py)."""
        return await self._call("GET", "/usage", params=query)

    async def close(self) -> None:
        await self.http.aclose()


class ClusterTarget:
    def __init__(self, kubeconfig: str | None, context: str | None = None, api: str | None = None) -> None:
        self.api = api.rstrip("/") if api else None  # the user's own choice (--api, KSQUAD_API)
        self._located: str | None = None
        try:
            self.kube = Kube(Config.load(kubeconfig, context))
        except (FileNotFoundError, ConfigError) as err:
            raise CliError(str(err)) from None
        self.where = f"the cluster at {self.kube.config.server}"
        self.namespace = self.kube.config.namespace

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return await getattr(self.kube, method)(*args, **kwargs)
        except ApiError as err:
            if err.status == 404:
                raise CliError(str(err.message) or "not found") from None
            raise CliError(f"{err.reason}: {err.message}") from None
        except Unreachable as err:
            raise CliError(f"{self.where} does not answer: {err}") from None

    async def apply(self, docs: list[Any]) -> list[dict[str, str]]:
        results = []
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") not in PLURALS:
                raise CliError(f"not a ksquad.io object: {str(doc)[:80]}")
            meta = doc.get("metadata") or {}
            namespace = meta.get("namespace") or self.kube.config.namespace
            url = path(API_VERSION, PLURALS[doc["kind"]], namespace, meta.get("name"))
            body = {**doc, "metadata": {**meta, "namespace": namespace}}
            obj = await self._call("patch", url, body, kind="apply", field_manager="ksquad-cli", force=True)
            action = "created" if obj["metadata"].get("generation") == 1 else "configured"
            results.append(
                {"kind": doc["kind"], "namespace": namespace, "name": meta.get("name"), "action": action}
            )
        return results

    async def list(self, namespace: str | None) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self._call("list", path(API_VERSION, "runs", namespace)))[
            "items"
        ]
        return items

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            run: dict[str, Any] = await self.kube.get(path(API_VERSION, "runs", namespace, name))
        except ApiError as err:
            if err.status == 404:
                raise CliError(f'run "{namespace}/{name}" not found') from None
            raise CliError(f"{err.reason}: {err.message}") from None
        return run

    async def signal(self, namespace: str, name: str, action: RunSignal, reason: str | None) -> None:
        """The bridge forwards these annotations as the workflow's signals."""
        run = await self.get(namespace, name)
        annotations: dict[str, str | None]
        if action == RunSignal.INPUT:
            if why := not_waiting_for_input(run.get("status")):
                raise CliError(f"run {namespace}/{name} is not waiting for input: {why}")
            annotations = {INPUT_ANNOTATION: reason or ""}
        else:
            annotations = {
                RunSignal.CANCEL: {CANCEL_ANNOTATION: reason or "ksquad runs cancel"},
                RunSignal.PAUSE: {PAUSE_ANNOTATION: reason or "ksquad runs pause"},
                RunSignal.RESUME: {PAUSE_ANNOTATION: None},
            }[action]  # type: ignore[assignment]
        await self._call(
            "patch", path(API_VERSION, "runs", namespace, name), {"metadata": {"annotations": annotations}}
        )

    async def delete(self, namespace: str, name: str) -> None:
        await self.get(namespace, name)
        await self._call("delete", path(API_VERSION, "runs", namespace, name))

    async def artifact(self, namespace: str, name: str, artifact: str) -> bytes:
        """The content, from ksquad-api (it lives in the worker's store, which the API server does not serve)."""
        await self.get(namespace, name)
        response = await self.from_api(
            "GET",
            f"/runs/{namespace}/{name}/artifacts/{artifact}",
            "artifact content",
            f"; the Run's status lists its artifacts: ksquad runs artifacts {namespace}/{name}",
        )
        return response.content

    async def items(
        self, method: str, url: str, body: dict[str, Any] | None = None, what: str = "work items"
    ) -> Any:
        """Work items and squad memory (`what`), from ksquad-api as this kubeconfig's user (it asks the API server
        what they may do)."""
        response = await self.from_api(method, url, what, "", json=body)
        return response.json() if response.content else None

    async def usage(self, query: dict[str, str]) -> Any:
        """Model usage, from ksquad-api as this kubeconfig's user (who must be able to list the Runs summed)."""
        return (await self.from_api("GET", "/usage", "model usage", "", params=query)).json()

    async def from_api(self, method: str, url: str, what: str, hint: str, **kwargs: Any) -> httpx.Response:
        """A request to ksquad-api with this kubeconfig's bearer token; its refusals as CliErrors."""
        api = await self.api_url()
        header = await self.kube.config.credentials.authorization()
        if api is None or header is None:
            problems = []
            if api is None:
                problems.append(
                    f"{self.where} does not name it (no ClusterRole {LOCATOR} with {API_URL_ANNOTATION}: set the "
                    "chart's api.url, or pass --api)"
                )
            if header is None:
                problems.append("it takes a bearer token, and this kubeconfig uses client certificates")
            raise CliError(f"ksquad-api serves {what}: " + "; ".join(problems) + hint)
        where = self.api_source()
        async with httpx.AsyncClient(base_url=api, verify=self.kube.config.ssl_context, timeout=60) as http:
            try:
                response = await http.request(method, url, headers={"Authorization": header}, **kwargs)
            except httpx.TransportError as err:
                if certificate_refused(err):
                    raise CliError(f"{where}: its certificate does not verify ({err})") from None
                raise CliError(f"{where} does not answer: {type(err).__name__}: {err}") from None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            listed = body.get("problems") if isinstance(body, dict) else None
            raise CliError(error or f"HTTP {response.status_code} from {where}", listed)
        if not isinstance(body, dict) and response.headers.get("content-type", "").startswith(
            "application/json"
        ):
            raise CliError(f"{where} answered {url} with JSON that is not an object")
        return response

    def api_source(self) -> str:
        """Where the URL came from, for messages."""
        if self.api:
            return f"ksquad-api at {self.api} (--api)"
        return f"ksquad-api at {self._located} (ClusterRole {LOCATOR})"

    async def api_url(self) -> str | None:
        """Where ksquad-api serves: --api / KSQUAD_API (the user's own choice), else the annotation of the ClusterRole
        ksquad-locator (the chart's api.url: only cluster admins write ClusterRoles), else None. A URL found there
        must be HTTPS (or loopback): the user's cluster token goes with every request."""
        if self.api:
            return self.api
        if self._located:
            return self._located
        try:
            found = await self.kube.get(path("rbac.authorization.k8s.io/v1", "clusterroles", None, LOCATOR))
        except ApiError as err:
            if err.status in (403, 404):
                return None
            raise CliError(f"reading ClusterRole {LOCATOR}: {err.reason}: {err.message}") from None
        except Unreachable as err:
            raise CliError(f"{self.where} does not answer: {err}") from None
        url = str(
            ((found.get("metadata") or {}).get("annotations") or {}).get(API_URL_ANNOTATION) or ""
        ).rstrip("/")
        if not url:
            return None
        parts = urlsplit(url)
        if parts.scheme != "https" and parts.hostname not in LOOPBACK_HOSTS:
            raise CliError(
                f"ksquad-api's URL {url} (ClusterRole {LOCATOR}, annotation {API_URL_ANNOTATION}) is not HTTPS: the "
                "CLI sends your cluster credentials only over HTTPS (set the chart's api.tlsSecret and an https "
                "api.url), or pass --api to choose the URL yourself"
            )
        self._located = url
        return url

    async def events(self, namespace: str, name: str, after: int) -> AsyncIterator[dict[str, Any]]:
        """The run's phases and agent progress from ksquad-api, with this kubeconfig's credentials; without an API
        (or with credentials the API cannot check, such as client certificates), its phases from its status."""
        await self.get(namespace, name)
        url = await self.api_url()
        if url is not None and await self.kube.config.credentials.authorization():

            async def authorization() -> dict[str, str]:
                header = await self.kube.config.credentials.authorization()
                return {"Authorization": header} if header else {}

            async with httpx.AsyncClient(base_url=url, verify=self.kube.config.ssl_context) as http:
                async for event in server_sent_events(
                    http, f"/runs/{namespace}/{name}/events", after, authorization, self.api_source()
                ):
                    yield event
            return
        async for event in self.polled_events(namespace, name, after):
            yield event

    async def polled_events(self, namespace: str, name: str, after: int) -> AsyncIterator[dict[str, Any]]:
        """Phase changes, read from the Run's status once a second (no agent progress: that is ksquad-api's)."""
        seen = after
        while True:
            run = await self.get(namespace, name)
            status = run.get("status") or {}
            revision = int(status.get("revision") or 0)
            if revision > seen and status.get("phase"):
                seen = revision
                reason, message = status.get("reason"), status.get("message")
                yield {
                    "seq": revision,
                    "kind": "phase",
                    "message": f"{status['phase']}"
                    + (f" ({reason})" if reason else "")
                    + (f": {message}" if message else ""),
                    "data": {
                        "phase": status["phase"],
                        "reason": reason,
                        "message": message,
                        "resumeAt": status.get("resumeAt"),
                        "attempt": status.get("attempt"),
                    },
                }
            if Phase(status.get("phase") or "Pending").terminal:
                return
            await asyncio.sleep(1.0)

    async def close(self) -> None:
        await self.kube.close()
