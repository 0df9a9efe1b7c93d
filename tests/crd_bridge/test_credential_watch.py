"""The bridge's credential watch (crd_bridge.credentials.CredentialWatcher) on the real API server: it reads a
Secret's metadata, never its value, announces a rotation once, and announces one that happened while its watch was
broken (a 410 Gone, as the server sends after compacting the versions the watch was at) when it lists again. That
the announcement reaches the runs paused on the credential: tests/crd_bridge/test_bridge_e2e.py."""

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from crd_bridge.credentials import CredentialWatcher
from crd_bridge.resolve import CREDENTIAL_LABEL
from kube import Config, Kube
from testbed.controlplane import ControlPlane

VALUE = "sk-the-teams-model-key"


class Recording(Kube):
    """The real client, keeping every object the watcher was given; `break_first_watch` makes the first watch
    end at once with the server's 410 Gone, after `meanwhile` ran (what happens while no watch is open)."""

    def __init__(self, config: Config, break_first_watch: bool = False) -> None:
        super().__init__(config)
        self.given: list[dict[str, Any]] = []
        self.lists = self.watches = 0
        self.break_first_watch = break_first_watch
        self.meanwhile: Callable[[], None] = lambda: None

    async def list(self, url: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.lists += 1
        listed = await super().list(url, *args, **kwargs)
        self.given += listed.get("items") or []
        return listed

    async def watch(self, url: str, *args: Any, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        self.watches += 1
        if self.break_first_watch and self.watches == 1:
            await asyncio.to_thread(self.meanwhile)
            yield {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
            return
        async for event in super().watch(url, *args, **kwargs):
            self.given.append(event["object"])
            yield event


class Announced(CredentialWatcher):
    """The watcher itself; what it would signal to the runs (Temporal) is recorded instead."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        super().__init__(kube, temporal=None, namespaces=[namespace])  # type: ignore[arg-type]
        self.announced: list[tuple[str, str]] = []

    async def refreshed(self, namespace: str, secret: str) -> None:
        self.announced.append((namespace, secret))


async def until(check: Any, timeout: float = 20) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


@pytest.fixture
def credential(cluster: ControlPlane, namespace: str) -> str:
    cluster.kubectl(
        "create", "secret", "generic", "model-key", "-n", namespace, f"--from-literal=apiKey={VALUE}"
    )
    cluster.kubectl("label", "secret", "model-key", "-n", namespace, f"{CREDENTIAL_LABEL}=true")
    return "model-key"


def rotate(cluster: ControlPlane, namespace: str, secret: str, value: str) -> None:
    cluster.kubectl(
        "patch", "secret", secret, "-n", namespace, "-p", f'{{"stringData": {{"apiKey": "{value}"}}}}'
    )


async def test_the_watch_reads_metadata_only_and_announces_a_rotation_once(
    cluster: ControlPlane, namespace: str, credential: str
) -> None:
    kube = Recording(Config.from_kubeconfig(cluster.admin_kubeconfig))
    async with kube:
        watcher = Announced(kube, namespace)
        running = asyncio.create_task(watcher.run())
        try:
            await until(lambda: kube.watches >= 1)
            assert watcher.announced == [], "a credential there before the bridge is no rotation"
            rotate(cluster, namespace, credential, "sk-rotated")
            await until(lambda: watcher.announced)
            cluster.kubectl(
                "create", "secret", "generic", "other", "-n", namespace, "--from-literal=apiKey=sk-x"
            )
            await asyncio.sleep(2)  # an unlabelled Secret: not a credential, nothing to announce
        finally:
            running.cancel()
    assert watcher.announced == [(namespace, credential)]
    assert kube.given, "the watcher was given nothing"
    for secret in kube.given:
        assert secret["kind"] == "PartialObjectMetadata", secret
        assert "data" not in secret and "sk-" not in str(secret), "the watcher was given the Secret's value"
        assert secret["metadata"]["name"] == credential


async def test_a_rotation_while_the_watch_was_broken_is_announced_when_it_lists_again(
    cluster: ControlPlane, namespace: str, credential: str
) -> None:
    kube = Recording(Config.from_kubeconfig(cluster.admin_kubeconfig), break_first_watch=True)
    async with kube:
        kube.meanwhile = lambda: rotate(cluster, namespace, credential, "sk-rotated-meanwhile")
        watcher = Announced(kube, namespace)
        running = asyncio.create_task(watcher.run())
        try:
            await until(lambda: kube.watches >= 2)  # the 410, a list again, a new watch
            await until(lambda: watcher.announced)
            await asyncio.sleep(1)
        finally:
            running.cancel()
    assert kube.lists == 2
    assert watcher.announced == [(namespace, credential)], (
        "announced once, after the list that followed the 410"
    )
