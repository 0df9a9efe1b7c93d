"""Credential rotation: when a Secret labelled `ksquad.io/credential` changes, the runs paused because that
credential was refused get `credential_refreshed` (the workflow ignores it if it uses another credential).

Only the Secrets' metadata is read (PartialObjectMetadata): the bridge never sees a credential's value."""

import asyncio
import logging
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError

from crd_bridge.resolve import CREDENTIAL_LABEL
from kube import Kube, path, reflect
from workflows import search_attributes as sa
from workflows.signals import RunSignal

log = logging.getLogger(__name__)


class CredentialWatcher:
    def __init__(self, kube: Kube, temporal: Client, namespaces: list[str]) -> None:
        self.kube = kube
        self.temporal = temporal
        # Empty: every namespace (needs a ClusterRole; the chart grants per namespace).
        self.namespaces = namespaces
        self.versions: dict[str, str] = {}  # namespace/secret -> the resourceVersion last seen
        self.rotated: asyncio.Queue[str] = asyncio.Queue()  # namespace/secret, in the order seen
        self.signalled = 0

    async def run(self) -> None:
        urls = [path("v1", "secrets", ns) for ns in self.namespaces] or [path("v1", "secrets")]
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._signal_rotations())
            for url in urls:
                tasks.create_task(self._watch(url))

    async def _watch(self, url: str) -> None:
        lists = 0

        def listed(secrets: list[dict[str, Any]]) -> None:
            # The first list is what was there before the bridge: nothing to announce. A later one follows a
            # watch that broke (410 Gone, an outage): a Secret new or changed since is a rotation the watch missed.
            nonlocal lists
            lists += 1
            for secret in secrets:
                self._saw(secret, announce=lists > 1)

        def changed(kind: str, secret: dict[str, Any]) -> None:
            if kind == "DELETED":
                self.versions.pop(_key(secret), None)
            else:
                self._saw(secret, announce=True)

        await reflect(self.kube, url, listed, changed, labels=CREDENTIAL_LABEL, metadata_only=True)

    def _saw(self, secret: dict[str, Any], announce: bool) -> None:
        key, version = _key(secret), secret["metadata"]["resourceVersion"]
        if announce and self.versions.get(key) != version:  # a new or changed credential
            self.rotated.put_nowait(key)
        self.versions[key] = version

    async def _signal_rotations(self) -> None:
        while True:
            namespace, secret = (await self.rotated.get()).split("/", 1)
            try:
                await self.refreshed(namespace, secret)
            except RPCError as err:  # Temporal unreachable: the runs' pausedSeconds still bounds their wait
                log.warning(
                    "credential %s/%s refreshed, but its runs could not be listed: %s", namespace, secret, err
                )

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
