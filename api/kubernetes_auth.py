"""Who a caller is and what they may do, asked of the Kubernetes API server: a TokenReview of the caller's
bearer token (a service account's, an OIDC id token the API server trusts, an exec plugin's), then a
SubjectAccessReview of the caller for what the request touches. So the RBAC that says who can `get` a Run says
who can read its events and artifacts, and nothing of ksquad's keeps its own list of users.

Answers are cached for a few seconds per token (a stream of requests from one UI page asks once)."""

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter

from kube import ApiError, Kube, path

CACHE_SECONDS = 10.0
CACHE_ENTRIES = 4096
TOKEN_REVIEWS = Counter(
    "ksquad_api_token_reviews", "TokenReviews asked of the API server, by outcome", ["outcome"]
)
ACCEPTED_SECONDS = 900.0


@dataclass(frozen=True)
class User:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Access:
    """What is asked: a verb on a resource, the way `kubectl auth can-i` asks it."""

    verb: str
    resource: str
    group: str = "ksquad.io"
    namespace: str = ""  # "": cluster-wide
    name: str = ""
    subresource: str = ""


class KubernetesAuth:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._users: dict[str, tuple[float, User | None]] = {}
        self._decisions: dict[tuple[Any, ...], tuple[float, bool]] = {}
        self._accepted: dict[str, float] = {}  # token hash -> when the API server last accepted it
        self._reviewing: dict[str, asyncio.Future[User | None]] = {}  # token hash -> its review under way
        self.reviews = 0  # TokenReviews asked of the API server

    def knows(self, token: str) -> bool:
        """Whether the token is known: its review remembered (asking `user` costs the API server nothing), or the
        API server accepted it within ACCEPTED_SECONDS (a person signed in before a flood of made-up tokens is
        reviewed again as usual, never held back with them)."""
        key = _token_key(token)
        cached = self._users.get(key)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return True
        if key in self._reviewing:
            return True  # asking waits for that review: no other
        accepted = self._accepted.get(key)
        return accepted is not None and time.monotonic() - accepted < ACCEPTED_SECONDS

    async def user(self, token: str) -> User | None:
        """The token's user, or None when the API server does not accept the token. Requests that bring the same
        token at once wait for one review (a page's parallel requests, a CLI's streams)."""
        key = _token_key(token)
        cached = self._users.get(key)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        while (under_way := self._reviewing.get(key)) is not None:
            await asyncio.wait({under_way})  # raises only when this request is cancelled itself
            if not under_way.cancelled():  # (that one's request went away mid-review: review it here)
                return under_way.result()
        review: asyncio.Future[User | None] = asyncio.get_running_loop().create_future()
        review.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, awaited or not
        self._reviewing[key] = review
        try:
            found = await self._review(key, token)
        except asyncio.CancelledError:
            review.cancel()
            raise
        except Exception as err:
            review.set_exception(err)
            raise
        else:
            review.set_result(found)
            return found
        finally:
            del self._reviewing[key]

    async def _review(self, key: str, token: str) -> User | None:
        self.reviews += 1
        review = await self.kube.create(
            path("authentication.k8s.io/v1", "tokenreviews"),
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status = review.get("status") or {}
        found: User | None = None
        if status.get("authenticated"):
            info = status.get("user") or {}
            found = User(
                name=info.get("username", ""),
                uid=info.get("uid", ""),
                groups=tuple(info.get("groups") or ()),
                extra={k: list(v) for k, v in (info.get("extra") or {}).items()},
            )
        self._remember(self._users, key, found)
        TOKEN_REVIEWS.labels("accepted" if found is not None else "refused").inc()
        if found is not None:
            self._accepted.pop(key, None)
            self._accepted[key] = time.monotonic()
            while len(self._accepted) > CACHE_ENTRIES:
                del self._accepted[next(iter(self._accepted))]
        return found

    async def allowed(self, user: User, access: Access) -> bool:
        # Everything the review is asked about the user: two users alike in name and groups but not in uid or
        # extra (an impersonated one, a scoped token's) may be allowed different things.
        extra = tuple(sorted((k, tuple(v)) for k, v in user.extra.items()))
        key = (user.name, user.uid, user.groups, extra, access)
        cached = self._decisions.get(key)
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        attributes: dict[str, Any] = {
            "verb": access.verb,
            "group": access.group,
            "resource": access.resource,
            "namespace": access.namespace,
            "name": access.name,
            "subresource": access.subresource,
        }
        try:
            review = await self.kube.create(
                path("authorization.k8s.io/v1", "subjectaccessreviews"),
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SubjectAccessReview",
                    "spec": {
                        "user": user.name,
                        "uid": user.uid,
                        "groups": list(user.groups),
                        "extra": user.extra,
                        "resourceAttributes": {k: v for k, v in attributes.items() if v},
                    },
                },
            )
        except ApiError as err:
            raise PermissionError(
                f"cannot ask the API server who may {access.verb} {access.resource}: {err}"
            ) from err
        allowed = bool((review.get("status") or {}).get("allowed"))
        self._remember(self._decisions, key, allowed)
        return allowed

    @staticmethod
    def _remember(cache: dict[Any, tuple[float, Any]], key: Any, value: Any) -> None:
        if len(cache) >= CACHE_ENTRIES:
            now = time.monotonic()
            for stale in [k for k, (at, _) in cache.items() if now - at >= CACHE_SECONDS]:
                del cache[stale]
            while len(cache) >= CACHE_ENTRIES:
                del cache[next(iter(cache))]
        cache[key] = (time.monotonic(), value)


def _token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()  # the token itself is never kept
