"""What every console page shares: the document (this origin's style sheet and script, nothing else), the
signed-in layout (navigation, who is signed in, what the last action did), the console's URLs, and the small
pieces several pages show (a phase badge, a timestamp, a countdown, a list of facts)."""

from collections.abc import Iterable
from typing import Any

from api.console.backend import Obj
from api.console.html import Html, el, path
from api.streams import TERMINAL_PHASES

PHASES = (
    "Pending",
    "Queued",
    "Claiming",
    "Running",
    "Paused",
    "Cancelling",
    "Succeeded",
    "Failed",
    "Cancelled",
)
TERMINAL = TERMINAL_PHASES
BASE = "console"  # where the console is mounted


def url(*segments: str, **query: str) -> str:
    return path(BASE, *segments, query=query)


def document(title: str, body: Html, header: Html | None = None, script: bool = True) -> Html:
    """A whole page: this origin's style sheet and (for signed-in pages) its script, nothing else."""
    return Html(
        Html("<!doctype html>")
        + el(
            "html",
            {"lang": "en"},
            el(
                "head",
                {},
                el("meta", {"charset": "utf-8"}),
                el("meta", {"name": "viewport", "content": "width=device-width, initial-scale=1"}),
                el("title", {}, f"{title} · ksquad"),
                el("link", {"rel": "stylesheet", "href": url("static", "console.css")}),
                el("script", {"src": url("static", "console.js"), "defer": True}) if script else None,
            ),
            el("body", {}, el("header", {}, header) if header else None, el("main", {}, body)),
        )
    )


def layout(title: str, viewer: str, how: str, body: Html, flash: str = "", problem: str = "") -> Html:
    nav = el(
        "nav",
        {"aria-label": "console"},
        el("a", {"href": url(""), "class": "brand"}, "ksquad"),
        el("a", {"href": url("")}, "Runs"),
        el("a", {"href": url("items")}, "Work items"),
        el("a", {"href": url("memory")}, "Memory"),
        el("a", {"href": url("start")}, "Start a run"),
        el(
            "span",
            {"class": "who"},
            "Signed in as ",
            el("strong", {"data-testid": "viewer"}, viewer),
            f" ({how}) ",
            el("a", {"href": url("signout")}, "Sign out"),
        ),
    )
    notes = Html(
        (el("p", {"class": "flash", "role": "status"}, flash) if flash else "")
        + (el("p", {"class": "problem", "role": "alert"}, problem) if problem else "")
    )
    return document(title, Html(notes + body), nav)


def phase_badge(phase: str, reason: str = "") -> Html:
    return el(
        "span",
        {"class": f"phase phase-{phase.lower() if phase in PHASES else 'unknown'}", "data-testid": "phase"},
        phase or "Pending",
        el("span", {"class": "reason"}, f" · {reason}") if reason and reason != phase else None,
    )


def when(text: str | None) -> Html:
    """A timestamp as the server has it, marked so the page can show it in the reader's time."""
    if not text:
        return Html("")
    return el("time", {"datetime": text}, text)


def countdown(resume_at: str | None, phase: str) -> Html:
    if not resume_at or phase in TERMINAL:
        return Html("")
    return el(
        "p",
        {"class": "countdown"},
        "Resumes at ",
        when(resume_at),
        " ",
        el("span", {"data-countdown": resume_at, "data-testid": "countdown"}, ""),
    )


def facts(pairs: Iterable[tuple[str, object]]) -> Html:
    return el("dl", {"class": "facts"}, [(el("dt", {}, k), el("dd", {}, v)) for k, v in pairs if v])


def as_object(value: Any) -> Obj:
    """A field that should be an object, as one (an object made by hand may have anything there)."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def status_of(run: Obj) -> Obj:
    return as_object(run.get("status"))


def spec_of(run: Obj) -> Obj:
    return as_object(run.get("spec"))
