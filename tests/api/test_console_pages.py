"""The console's pieces that need no stack: its markup escapes whatever a Run, an agent or a person wrote (the
browser tests in tests/dev/test_console.py show nothing runs; these show why, field by field), its sealed sign-in
cookie, the inputs a person types, and which actions a run's state allows."""

import html
import re
from datetime import UTC, datetime

import pytest

from api.console.backend import Refused
from api.console.cluster import SessionSeal
from api.console.html import Html, el, path, safe_url
from api.console.pages.items import item_page, items_page
from api.console.pages.run import run_page
from api.console.pages.runs import runs_table
from api.console.routes.run import run_refusals
from api.console.routes.start import parse_inputs
from store import Author, Event, ItemEvent, WorkItem

HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"
AT = datetime(2026, 12, 4, tzinfo=UTC)


def tags(markup: str) -> list[str]:
    """Every element the markup opens, by name."""
    return re.findall(r"<([a-zA-Z][a-zA-Z0-9]*)", markup)


def test_text_and_attribute_values_are_escaped_and_only_made_markup_is_placed_as_it_is() -> None:
    made = el("a", {"href": "/console/x", "title": HOSTILE}, HOSTILE, el("b", {}, "bold"))
    assert tags(made) == ["a", "b"]
    assert "&lt;script&gt;" in made and "&quot;" in made
    assert el("p", {}, Html("<em>mine</em>")) == "<p><em>mine</em></p>"
    # text added to markup, on either side, stays text (an agent's entry was once shown so)
    assert el("b", {}, "x") + HOSTILE == "<b>x</b>" + html.escape(HOSTILE)
    assert HOSTILE + el("b", {}, "x") == html.escape(HOSTILE) + "<b>x</b>"
    assert isinstance(el("b", {}, "x") + "y", Html)


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        ("/console/runs/a/b", "/console/runs/a/b"),
        ("https://temporal.example/x", "https://temporal.example/x"),
        ("javascript:alert(1)", "#"),
        (" JavaScript:alert(1)", "#"),
        ("//attacker.example/x", "#"),
        ("data:text/html,<script>", "#"),
        ("/\\attacker.example/x", "#"),
        ("/\t/attacker.example/x", "#"),
    ],
)
def test_a_link_goes_to_the_console_or_an_http_address_only(given: str, kept: str) -> None:
    assert safe_url(given) == kept


def test_a_path_keeps_each_segment_one_segment() -> None:
    assert path("console", "items", "ns", "a/b?c") == "/console/items/ns/a%2Fb%3Fc"


def hostile_run() -> dict[str, object]:
    return {
        "metadata": {"namespace": "ns", "name": "r1", "uid": "u", "creationTimestamp": HOSTILE},
        "spec": {
            "agents": [HOSTILE],
            "teamRef": HOSTILE,
            "inputs": {HOSTILE: HOSTILE},
            "workItemRef": HOSTILE,
        },
        "status": {
            "phase": HOSTILE,
            "reason": HOSTILE,
            "message": HOSTILE,
            "triggeredBy": HOSTILE,
            "agent": HOSTILE,
            "model": HOSTILE,
            "resumeAt": HOSTILE,
            "outputs": {HOSTILE: HOSTILE},
            "artifacts": [{"name": HOSTILE, "mediaType": HOSTILE, "size": HOSTILE}],
            "usage": {"calls": HOSTILE},
            "workflow": {"id": HOSTILE},
        },
    }


def test_every_field_of_a_run_is_shown_as_text() -> None:
    run = hostile_run()
    event = Event(
        1, "phase", HOSTILE, {"phase": HOSTILE, "reason": HOSTILE, "message": HOSTILE}, 1, 1, None, AT
    )
    progress = Event(2, "status", HOSTILE, {}, 1, 1, None, AT)
    for markup in (
        runs_table([run]),
        run_page(
            run, [event], [progress], dict.fromkeys(("cancel", "pause", "resume", "input")), "t", None, 2
        ),
        run_page(run, [event], [progress], {"cancel": HOSTILE}, HOSTILE, "javascript:alert(1)", 2),
    ):
        assert "<script" not in markup and "<img" not in markup, markup
        assert "javascript:" not in markup
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in markup


def test_every_field_of_a_work_item_and_its_thread_is_shown_as_text() -> None:
    item = WorkItem("ns", "PAY-1", HOSTILE, HOSTILE, HOSTILE, (HOSTILE,), HOSTILE, AT, AT, 3)
    entries = [
        ItemEvent(1, "comment", HOSTILE, {}, Author(user=HOSTILE), None, AT),
        ItemEvent(
            2, "comment", HOSTILE, {}, Author(user=HOSTILE, run=HOSTILE, run_uid="u", attempt=1), 3, AT
        ),
    ]
    for markup in (
        item_page(item, entries, [hostile_run()], "t", None),
        items_page("ns", [], [item]),
    ):
        assert "<script" not in markup and "<img" not in markup, markup


def test_inputs_are_name_value_lines_and_a_bad_line_is_named() -> None:
    assert parse_inputs("task = fix it\n\npriority=high=urgent\n") == {
        "task": "fix it",
        "priority": "high=urgent",
    }
    with pytest.raises(Refused, match="inputs, line 2") as refused:
        parse_inputs("task=x\nno equals sign")
    assert refused.value.status == 422
    with pytest.raises(Refused, match="line 1"):
        parse_inputs("<b>=x")


def test_the_sign_in_cookie_holds_the_token_sealed_for_twelve_hours_and_nothing_else_opens() -> None:
    seal = SessionSeal(b"k" * 32)
    cookie = seal.seal("the-token", now=1000)
    assert "the-token" not in cookie
    assert seal.open(cookie, now=1000 + 3600) == "the-token"
    assert seal.open(cookie, now=1000 + 13 * 3600) is None, "expired"
    assert SessionSeal(b"j" * 32).open(cookie, now=1000) is None, "another console's key"
    tampered = cookie[:-4] + ("AAAA" if not cookie.endswith("AAAA") else "BBBB")
    assert seal.open(tampered, now=1000) is None
    assert seal.open("not base64 at all!", now=1000) is None


@pytest.mark.parametrize(
    ("status", "allowed"),
    [
        ({"phase": "Running"}, {"cancel", "pause"}),
        ({"phase": "Paused", "pauseReason": "Manual"}, {"cancel", "resume"}),
        ({"phase": "Paused", "pauseReason": "RateLimited"}, {"cancel"}),
        ({"phase": "Paused", "pauseReason": "InputRequired"}, {"cancel", "input"}),
        ({"phase": "Succeeded"}, set()),
        ({"phase": "Cancelling"}, set()),
    ],
)
def test_the_actions_a_runs_state_allows(status: dict[str, str], allowed: set[str]) -> None:
    refusals = run_refusals({"status": status}, None)
    assert {a for a, why in refusals.items() if why is None} == allowed
    rights = run_refusals({"status": status}, "ann may not patch runs")
    assert all(why == "ann may not patch runs" for why in rights.values()), "the person's rights come first"
