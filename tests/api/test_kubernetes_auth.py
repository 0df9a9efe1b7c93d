"""ksquad-api's reviews on the real API server: a decision is cached for everything the SubjectAccessReview was
asked about the user, uid and extra included, so two credentials of one name and groups (a service account's
tokens, an impersonated user) are never answered from each other's decision."""

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from api.kubernetes_auth import Access, KubernetesAuth
from kube import Config, Kube
from testbed.controlplane import ControlPlane


class CountingKube(Kube):
    """The admin's client, counting the reviews it sends."""

    reviews = 0

    async def create(
        self, url: str, body: dict[str, Any], field_manager: str = "ksquad", dry_run: bool = False
    ) -> dict[str, Any]:
        if body.get("kind") == "SubjectAccessReview":
            self.reviews += 1
        return await super().create(url, body, field_manager, dry_run)


@pytest.fixture
async def kube(cluster: ControlPlane) -> AsyncIterator[CountingKube]:
    client = CountingKube(Config.from_kubeconfig(cluster.admin_kubeconfig))
    try:
        yield client
    finally:
        await client.close()


async def test_a_decision_is_cached_per_user_uid_and_extra(
    cluster: ControlPlane, namespace: str, kube: CountingKube
) -> None:
    account = f"caller-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    tokens = [cluster.kubectl("create", "token", account, "-n", namespace).stdout.strip() for _ in range(2)]
    auth = KubernetesAuth(kube)
    first, second = [await auth.user(t) for t in tokens]
    assert first is not None and second is not None
    assert (first.name, first.uid, first.groups) == (second.name, second.uid, second.groups)
    assert first.extra != second.extra, "each token has its own credential id: the precondition"
    access = Access("get", "runs", namespace=namespace, name="r")
    assert [await auth.allowed(u, access) for u in (first, second, first)] == [False, False, False]
    assert kube.reviews == 2, "one review per credential; the third call was answered from the cache"


async def test_one_token_brought_by_many_requests_at_once_is_reviewed_once(
    cluster: ControlPlane, namespace: str, kube: CountingKube
) -> None:
    """A page's parallel requests wait for one TokenReview; the request that asked it going away mid-review
    does not fail the others (one of them reviews it instead)."""
    account = f"caller-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    token = cluster.kubectl("create", "token", account, "-n", namespace).stdout.strip()
    auth = KubernetesAuth(kube)
    users = await asyncio.gather(*(auth.user(token) for _ in range(40)))
    assert auth.reviews == 1 and len({u.name if u else None for u in users}) == 1
    assert users[0] is not None and users[0].name.endswith(f":{account}")

    other = cluster.kubectl("create", "token", account, "-n", namespace).stdout.strip()
    first = asyncio.create_task(auth.user(other))
    await asyncio.sleep(0)  # its review under way
    assert auth.knows(other), "a token under review is known: asking again costs no review"
    waiting = [asyncio.create_task(auth.user(other)) for _ in range(5)]
    await asyncio.sleep(0)
    first.cancel()
    answers = await asyncio.gather(*waiting)
    assert all(a is not None and a.name == users[0].name for a in answers)
    assert auth.reviews == 3, "the cancelled review, then one for the five that waited"
