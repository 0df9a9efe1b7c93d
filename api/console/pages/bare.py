"""The pages for who is not signed in, or is refused: without the console's navigation nor its script. The cluster
console's sign-in form, the embedded console's pointer to the sign-in link `ksquad dev` printed, and a refusal
(its status, the reason and the problems, as the stack gave them)."""

from api.console.html import Html, el
from api.console.pages.layout import document, url


def bare_page(title: str, body: Html) -> Html:
    """A page for who is not signed in (the sign-in form, a refusal)."""
    return document(title, body, script=False)


def signin_page(problem: str = "", proxy_hint: bool = True) -> Html:
    return bare_page(
        "Sign in",
        Html(
            el("h1", {}, "Sign in to the ksquad console")
            + (el("p", {"class": "problem", "role": "alert"}, problem) if problem else "")
            + el(
                "form",
                {"method": "post", "action": url("signin")},
                el("label", {"for": "token"}, "A bearer token the cluster accepts (yours)"),
                el("input", {"type": "password", "name": "token", "id": "token", "autocomplete": "off"}),
                el("button", {"type": "submit", "data-testid": "signin"}, "Sign in"),
            )
            + (
                el(
                    "p",
                    {},
                    "Behind an authenticating proxy that sends your token, this page is never shown: ask your "
                    "cluster's administrators for the console's address.",
                )
                if proxy_hint
                else ""
            )
        ),
    )


def signin_needed_page(note: str = "") -> Html:
    """The embedded console's answer to who has no session: the sign-in link is what `ksquad dev` printed."""
    return bare_page(
        "Sign in",
        Html(
            el("h1", {}, "Sign in to the ksquad console")
            + (el("p", {"class": "flash"}, note) if note else "")
            + el(
                "p",
                {},
                "Open the console's sign-in link that `ksquad dev` printed (it carries the token in "
                ".ksquad/api.token; `ksquad dev --status` prints it again).",
            )
        ),
    )


def refusal_page(status: int, message: str, problems: list[str]) -> Html:
    return bare_page(
        "Refused",
        Html(
            el("h1", {}, f"{status}")
            + el("p", {"class": "problem", "role": "alert"}, message)
            + el("ul", {}, [el("li", {}, p) for p in problems])
            + el("p", {}, el("a", {"href": url("")}, "Back to the runs"))
        ),
    )
