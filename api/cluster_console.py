"""The console's place in ksquad-api: who the person is (their token from an authenticating proxy, or from the
token sign-in's sealed cookie), the session each request gets (api/console/cluster.py's backend, acting as them),
the sign-in and sign-out pages, and the console's routes (api/console/app.py) counted and bounded with the rest;
without the console's key, a 503 saying so."""

import hashlib
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from api.budgets import Budget
from api.cluster_callers import bearer, counted
from api.cluster_settings import ApiSettings
from api.console.app import console_routes
from api.console.cluster import SESSION_SECONDS, ClusterConsole, RunChanges, SessionSeal
from api.console.guard import SECURITY_HEADERS, Session, csrf_key_of, form_of, same_origin
from api.console.pages.bare import refusal_page, signin_page
from api.errors import error
from api.kubernetes_auth import KubernetesAuth
from kube import ApiError, Kube, Unreachable
from store import Store

CONSOLE_COOKIE = "ksquad-console"


def console_app(
    store: Store,
    kube: Kube,
    auth: KubernetesAuth,
    settings: ApiSettings,
    over_rate: Callable[..., Response | None],
    streams: Budget,
) -> list[Route]:
    """The console's routes, each person's calls made with their own token (api/console/cluster.py); a person's
    requests a second (`over_rate`) and event streams (`streams`) counted with those they send the API."""
    if settings.console_key is None:

        async def no_console(request: Request) -> Response:
            return error(503, "the console has no key (KSQUAD_CONSOLE_KEY_FILE; the chart makes one)")

        return [Route("/console{rest:path}", no_console, methods=["GET", "POST"])]
    seal = SessionSeal(settings.console_key)
    csrf_key = csrf_key_of(settings.console_key)
    https = bool(settings.tls_cert_file)
    run_changes = RunChanges(kube, settings.namespaces)  # one watch a namespace, for every person's tabs

    def token_of(request: Request) -> tuple[str | None, str]:
        """The person's token and how it came: from the proxy (Authorization), or the sign-in's cookie."""
        token = bearer(request)
        if token:
            return token, "your Kubernetes identity, from the proxy"
        opened = seal.open(request.cookies.get(CONSOLE_COOKIE, ""))
        return opened, "your Kubernetes identity, signed in with a token"

    async def console_session(request: Request) -> Session | Response:
        token, how = token_of(request)
        if token is None:
            return RedirectResponse("/console/signin", status_code=303)
        try:
            user = await auth.user(token)
        except (ApiError, Unreachable) as err:
            return HTMLResponse(
                str(refusal_page(503, f"the Kubernetes API server did not review the token: {err}", [])),
                status_code=503,
                headers=SECURITY_HEADERS,
            )
        if user is None:
            answer = HTMLResponse(
                str(signin_page("the Kubernetes API server does not accept this token (expired?)")),
                status_code=401,
                headers=SECURITY_HEADERS,
            )
            answer.delete_cookie(CONSOLE_COOKIE, path="/console")
            return answer
        # The person's share only: the console acts as them on the API server, which alone says whether they may
        # act in the namespace they name, so no namespace's share is spent on their word.
        refusal = over_rate(person=user.name, total="")
        if refusal is not None:
            return refusal
        backend = ClusterConsole(
            kube.acting_as(token),
            auth,
            user,
            store,
            settings.namespaces,
            settings.temporal_ui_url,
            settings.temporal_namespace,
            how,
            run_changes,
        )
        return Session(backend, hashlib.sha256(token.encode()).hexdigest())

    async def signin_form(request: Request) -> Response:
        return HTMLResponse(str(signin_page()), headers=SECURITY_HEADERS)

    async def signin(request: Request) -> Response:
        if not same_origin(request):
            return error(403, "sign in from the console's own page")
        form = await form_of(request)
        if isinstance(form, Response):
            return form
        token = form.get("token", "").strip()
        try:
            user = await auth.user(token) if token else None
        except (ApiError, Unreachable) as err:
            return error(503, f"the Kubernetes API server did not review the token: {err}")
        if user is None:
            return HTMLResponse(
                str(signin_page("the Kubernetes API server does not accept this token")),
                status_code=401,
                headers=SECURITY_HEADERS,
            )
        response = RedirectResponse("/console/", status_code=303)
        secure = https or request.headers.get("x-forwarded-proto", "").lower() == "https"
        response.set_cookie(
            CONSOLE_COOKIE,
            seal.seal(token),
            path="/console",
            httponly=True,
            samesite="strict",
            secure=secure,
            max_age=SESSION_SECONDS,
        )
        return response

    async def signout(request: Request) -> Response:
        response = HTMLResponse(str(signin_page("Signed out.")), headers=SECURITY_HEADERS)
        response.delete_cookie(CONSOLE_COOKIE, path="/console")
        return response

    return [
        Route("/console", lambda _: RedirectResponse("/console/", status_code=307)),
        Route("/console/signin", signin_form),
        Route("/console/signin", signin, methods=["POST"]),
        Route("/console/signout", signout),
        *(
            Route(r.path, counted("console", r.endpoint), methods=r.methods)
            for r in console_routes(
                console_session,
                csrf_key,
                streams,
                Budget("console", "console requests", settings.console_limits),
            )
        ),
    ]
