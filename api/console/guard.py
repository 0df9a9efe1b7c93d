"""What stands before every console handler, and what every answer carries. A request is first given to the API's
`Identify`, which answers with the signed-in person's `Session` (their Backend) or with the response to send
instead (to the sign-in page, or a refusal); then the names in its path and query must be Kubernetes names, and
the person's requests in flight stay within their share (`Guard.signed_in`). Every POST carries the form's CSRF
token (an HMAC of the sign-in, under the console's key) and, when the browser says where it came from (Origin,
Sec-Fetch-Site), comes from this origin (`Guard.posted`).

Every page is rendered on the server with everything escaped (api.console.html), under a Content-Security-Policy
that allows this origin's script and style only (no inline script, no other host, no framing); a refusal is such
a page too, with the stack's status and reason.
"""

import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from api.budgets import Budget, OverBudget
from api.console.backend import Backend, Refused
from api.console.html import Html
from api.console.pages.bare import refusal_page
from store import InvalidItemWrite, ItemNotFound, MemoryNotFound, MemoryRefused, StoreError

MAX_FORM_BYTES = 256 << 10
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a Kubernetes object name (DNS subdomain)


@dataclass
class Session:
    """A signed-in person: their backend, and what identifies the sign-in (its CSRF tokens derive from it)."""

    backend: Backend
    key: str


# The API's part: who sent this request (a Session), or what to answer instead (to the sign-in page, a 401).
Identify = Callable[[Request], Awaitable["Session | Response"]]
# A console handler: the request and who sent it; a POST's handler the form too.
Handler = Callable[[Request, Session], Awaitable[Response]]
FormHandler = Callable[[Request, Session, dict[str, str]], Awaitable[Response]]


def page(body: Html, status: int = 200) -> HTMLResponse:
    return HTMLResponse(str(body), status_code=status, headers=SECURITY_HEADERS)


def refused(err: Refused) -> HTMLResponse:
    return page(refusal_page(err.status, err.message, err.problems), err.status)


def csrf_key_of(console_key: bytes) -> bytes:
    """The key the forms' tokens are made with, derived from the console's key (which also seals cookies)."""
    return hmac.new(console_key, b"ksquad-console-csrf", hashlib.sha256).digest()


def csrf_token(key: bytes, sign_in: str) -> str:
    """The forms' token for one sign-in (`Session.key`): an HMAC under the console's key."""
    return hmac.new(key, f"console-csrf:{sign_in}".encode(), hashlib.sha256).hexdigest()


def same_origin(request: Request) -> bool:
    """What the browser says of where a POST comes from, when it says it: this origin only."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    # the host the browser asked for: this server's, or the proxy's in front of it that says so
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")} - {None}
    return urlsplit(origin).netloc in hosts


async def form_of(request: Request) -> dict[str, str] | Response:
    """The POSTed form (application/x-www-form-urlencoded, at most MAX_FORM_BYTES), first value of each field."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return page(
            refusal_page(415, f"send the console's forms as they are (got {kind or 'none'})", []), 415
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return page(refusal_page(413, f"the form is larger than {MAX_FORM_BYTES} bytes", []), 413)
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
    except UnicodeDecodeError:
        return page(refusal_page(400, "the form is not UTF-8", []), 400)
    return {k: v[0] for k, v in fields.items()}


@dataclass(frozen=True)
class Guard:
    """Who may reach a handler: whom `identify` signs in, within their share of `requests` (each person's own:
    one person's tabs polling never make another wait); and for a form, one from this origin with the token made
    under `csrf_key` for their sign-in."""

    identify: Identify
    csrf_key: bytes
    requests: Budget

    def signed_in(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def wrapped(request: Request) -> Response:
            session = await self.identify(request)
            if isinstance(session, Response):
                return session
            named = [
                ("namespace", request.path_params.get("namespace")),
                ("name", request.path_params.get("name")),
                ("namespace", request.query_params.get("namespace")),
            ]
            for field, value in named:
                if value and not NAME.match(value):
                    why = f"{field} {value[:80]!r} is not a Kubernetes name"
                    return refused(Refused(422, why, [f"metadata.{field}"]))
            person = session.backend.viewer.name
            where = request.path_params.get("namespace") or request.query_params.get("namespace") or ""
            try:
                # A namespace's share is spent only by who may read its Runs (RBAC, cached): naming a namespace
                # one may not read spends one's own share and the total, never that namespace's.
                if where and await session.backend.may("list", "runs", where) is not None:
                    where = ""
                with self.requests.held(person, where):
                    return await handler(request, session)
            except OverBudget as err:
                answer = refused(Refused(429, str(err)))
                answer.headers["Retry-After"] = str(err.retry_after)
                return answer
            except Refused as err:
                return refused(err)
            except ItemNotFound as err:
                return refused(Refused(404, str(err)))
            except InvalidItemWrite as err:
                return refused(Refused(422, str(err), [f"{err.field}: {err}"]))
            except MemoryNotFound as err:
                return refused(Refused(404, str(err)))
            except MemoryRefused as err:
                return refused(Refused(422, str(err), [str(err)]))
            except StoreError as err:
                return refused(Refused(503, f"the store does not answer: {err}"))

        return wrapped

    def posted(self, handler: FormHandler) -> Handler:
        async def wrapped(request: Request, session: Session) -> Response:
            if not same_origin(request):
                return refused(Refused(403, "a console form is accepted only from the console's own pages"))
            form = await form_of(request)
            if isinstance(form, Response):
                return form
            if not hmac.compare_digest(
                form.get("csrf", "").encode(), csrf_token(self.csrf_key, session.key).encode()
            ):
                return refused(
                    Refused(403, "this form is stale or was not made by the console for you: reload the page")
                )
            return await handler(request, session, form)

        return wrapped
