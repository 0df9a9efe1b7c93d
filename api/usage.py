"""Model usage over HTTP, the same route on the cluster's API and the embedded one: the calls and tokens the
agents reported (store/usage.py), summed over a window.

    GET /usage?by=credential|namespace|person|model[&namespace=NS][&since=T][&until=T]

`since` and `until` are an ISO 8601 time or a duration back from now (`90m`, `24h`, `7d`); `since` defaults to
24 hours ago, `until` to now. Each caller is authorised by its API (`Authorize`): on a cluster a user who may
`list` Runs in NS (cluster-wide without `namespace`), since usage says who ran what and how much; embedded, the
API token. Answers: 422 naming the parameter that is wrong, 503 when the store does not answer.
"""

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from api.errors import error
from store import USAGE_GROUPS, Store, StoreError

# What a caller asks to sum by, and the store's column for it ("person": who triggered the run).
GROUPS = {"credential": "credential", "namespace": "namespace", "person": "triggered_by", "model": "model"}
assert set(GROUPS.values()) == set(USAGE_GROUPS)
DEFAULT_WINDOW = timedelta(hours=24)
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}

# (request, namespace or None for all) -> the refusal to send, or None when the caller may read that usage.
Authorize = Callable[[Request, str | None], Awaitable[Response | None]]


def parse_time(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or a duration back from `now` such as 90m, 24h or 7d."""
    match = _DURATION.match(text.strip())
    if match:
        return now - timedelta(**{_UNITS[match[2]]: int(match[1])})
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a time (2026-12-04T10:00:00Z) nor a duration (90m, 24h, 7d)"
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def usage_routes(store: Store, authorize: Authorize) -> list[Route]:
    async def usage(request: Request) -> Response:
        query = request.query_params
        by = query.get("by", "credential")
        if by not in GROUPS:
            return error(422, f"by: one of {', '.join(GROUPS)}, not {by!r}")
        namespace = query.get("namespace") or None
        now = datetime.now(UTC)
        try:
            since = parse_time(query["since"], now) if query.get("since") else now - DEFAULT_WINDOW
        except ValueError as err:
            return error(422, f"since: {err}")
        try:
            until = parse_time(query["until"], now) if query.get("until") else None
        except ValueError as err:
            return error(422, f"until: {err}")
        refusal = await authorize(request, namespace)
        if refusal is not None:
            return refusal
        try:
            totals = await store.usage(GROUPS[by], since, until, namespace)
        except StoreError as err:
            return error(503, f"the store does not answer: {err}")
        return JSONResponse(
            {
                "by": by,
                "namespace": namespace,
                "since": since.isoformat(),
                "until": (until or now).isoformat(),
                "items": [
                    {
                        by: t.key,
                        "calls": t.calls,
                        "inputTokens": t.input_tokens,
                        "outputTokens": t.output_tokens,
                    }
                    for t in totals
                ],
            }
        )

    return [Route("/usage", usage)]
