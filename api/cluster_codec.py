"""The codec's door on ksquad-api: who may have payloads encoded and decoded (/codec/, api/codec.py): the holder
of the shared codec token (`Authorization: Bearer`, or the cookie the login form sets), or a Kubernetes user who
may `get` `runs/codec` cluster-wide; and, with no codec key, a 404 saying payloads are in clear."""

import hashlib
import hmac
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from api.cluster_callers import Callers, bearer
from api.cluster_settings import ApiSettings
from api.codec import codec_app
from api.errors import ROUTING_ERRORS, error
from api.kubernetes_auth import Access
from kube import TokenFile

CODEC_COOKIE = "ksquad-codec"


def codec_session(token: str) -> str:
    """The codec cookie's value: derived from the shared token (a stolen cookie is not the token), and changed
    with it."""
    return hmac.new(token.encode(), b"ksquad-codec-session", hashlib.sha256).hexdigest()


def codec_routes(codec: Any, settings: ApiSettings, callers: Callers) -> Starlette:
    """What ksquad-api mounts at /codec: the codec endpoint behind its door, or (no codec) a 404 saying so."""
    shared = TokenFile(settings.codec_token_file) if settings.codec_token_file else None
    secure_cookie = bool(settings.tls_cert_file)

    async def codec_token_matches(given: str | None) -> bool:
        if shared is None or not given:
            return False
        expected = (await shared.authorization() or "").removeprefix("Bearer ")
        return hmac.compare_digest(given.encode(), expected.encode())

    async def codec_session_matches(given: str | None) -> bool:
        if shared is None or not given:
            return False
        expected = (await shared.authorization() or "").removeprefix("Bearer ")
        return bool(expected) and hmac.compare_digest(given.encode(), codec_session(expected).encode())

    async def authorize_codec(request: Request) -> Response | None:
        token = bearer(request)
        if await codec_token_matches(token) or await codec_session_matches(request.cookies.get(CODEC_COOKIE)):
            return None
        if token is None:
            return error(
                401,
                "send the codec token (Authorization: Bearer, or sign in at /codec/login for the cookie), or a "
                "token the cluster accepts",
            )
        caller = await callers.kubernetes_user(request)
        if caller.refusal is not None:
            return caller.refusal
        return await callers.may(caller, Access("get", "runs", subresource="codec"))

    async def login_form(request: Request) -> Response:
        return HTMLResponse(
            "<!doctype html><title>ksquad codec</title><form method=post action='/codec/login'>"
            "<label>Codec token <input type=password name=token autocomplete=off></label>"
            "<button>Sign in</button></form><p>The Temporal UI then decodes through this endpoint "
            "(its codec settings: this endpoint, with <em>include cross-origin credentials</em>).</p>"
        )

    async def login(request: Request) -> Response:
        form = await request.form()
        token = form.get("token")
        if not isinstance(token, str) or not await codec_token_matches(token):
            return error(401, "that is not the codec token")
        response = RedirectResponse("/codec/login?signed-in=1", status_code=303)
        # HttpOnly: no page script reads it; Lax: sent by the UI's fetch from the same site, not by other sites;
        # Secure whenever the browser came over HTTPS (this server's TLS, or an ingress's, which says so in
        # X-Forwarded-Proto); the value is derived from the token, never the token itself.
        https = secure_cookie or request.headers.get("x-forwarded-proto", "").lower() == "https"
        response.set_cookie(
            CODEC_COOKIE,
            codec_session(token),
            path="/codec",
            httponly=True,
            samesite="lax",
            secure=https,
            max_age=43200,
        )
        return response

    async def no_codec(request: Request) -> Response:
        return error(404, "no codec is configured (codec.keySecret): workflow payloads are in clear")

    login_routes = [Route("/login", login_form, methods=["GET"]), Route("/login", login, methods=["POST"])]
    if codec is not None:
        return codec_app(codec, settings.ui_origins, authorize_codec, login_routes)
    return Starlette(
        exception_handlers=ROUTING_ERRORS,
        routes=[Route("/{rest:path}", no_codec, methods=["GET", "POST", "OPTIONS"])],
    )
