"""Who calls ksquad-api on a cluster, what they may do and how much they may ask: a caller is a Kubernetes user by
their bearer token (a TokenReview, api/kubernetes_auth.py), each access a SubjectAccessReview; the tokens the API
server refuses and each caller's requests a second are bounded (api/budgets.py). Also here: the checks of the
routes ksquad-api shares with the embedded API (work items, squad memory, usage), and `counted`, which counts
every answer by route and status (ksquad_api_requests) and holds each 429 back before it is sent."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import Counter
from starlette.requests import Request
from starlette.responses import Response

from api.budgets import OverBudget, Rate, RateLimits, RequestLimits, Tarpit
from api.errors import error, too_many
from api.items import Writer
from api.kubernetes_auth import Access, KubernetesAuth, User
from kube import ApiError, Unreachable
from store import Author

REQUESTS = Counter("ksquad_api_requests", "requests to ksquad-api, by route and status", ["route", "code"])
# Every 429 is held back a second before it is sent (at most 256 at once): see api.budgets.Tarpit.
TARPIT = Tarpit(seconds=1.0, most=256)


@dataclass
class Caller:
    """Who sent a request: a Kubernetes user (by bearer token), or the holder of the shared codec token."""

    user: User | None = None
    codec_token: bool = False
    refusal: Response | None = field(default=None, repr=False)


def bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class Callers:
    """The callers of one ksquad-api: who each is (`kubernetes_user`), whether they may (`may`), and whether they
    have sent their share (`over_rate`)."""

    def __init__(self, auth: KubernetesAuth, refused: RateLimits, requests: RequestLimits) -> None:
        self.auth = auth
        self.refused_tokens = Rate("refused-tokens", "tokens the API server refused", refused.bounds())
        self.requests = Rate("requests", "requests", requests.bounds())

    def over_rate(self, **keys: str) -> Response | None:
        """429 when a caller (`person=`: a person, or an attempt's run), a namespace they may act in
        (`namespace=`), or all together (`total=""`) have sent their share of requests."""
        try:
            self.requests.take(**keys)
        except OverBudget as err:
            return too_many(str(err), err.retry_after)
        return None

    async def kubernetes_user(self, request: Request, counted: bool = True) -> Caller:
        """Who sent the request, by its bearer token; a request `counted` is one of their requests a second
        (a stream's own re-check of its reader is not)."""
        token = bearer(request)
        if token is None:
            return Caller(refusal=error(401, "send Authorization: Bearer <a token the cluster accepts>"))
        client = request.client.host if request.client else ""
        fresh = not self.auth.knows(token)
        try:
            if fresh:
                # Taken before the review (parallel requests cannot all pass a check made before any counted),
                # given back when the token is accepted: a client whose tokens keep being refused waits, unreviewed.
                self.refused_tokens.take(client=client, total="")
            user = await self.auth.user(token)
        except OverBudget as err:
            return Caller(refusal=too_many(str(err), err.retry_after))
        except (ApiError, Unreachable) as err:
            if fresh:
                self.refused_tokens.give_back(client=client, total="")
            return Caller(refusal=error(503, f"the Kubernetes API server did not review the token: {err}"))
        if user is None:
            return Caller(refusal=error(401, "the Kubernetes API server does not accept this token"))
        if fresh:
            self.refused_tokens.give_back(client=client, total="")
        if counted:  # the person now; the namespace once they may act in it (`may`): no one spends another's
            refusal = self.over_rate(person=user.name, total="")
            if refusal is not None:
                return Caller(refusal=refusal)
        return Caller(user=user)

    async def may(self, caller: Caller, access: Access) -> Response | None:
        assert caller.user is not None
        try:
            if await self.auth.allowed(caller.user, access):
                return self.over_rate(namespace=access.namespace) if access.namespace else None
        except PermissionError as err:
            return error(503, str(err))
        what = f"{access.resource}/{access.subresource}" if access.subresource else access.resource
        where = f" in namespace {access.namespace}" if access.namespace else " cluster-wide"
        target = f" {access.name}" if access.name else ""
        return error(403, f"{caller.user.name} may not {access.verb} {what}.{access.group}{target}{where}")

    async def people(
        self, request: Request, verb: str, namespace: str, item: str | None
    ) -> Writer | Response:
        """A person on work items (api/items.py), writing as themselves."""
        caller = await self.kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        assert caller.user is not None
        refusal = await self.may(caller, Access(verb, "workitems", namespace=namespace, name=item or ""))
        return refusal or Writer(Author(user=caller.user.name))

    async def people_of_memory(
        self, request: Request, verb: str, namespace: str, scope: str, name: str
    ) -> Writer | Response:
        """A person on a Team's or a Project's memory (api/memory.py), writing as themselves."""
        caller = await self.kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        assert caller.user is not None
        refusal = await self.may(
            caller, Access(verb, scope, namespace=namespace, name=name, subresource="memory")
        )
        return refusal or Writer(Author(user=caller.user.name))

    async def usage_reader(self, request: Request, namespace: str | None) -> Response | None:
        """A person reading model usage (api/usage.py)."""
        caller = await self.kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        return await self.may(caller, Access("list", "runs", namespace=namespace or ""))


def counted(
    route: str, handler: Callable[[Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    async def wrapped(request: Request) -> Response:
        response = await handler(request)
        REQUESTS.labels(route, str(response.status_code)).inc()
        if response.status_code == 429:
            await TARPIT.hold(int(response.headers.get("retry-after", "1")))
        return response

    return wrapped
