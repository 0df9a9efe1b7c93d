"""The console on the embedded stack: the developer (the holder of the API's token, signed in with the link
`ksquad dev` prints) may read and do everything, as themselves; Runs are created as `ksquad run` creates them."""

import hashlib
import json
from urllib.parse import quote

from api.console.backend import Obj, Refused, Viewer
from dev.embedded import EmbeddedRuns, RunRefuses, UnknownRun
from store import Author, Store
from workflows.model import InvalidObject
from workflows.signals import RunSignal

KINDS = {"agents": "Agent", "teams": "Team", "projects": "Project"}


class EmbeddedConsole:
    def __init__(
        self, runs: EmbeddedRuns, store: Store, ui_prefix: str | None, temporal_namespace: str
    ) -> None:
        self.embedded = runs
        self.store = store
        self.viewer = Viewer(runs.user, "the developer, with the API's token")
        self.ui_prefix = ui_prefix
        self.temporal_namespace = temporal_namespace

    async def namespaces(self) -> list[str]:
        seen = {
            o.namespace
            for kind in ("Run", "Agent", "Team")
            for o in await self.embedded.objects.of_kind(kind)
        }
        return sorted(seen | {"default"})

    async def runs(self, namespace: str | None) -> list[Obj]:
        return [r.manifest() for r in await self.embedded.objects.of_kind("Run", namespace)]

    async def runs_version(self, namespace: str | None) -> str:
        """A digest of the Runs as the table shows them: one developer's tabs, on the embedded store."""
        runs = [
            (r.uid, r.generation, r.status) for r in await self.embedded.objects.of_kind("Run", namespace)
        ]
        return hashlib.sha256(json.dumps(runs, sort_keys=True, default=str).encode()).hexdigest()

    async def run(self, namespace: str, name: str) -> Obj:
        try:
            return (await self.embedded.get(namespace, name)).manifest()
        except UnknownRun as err:
            raise Refused(404, str(err)) from None

    async def objects(self, plural: str, namespace: str) -> list[Obj]:
        return [o.manifest() for o in await self.embedded.objects.of_kind(KINDS[plural], namespace)]

    async def create_run(self, manifest: Obj) -> Obj:
        meta = manifest["metadata"]
        if await self.embedded.objects.get("Run", meta["namespace"], meta["name"]) is not None:
            raise Refused(
                409, f"a Run {meta['namespace']}/{meta['name']} exists already: name this one otherwise"
            )
        try:
            await self.embedded.apply([manifest])
        except InvalidObject as err:
            raise Refused(422, str(err), err.problems) from None
        return await self.run(meta["namespace"], meta["name"])

    async def signal(self, namespace: str, name: str, action: RunSignal, text: str) -> None:
        args: tuple[str, ...] = (
            ()
            if action == RunSignal.RESUME
            else (text,)
            if action == RunSignal.INPUT
            else (text or f"the console: {action}",)
        )
        try:
            await self.embedded.signal(namespace, name, action, *args)
        except UnknownRun as err:
            raise Refused(404, str(err)) from None
        except RunRefuses as err:
            raise Refused(409, str(err)) from None

    async def may(self, verb: str, resource: str, namespace: str, name: str = "") -> str | None:
        return None  # the API's token holder is the developer: everything is theirs

    def author(self) -> Author:
        return Author(user=self.embedded.user)

    def temporal_url(self, workflow_id: str) -> str | None:
        if self.ui_prefix is None:
            return None
        return (
            f"{self.ui_prefix}/namespaces/{self.temporal_namespace}/workflows/{quote(workflow_id, safe='')}"
        )
