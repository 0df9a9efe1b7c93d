"""The bridge's credential watch (crd_bridge.credentials) sees a Secret's metadata, never its value: the watch
asks for PartialObjectMetadata as the list does, on the real API server."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from crd_bridge.resolve import CREDENTIAL_LABEL
from kube import Config, Kube, path
from testbed.controlplane import ControlPlane

VALUE = "sk-the-teams-model-key"


@pytest.fixture
async def admin(cluster: ControlPlane) -> AsyncIterator[Kube]:
    async with Kube(Config.from_kubeconfig(cluster.admin_kubeconfig)) as kube:
        yield kube


async def test_the_credential_watch_streams_metadata_not_values(
    cluster: ControlPlane, namespace: str, admin: Kube
) -> None:
    url = path("v1", "secrets", namespace)
    listed = await admin.list(url, labels=CREDENTIAL_LABEL, metadata_only=True)
    events: list[dict[str, object]] = []

    async def watch() -> None:
        async for event in admin.watch(
            url,
            resource_version=listed["metadata"]["resourceVersion"],
            labels=CREDENTIAL_LABEL,
            timeout_seconds=20,
            metadata_only=True,
        ):
            if event["type"] != "BOOKMARK":
                events.append(event)
            if len(events) == 2:
                return

    watching = asyncio.create_task(watch())
    cluster.kubectl(
        "create", "secret", "generic", "model-key", "-n", namespace, f"--from-literal=apiKey={VALUE}"
    )
    cluster.kubectl("label", "secret", "model-key", "-n", namespace, f"{CREDENTIAL_LABEL}=true")
    cluster.kubectl(  # a rotation: the event the watch exists for
        "patch", "secret", "model-key", "-n", namespace, "-p", '{"stringData": {"apiKey": "sk-rotated"}}'
    )
    await asyncio.wait_for(watching, 30)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    for event in events:
        secret = event["object"]
        assert isinstance(secret, dict)
        assert secret["kind"] == "PartialObjectMetadata", secret
        assert "data" not in secret and "sk-" not in str(secret), "the watch carried the Secret's value"
        assert secret["metadata"]["name"] == "model-key"
