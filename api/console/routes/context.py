"""What the console's handlers share: the console's own settings (`Console`: the forms' CSRF key, the event
streams budget, the trace UI's page) and the signed-in page around a handler's body (`shell`)."""

from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from api.budgets import Budget
from api.console.guard import Session, csrf_token, page
from api.console.html import Html
from api.console.pages.layout import layout

DONE = {
    "cancel": "Cancel sent",
    "pause": "Pause sent",
    "resume": "Resume sent",
    "input": "Answer sent",
    "comment": "Comment added",
    "remembered": "Entry added",
    "saved": "Entry saved",
    "forgotten": "Entry deleted",
    "created": "Run created",
}


@dataclass(frozen=True)
class Console:
    """The console as its routes were made: the key of the forms' tokens, the budget a person's event streams
    are counted in, and the trace UI's page of one trace (None: no trace links)."""

    csrf_key: bytes
    streams: Budget
    trace_page: str | None

    def csrf(self, session: Session) -> str:
        """The token the person's forms carry."""
        return csrf_token(self.csrf_key, session.key)


def shell(session: Session, title: str, body: Html, request: Request, problem: str = "") -> Response:
    viewer = session.backend.viewer
    # what the last action did, by its code: a link cannot put words of its own on the page
    flash = DONE.get(request.query_params.get("done", ""), "")
    return page(layout(title, viewer.name, viewer.how, body, flash, problem))
