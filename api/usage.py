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
MAX_WINDOW = timedelta(days=3660)  # ten years: what is further is a mistake (and past Python's dates, a 500)
_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# (request, namespace or None for all) -> the refusal to send, or None when the caller may read that usage.
Authorize = Callable[[Request, str | None], Awaitable[Response | None]]


def parse_time(text: str, now: datetime) -> datetime:
    """An ISO 8601 time (UTC when it names no zone), or a duration back from `now` such as 90m, 24h or 7d."""
    if len(text) > 64:
        raise ValueError(f"{text[:64]!r}... is longer than a time or a duration is")
    match = _DURATION.match(text.strip())
    if match:
        seconds = int(match[1]) * _SECONDS[match[2]]
        back = timedelta(seconds=min(seconds, int(MAX_WINDOW.total_seconds()) + 1))
        if back > MAX_WINDOW:
            raise ValueError(f"{text!r} goes back further than {MAX_WINDOW.days} days")
        return now - back
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a time (2026-12-04T10:00:00Z) nor a duration (90m, 24h, 7d)"
        ) from None
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    if abs(now - at) > MAX_WINDOW:
        raise ValueError(f"{text!r} is more than {MAX_WINDOW.days} days from now")
    return at


def usage_routes(store: Store, authorize: Authorize) -> list[Route]:
    async def usage(request: Request) -> Response:
        query = request.query_params
        namespace = query.get("namespace") or None
        # Who asks first: what they ask, however malformed, is one of their requests (api.budgets), and a caller
        # who may not read usage learns nothing of how it is asked for.
        refusal = await authorize(request, namespace)
        if refusal is not None:
            return refusal
        by = query.get("by", "credential")
        if by not in GROUPS:
            return error(422, f"by: one of {', '.join(GROUPS)}, not {by!r}")
        now = datetime.now(UTC)
        try:
            since = parse_time(query["since"], now) if query.get("since") else now - DEFAULT_WINDOW
        except ValueError as err:
            return error(422, f"since: {err}")
        try:
            until = parse_time(query["until"], now) if query.get("until") else None
        except ValueError as err:
            return error(422, f"until: {err}")
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
