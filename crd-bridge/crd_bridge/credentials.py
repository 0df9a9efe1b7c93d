"""Credential rotation: when a Secret labelled `ksquad.io/credential` changes, the runs paused because that
credential was refused get `credential_refreshed` (the workflow ignores it if it uses another credential).

Only the Secrets' metadata is read (PartialObjectMetadata): the bridge never sees a credential's value."""

import asyncio
import logging
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from crd_bridge.resolve import CREDENTIAL_LABEL
from kube import ApiError, Kube, Unreachable, path
from workflows import search_attributes as sa
from workflows.signals import RunSignal

log = logging.getLogger(__name__)


class CredentialWatcher:
    def __init__(self, kube: Kube, temporal: Client, namespaces: list[str]) -> None:
        self.kube = kube
        self.temporal = temporal
        # Empty: every namespace (needs a ClusterRole; the chart grants per namespace).
        self.namespaces = namespaces
        self.versions: dict[str, str] = {}  # secret -> the resourceVersion last seen
        self.signalled = 0

    async def run(self) -> None:
        urls = [path("v1", "secrets", ns) for ns in self.namespaces] or [path("v1", "secrets")]
        await asyncio.gather(*(self._watch(url) for url in urls))

    async def _watch(self, url: str) -> None:
        while True:
            try:
                listed = await self.kube.list(url, labels=CREDENTIAL_LABEL, metadata_only=True)
                for secret in listed.get("items") or []:
                    self.versions[_key(secret)] = secret["metadata"]["resourceVersion"]
                version: str | None = listed["metadata"]["resourceVersion"]
                while version is not None:
                    version = await self._follow(url, version)
            except (Unreachable, ApiError) as err:
                log.warning("watching credentials: %s", err)
                await asyncio.sleep(2)

    async def _follow(self, url: str, version: str) -> str | None:
        async for event in self.kube.watch(
            url, resource_version=version, labels=CREDENTIAL_LABEL, metadata_only=True
        ):
            kind, secret = event["type"], event["object"]
            if kind == "ERROR":
                return None
            version = secret["metadata"]["resourceVersion"]
            if kind in ("ADDED", "MODIFIED"):
                key = _key(secret)
                if self.versions.get(key) != version:  # a new or changed credential
                    await self.refreshed(secret["metadata"]["namespace"], secret["metadata"]["name"])
                self.versions[key] = version
        return version

    async def refreshed(self, namespace: str, secret: str) -> None:
        # Every open run of the namespace, not only Paused ones: visibility lags behind a run that has just
        # paused, and a run about to pause counts the rotation too. Runs on other credentials ignore it.
        query = f"{sa.NAMESPACE.name} = '{namespace}' AND ExecutionStatus = 'Running' AND WorkflowType = 'RunWorkflow'"
        async for workflow in self.temporal.list_workflows(query):
            try:
                handle = self.temporal.get_workflow_handle(workflow.id)
                await handle.signal(RunSignal.CREDENTIAL_REFRESHED, f"{namespace}/{secret}")
                self.signalled += 1
            except RPCError as err:
                log.warning("credential_refreshed to %s: %s", workflow.id, err)
        log.info("credential %s/%s refreshed", namespace, secret)


def _key(secret: dict[str, Any]) -> str:
    return f"{secret['metadata']['namespace']}/{secret['metadata']['name']}"
