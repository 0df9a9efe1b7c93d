"""The console on a cluster: a person's reads and actions go to the API server with their own bearer token
(`Kube.acting_as`), so it filters and authorises them as that person, never as ksquad-api's ServiceAccount. What
lives in the store instead (a run's events and artifacts, work items, usage) is read only after the API server
says the person may (a SubjectAccessReview: `get` the Run; `get`, `list` or `update` workitems).

Who the person is comes from their token: sent by an authenticating proxy in front of ksquad-api
(`Authorization: Bearer`, as oauth2-proxy or Pinniped send it), or pasted once on the sign-in page and kept in a
cookie sealed with the console's key (AES-GCM; HttpOnly, SameSite=Strict, Secure over HTTPS; 12 hours)."""

import asyncio
import base64
import binascii
import hashlib
import json
import os
import time
from collections.abc import Awaitable
from typing import TypeVar
from urllib.parse import quote

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from api.console.backend import Obj, Refused, Viewer
from api.kubernetes_auth import Access, KubernetesAuth, User
from crd_bridge.resources import CANCEL_ANNOTATION, INPUT_ANNOTATION, PAUSE_ANNOTATION
from kube import ApiError, Kube, Unreachable, path, reflect
from store import Author, Store
from workflows.signals import RunSignal

RUN_API = "ksquad.io/v1alpha1"
T = TypeVar("T")
SESSION_SECONDS = 12 * 3600
# The Runs one console request reads at most, a page at a time: a person's poll costs the API server a bounded
# list however many Runs the cluster holds (the console says when there are more: choose a namespace).
MAX_RUNS_READ = 2000
RUNS_PAGE = 500
SEAL_CONTEXT = b"ksquad-console-session-v1"
WATCH_IDLE_SECONDS = 60.0  # a namespace's watch stops this long after no console asked about it


class RunChanges:
    """What tells console tabs that their runs table changed, instead of each tab listing Runs every few seconds:
    one watch of each served namespace's Runs, as ksquad-api (metadata only: names and versions), shared by every
    person's tabs. Each change counts; a tab whose count moved fetches its table again, as the person. A
    namespace's watch starts when a tab first asks about it (its first list counts too: what changed between the
    tab's own list and the watch's start is then read) and stops when none has asked for WATCH_IDLE_SECONDS."""

    def __init__(self, kube: Kube, namespaces: list[str]) -> None:
        self.kube = kube
        self.served = frozenset(namespaces)
        self.counts: dict[str, int] = {}
        self._asked: dict[str, float] = {}
        self._watching: dict[str, asyncio.Task[None]] = {}

    def count(self, namespace: str) -> int:
        """Changes seen in the namespace's Runs since its watch started (a failed watch counts too: its tabs
        read again). 0, never moving, for a namespace ksquad does not serve (it holds no Runs)."""
        if namespace not in self.served:
            return 0
        loop = asyncio.get_running_loop()
        self._asked[namespace] = loop.time()
        task = self._watching.get(namespace)
        if task is None or task.done():
            self._bump(namespace)
            self._watching[namespace] = loop.create_task(self._watch(namespace))
        return self.counts[namespace]

    def _bump(self, namespace: str) -> None:
        self.counts[namespace] = self.counts.get(namespace, 0) + 1

    async def _watch(self, namespace: str) -> None:
        def bump(*_: object) -> None:
            self._bump(namespace)

        def nothing(_: Obj) -> bool:
            return False  # the list's objects are not kept: a change is all a tab needs to know

        following = asyncio.create_task(
            reflect(
                self.kube,
                path(RUN_API, "runs", namespace),
                bump,
                bump,
                bump,
                keep=nothing,
                metadata_only=True,
            )
        )
        loop = asyncio.get_running_loop()
        try:
            while True:  # looked at again when it may have gone idle
                idle = loop.time() - self._asked[namespace]
                if idle >= WATCH_IDLE_SECONDS:
                    break
                await asyncio.sleep(WATCH_IDLE_SECONDS - idle)
        finally:
            following.cancel()


class SessionSeal:
    """The token sign-in's cookie: the person's token, sealed with the console's key and dated."""

    def __init__(self, key: bytes) -> None:
        self.aead = AESGCM(hashlib.sha256(b"ksquad-console-cookie:" + key).digest())

    def seal(self, token: str, now: float | None = None) -> str:
        nonce = os.urandom(12)
        body = json.dumps({"token": token, "until": int((now or time.time()) + SESSION_SECONDS)}).encode()
        return base64.urlsafe_b64encode(nonce + self.aead.encrypt(nonce, body, SEAL_CONTEXT)).decode()

    def open(self, cookie: str, now: float | None = None) -> str | None:
        """The token in a cookie this console sealed and that has not expired; None for anything else."""
        try:
            raw = base64.urlsafe_b64decode(cookie.encode())
            body = json.loads(self.aead.decrypt(raw[:12], raw[12:], SEAL_CONTEXT))
        except (ValueError, InvalidTag, binascii.Error):
            return None
        if not isinstance(body, dict) or int(body.get("until", 0)) < (now or time.time()):
            return None
        token = body.get("token")
        return token if isinstance(token, str) and token else None


