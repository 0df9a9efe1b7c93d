"""The one error shape of ksquad's HTTP APIs, the embedded stack's and the cluster's: `{"error": "...",
"problems": [...]}` with the status, for a route's own refusals and for what the router answers (an unknown
path, a method the path does not take), so a client parses every failure the same way."""

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


def error(status: int, message: str, problems: list[str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "problems": problems or []}, status_code=status)


def too_many(message: str, retry_after: int) -> JSONResponse:
    """429, with the Retry-After a client waits for (api.budgets.OverBudget)."""
    refusal = error(429, message)
    refusal.headers["Retry-After"] = str(retry_after)
    return refusal


async def _routing_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        # Starlette lists them from a set: in a fixed order, so clients and tests see one answer.
        allowed = ", ".join(sorted((exc.headers or {}).get("Allow", "").split(", ")))
        refusal = error(405, f"{request.url.path} does not take {request.method} (it takes {allowed})")
        refusal.headers["Allow"] = allowed
        return refusal
    if exc.status_code == 404:
        return error(404, f"no such route: {request.method} {request.url.path}")
    return error(exc.status_code, str(exc.detail))


# Starlette(exception_handlers=...): the router's 404 and 405 (and any HTTPException) in the shape above.
ROUTING_ERRORS: dict[Any, Any] = {HTTPException: _routing_error}
