"""A run's page: its head (phase, message, countdown), what it is (facts, links to its work item, workflow and
traces), the actions the person may take now (or why not), its timeline, the agent's progress, and its inputs,
outputs, artifacts and usage. Followed live (server-sent events) until it ends."""

from collections.abc import Mapping

from api.console.backend import Obj
from api.console.html import Html, el
from api.console.pages.layout import (
    TERMINAL,
    as_list,
    as_object,
    countdown,
    facts,
    phase_badge,
    spec_of,
    status_of,
    url,
    when,
)
from api.console.pages.runs import run_agents
from store import Event


def action_form(
    run_url: str, action: str, label: str, csrf: str, refusal: str | None, field: Html | None = None
) -> Html:
    """A form for one action; when the person may not take it, the button is disabled and the reason shown."""
    if refusal:
        return el(
            "div",
            {"class": "action refused"},
            el("button", {"type": "button", "disabled": True}, label),
            el("span", {"class": "why", "data-testid": f"why-not-{action}"}, refusal),
        )
    return el(
        "form",
        {"method": "post", "action": f"{run_url}/{action}", "class": "action"},
        el("input", {"type": "hidden", "name": "csrf", "value": csrf}),
        field,
        el("button", {"type": "submit", "data-testid": f"action-{action}"}, label),
    )


def run_page(
    run: Obj,
    phases: list[Event],
    progress: list[Event],
    refusals: Mapping[str, str | None],
    csrf: str,
    temporal_url: str | None,
    last_seq: int,
    traces: list[tuple[int, str]] | None = None,
) -> Html:
    meta, status, spec = run.get("metadata", {}), status_of(run), spec_of(run)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    run_url = url("runs", namespace, name)
    item_ref = str(spec.get("workItemRef") or as_object(status.get("workItem")).get("ref") or "")
    usage = as_object(status.get("usage"))
    outputs = as_object(status.get("outputs"))
    artifacts = [a for a in as_list(status.get("artifacts")) if isinstance(a, dict)]
    inputs = as_object(spec.get("inputs"))
    workflow = as_object(status.get("workflow"))
    header = el(
        "div",
        {"class": "run-head"},
        el("h1", {}, name, " ", phase_badge(phase, str(status.get("reason") or ""))),
        el("p", {"class": "message", "data-testid": "message"}, str(status.get("message") or "")),
        countdown(status.get("resumeAt"), phase),
    )
    about = facts(
        [
            ("Namespace", namespace),
            ("Started by", str(status.get("triggeredBy") or "")),
            ("Agents", run_agents(run)),
            ("Agent now", str(status.get("agent") or "")),
            ("Model", str(status.get("model") or "")),
            ("Attempt", str(status.get("attempt") or "")),
            (
                "Work item",
                el("a", {"href": url("items", namespace, item_ref)}, item_ref) if item_ref else None,
            ),
            ("Created", when(meta.get("creationTimestamp"))),
            (
                "Workflow",
                el(
                    "a",
                    {"href": temporal_url, "rel": "noopener"},
                    str(workflow.get("id") or "in the Temporal UI"),
                )
                if temporal_url
                else str(workflow.get("id") or ""),
            ),
            (
                "Traces",
                el(
                    "span",
                    {"data-testid": "traces"},
                    *(el("a", {"href": link, "rel": "noopener"}, f"attempt {n}", " ") for n, link in traces),
                )
                if traces
                else None,
            ),
        ]
    )
    waiting_for_input = phase == "Paused" and status.get("pauseReason") == "InputRequired"
    reason_field = el("input", {"name": "reason", "placeholder": "reason (optional)", "aria-label": "reason"})
    actions = el(
        "section",
        {"class": "actions", "aria-label": "actions"},
        el("h2", {}, "Actions"),
        action_form(
            run_url,
            "input",
            "Send the answer",
            csrf,
            refusals.get("input"),
            el(
                "label",
                {"class": "answer"},
                "The agent asks: ",
                el("q", {}, str(status.get("message") or "")),
                el("textarea", {"name": "text", "required": True, "rows": "3"}, ""),
            ),
        )
        if waiting_for_input
        else None,
        action_form(run_url, "pause", "Pause", csrf, refusals.get("pause"), reason_field),
        action_form(run_url, "resume", "Resume", csrf, refusals.get("resume")),
        action_form(run_url, "cancel", "Cancel the run", csrf, refusals.get("cancel"), reason_field),
    )
    timeline = el(
        "section",
        {"aria-label": "timeline"},
        el("h2", {}, "Timeline"),
        el(
            "ol",
            {"class": "timeline", "id": "timeline"},
            [
                el(
                    "li",
                    {},
                    when(e.at.isoformat()),
                    " ",
                    phase_badge(str(_data(e).get("phase", "")), str(_data(e).get("reason") or "")),
                    " ",
                    el("span", {"class": "message"}, str(_data(e).get("message") or e.message or "")),
                )
                for e in phases
            ],
        ),
    )
    progress_list = el(
        "section",
        {"aria-label": "progress"},
        el("h2", {}, "Agent progress"),
        el(
            "ol",
            {"class": "progress", "id": "progress", "data-testid": "progress"},
            [el("li", {}, when(e.at.isoformat()), " ", e.message) for e in progress],
        ),
    )
    results = el(
        "section",
        {"aria-label": "results"},
        el("h2", {}, "Inputs, outputs, artifacts, usage"),
        facts([(str(k), str(v)) for k, v in inputs.items()]) if inputs else None,
        facts([(str(k), str(v)) for k, v in outputs.items()]) if outputs else None,
        el(
            "ul",
            {"class": "artifacts"},
            [
                el(
                    "li",
                    {},
                    el(
                        "a",
                        {"href": url("runs", namespace, name, "artifacts", str(a.get("name", "")))},
                        str(a.get("name", "")),
                    ),
                    f" ({a.get('mediaType') or 'unknown type'}, {a.get('size') or '?'} bytes)",
                )
                for a in artifacts
            ],
        )
        if artifacts
        else None,
        el(
            "p",
            {"class": "usage", "data-testid": "usage"},
            f"{usage.get('calls', 0)} model calls, {usage.get('inputTokens', 0)} tokens in, "
            f"{usage.get('outputTokens', 0)} tokens out",
        )
        if usage
        else el("p", {"class": "usage"}, "No model usage reported yet."),
    )
    live = {"data-events": f"{run_url}/events?after={last_seq}"} if phase not in TERMINAL else {}
    return el("article", {"class": "run", **live}, header, about, actions, timeline, progress_list, results)


def _data(event: Event) -> Obj:
    return event.data if isinstance(event.data, dict) else {}