class ClusterConsole:
    def __init__(
        self,
        kube: Kube,
        auth: KubernetesAuth,
        user: User,
        store: Store,
        namespaces: list[str],
        temporal_ui: str | None,
        temporal_namespace: str,
        how: str,
        changes: RunChanges,
    ) -> None:
        self.kube = kube  # acting as the person
        self.auth = auth
        self.user = user
        self.store = store
        self.viewer = Viewer(user.name, how)
        self._namespaces = namespaces
        self.temporal_ui = temporal_ui.rstrip("/") if temporal_ui else None
        self.temporal_namespace = temporal_namespace
        self.changes = changes  # ksquad-api's, shared by every person

    async def _call(self, what: str, call: Awaitable[T]) -> T:
        try:
            result = await call
        except ApiError as err:
            raise Refused(err.status, f"{what}: {err.message}") from None
        except Unreachable as err:
            raise Refused(503, f"{what}: the Kubernetes API server does not answer: {err}") from None
        return result

    async def namespaces(self) -> list[str]:
        return list(self._namespaces)

    async def _pages(self, url: str, most: int) -> list[Obj]:
        """Up to `most` objects of a list, read a page at a time (a namespace of 10,000 Runs is not one answer)."""
        found: list[Obj] = []
        token: str | None = None
        while len(found) < most:
            page = await self.kube.list(url, limit=min(RUNS_PAGE, most - len(found)), continue_token=token)
            found += page.get("items") or []
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                break
        return found

    async def runs(self, namespace: str | None) -> list[Obj]:
        if namespace:
            return await self._call(
                f"listing Runs in {namespace}", self._pages(path(RUN_API, "runs", namespace), MAX_RUNS_READ)
            )
        try:
            return await self._pages(path(RUN_API, "runs"), MAX_RUNS_READ)
        except ApiError as err:
            if err.status != 403:
                raise Refused(err.status, f"listing Runs: {err.message}") from None
        # Not cluster-wide: the namespaces ksquad serves, each as far as the person may read it.
        runs: list[Obj] = []
        for ns in self._namespaces:
            try:
                runs += await self._pages(path(RUN_API, "runs", ns), MAX_RUNS_READ - len(runs))
            except ApiError as err:
                if err.status != 403:
                    raise Refused(err.status, f"listing Runs in {ns}: {err.message}") from None
            if len(runs) >= MAX_RUNS_READ:
                break
        return runs

    async def runs_version(self, namespace: str | None) -> str:
        """Moves when a Run of the namespace (of every served one the person may list, when None) changes: the
        shared watch's counts (no API server call), once RBAC says the person may list them (asked as a
        SubjectAccessReview, cached for a few seconds: a person whose rights go is told within that)."""
        if namespace:
            why = await self.may("list", "runs", namespace)
            if why:
                raise Refused(403, why)
            return str(self.changes.count(namespace))
        counts = [
            f"{ns}:{self.changes.count(ns)}"
            for ns in self._namespaces
            if await self.may("list", "runs", ns) is None
        ]
        return ",".join(counts)

    async def run(self, namespace: str, name: str) -> Obj:
        return await self._call(
            f"run {namespace}/{name}", self.kube.get(path(RUN_API, "runs", namespace, name))
        )

    async def objects(self, plural: str, namespace: str) -> list[Obj]:
        try:
            return list((await self.kube.list(path(RUN_API, plural, namespace))).get("items") or [])
        except ApiError as err:
            if err.status == 403:
                return []  # the form says what the person may not start
            raise Refused(err.status, f"listing {plural} in {namespace}: {err.message}") from None

    async def create_run(self, manifest: Obj) -> Obj:
        meta = manifest["metadata"]
        return await self._call(
            f"creating Run {meta['namespace']}/{meta['name']}",
            self.kube.create(path(RUN_API, "runs", meta["namespace"]), manifest),
        )

    async def signal(self, namespace: str, name: str, action: RunSignal, text: str) -> None:
        """The bridge forwards these annotations as the workflow's signals (as `ksquad runs` does)."""
        by_action: dict[RunSignal, dict[str, str | None]] = {
            RunSignal.CANCEL: {CANCEL_ANNOTATION: text or "the console: cancel"},
            RunSignal.PAUSE: {PAUSE_ANNOTATION: text or "the console: pause"},
            RunSignal.RESUME: {PAUSE_ANNOTATION: None},
            RunSignal.INPUT: {INPUT_ANNOTATION: text},
        }
        annotations = by_action[action]
        await self._call(
            f"{action} {namespace}/{name}",
            self.kube.patch(
                path(RUN_API, "runs", namespace, name), {"metadata": {"annotations": annotations}}
            ),
        )

    async def may(self, verb: str, resource: str, namespace: str, name: str = "") -> str | None:
        plural, _, subresource = resource.partition("/")  # teams/memory: a subresource, as RBAC names it
        access = Access(verb, plural, namespace=namespace, name=name, subresource=subresource)
        try:
            if await self.auth.allowed(self.user, access):
                return None
        except (PermissionError, ApiError, Unreachable) as err:
            return f"the API server could not say whether {self.user.name} may {verb} {resource}: {err}"
        target = f" {name}" if name else ""
        return f"{self.user.name} may not {verb} {resource}.ksquad.io{target} in namespace {namespace}"

    def author(self) -> Author:
        return Author(user=self.user.name)

    def temporal_url(self, workflow_id: str) -> str | None:
        if not self.temporal_ui:
            return None
        return (
            f"{self.temporal_ui}/namespaces/{self.temporal_namespace}/workflows/{quote(workflow_id, safe='')}"
        )
