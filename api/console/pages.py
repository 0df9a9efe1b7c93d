"""The console's pages, rendered on the server from what the stack returns (api.console.html escapes all of it).
Pages work without script; console.js only keeps them live (the runs table, a run's events, countdowns)."""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from api.console.html import Html, el, escape, path
from api.streams import TERMINAL_PHASES
from store import Event, ItemEvent, MemoryEntry, WorkItem
from store.work_items import ORCHESTRATOR

Obj = dict[str, Any]
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


def bare_page(title: str, body: Html) -> Html:
    """A page for who is not signed in (the sign-in form, a refusal)."""
    return document(title, body, script=False)


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


def _dict(value: Any) -> Obj:
    """A field that should be an object, as one (an object made by hand may have anything there)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _status(run: Obj) -> Obj:
    return _dict(run.get("status"))


def _spec(run: Obj) -> Obj:
    return _dict(run.get("spec"))


def run_agents(run: Obj) -> str:
    spec = _spec(run)
    agents = _list(spec.get("agents"))
    return ", ".join(str(a) for a in agents) or (f"team {spec['teamRef']}" if spec.get("teamRef") else "")


def runs_filters(namespace: str, namespaces: list[str], chosen: Mapping[str, str]) -> Html:
    namespace_field = (
        el(
            "select",
            {"name": "namespace", "id": "f-namespace"},
            el("option", {"value": ""}, "every namespace I may read"),
            [el("option", {"value": n, "selected": n == namespace}, n) for n in namespaces],
        )
        if namespaces
        else el("input", {"name": "namespace", "id": "f-namespace", "value": namespace, "placeholder": "all"})
    )
    return el(
        "form",
        {"method": "get", "action": url(""), "class": "filters", "role": "search"},
        el("label", {"for": "f-namespace"}, "Namespace"),
        namespace_field,
        el("label", {"for": "f-phase"}, "Phase"),
        el(
            "select",
            {"name": "phase", "id": "f-phase"},
            el("option", {"value": ""}, "any"),
            [el("option", {"value": p, "selected": p == chosen.get("phase")}, p) for p in PHASES],
        ),
        [
            (
                el("label", {"for": f"f-{key}"}, label),
                el("input", {"name": key, "id": f"f-{key}", "value": chosen.get(key, "")}),
            )
            for key, label in (("team", "Team"), ("agent", "Agent"), ("person", "Person"))
        ],
        el("button", {"type": "submit"}, "Filter"),
    )


def matches(run: Obj, chosen: Mapping[str, str]) -> bool:
    status, spec = _status(run), _spec(run)
    agents = [str(a) for a in _list(spec.get("agents"))]
    checks: dict[str, Callable[[str], bool]] = {
        "phase": lambda v: (status.get("phase") or "Pending") == v,
        "team": lambda v: spec.get("teamRef") == v,
        "agent": lambda v: v in agents or status.get("agent") == v,
        "person": lambda v: status.get("triggeredBy") == v,
    }
    return all(checks[k](v) for k, v in chosen.items() if v and k in checks)


def runs_table(runs: Iterable[Obj]) -> Html:
    rows = []
    for run in runs:
        meta, status = run.get("metadata", {}), _status(run)
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        phase = str(status.get("phase") or "Pending")
        rows.append(
            el(
                "tr",
                {"data-run": f"{namespace}/{name}"},
                el("td", {}, el("a", {"href": url("runs", namespace, name)}, name)),
                el("td", {}, namespace),
                el("td", {}, phase_badge(phase, str(status.get("reason") or ""))),
                el("td", {}, run_agents(run)),
                el("td", {}, str(status.get("triggeredBy") or "")),
                el("td", {}, str(status.get("attempt") or "")),
                el("td", {}, countdown(status.get("resumeAt"), phase)),
                el("td", {}, when(meta.get("creationTimestamp"))),
            )
        )
    head = el(
        "thead",
        {},
        el(
            "tr",
            {},
            [
                el("th", {"scope": "col"}, h)
                for h in (
                    "Run",
                    "Namespace",
                    "Phase",
                    "Agents",
                    "Started by",
                    "Attempt",
                    "Resumes",
                    "Created",
                )
            ],
        ),
    )
    empty = el("p", {"class": "empty"}, "No runs match.") if not rows else None
    return Html(el("table", {"class": "runs"}, head, el("tbody", {}, rows)) + (empty or ""))


def more_runs(matching: int, shown: int) -> Html:
    return el("p", {"class": "empty"}, f"The newest {shown} of {matching} matching runs: narrow the filters.")


def runs_page(
    table: Html,
    namespace: str,
    namespaces: list[str],
    chosen: Mapping[str, str],
    fragment_url: str,
    changes_url: str,
) -> Html:
    """The table is fetched again from `fragment_url` when `changes_url` (server-sent) says it changed."""
    live = {"data-refresh": fragment_url, "data-changes": changes_url}
    return Html(
        el("h1", {}, "Runs")
        + runs_filters(namespace, namespaces, chosen)
        + el("div", {"id": "runs", **live, "aria-live": "polite"}, table)
    )


def facts(pairs: Iterable[tuple[str, object]]) -> Html:
    return el("dl", {"class": "facts"}, [(el("dt", {}, k), el("dd", {}, v)) for k, v in pairs if v])


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
    meta, status, spec = run.get("metadata", {}), _status(run), _spec(run)
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    phase = str(status.get("phase") or "Pending")
    run_url = url("runs", namespace, name)
    item_ref = str(spec.get("workItemRef") or _dict(status.get("workItem")).get("ref") or "")
    usage = _dict(status.get("usage"))
    outputs = _dict(status.get("outputs"))
    artifacts = [a for a in _list(status.get("artifacts")) if isinstance(a, dict)]
    inputs = _dict(spec.get("inputs"))
    workflow = _dict(status.get("workflow"))
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


def items_page(namespace: str, namespaces: list[str], items: list[WorkItem]) -> Html:
    chooser = el(
        "form",
        {"method": "get", "action": url("items"), "class": "filters"},
        el("label", {"for": "i-namespace"}, "Namespace"),
        el("input", {"name": "namespace", "id": "i-namespace", "value": namespace, "list": "namespaces"}),
        el("datalist", {"id": "namespaces"}, [el("option", {"value": n}) for n in namespaces]),
        el("button", {"type": "submit"}, "Show"),
    )
    rows = [
        el(
            "tr",
            {},
            el("td", {}, el("a", {"href": url("items", i.namespace, i.item_id)}, i.item_id)),
            el("td", {}, i.title),
            el("td", {}, i.state),
            el("td", {}, i.created_by),
            el("td", {}, when(i.updated_at.isoformat())),
        )
        for i in items
    ]
    table = el(
        "table",
        {"class": "items"},
        el(
            "thead",
            {},
            el(
                "tr", {}, [el("th", {"scope": "col"}, h) for h in ("Item", "Title", "State", "By", "Updated")]
            ),
        ),
        el("tbody", {}, rows),
    )
    body = table if rows else el("p", {"class": "empty"}, "No work items here.")
    return Html(
        el("h1", {}, "Work items") + chooser + (body if namespace else el("p", {}, "Choose a namespace."))
    )


def entry_view(entry: ItemEvent) -> Html:
    """One entry of an item's thread: who wrote it (a person, or a Run's attempt for the person who started it),
    when, and what: a comment's text, a state change, an artifact with a link to its content."""
    author, data = entry.author, _dict(entry.data)
    who = (
        Html(el("strong", {}, "ksquad") + f" (the orchestrator, for {author.run})")
        if author.user == ORCHESTRATOR
        else Html(
            el("strong", {}, author.run)
            + f" (agent, attempt {author.attempt}, for {author.user or 'nobody'})"
        )
        if author.run
        else Html(el("strong", {}, author.user or "someone") + " (person)")
    )
    if entry.kind == "artifact":
        namespace, _, run = (author.run or "").partition("/")
        name = str(data.get("name") or "")
        what: Html = Html(
            "published "
            + el("a", {"href": url("runs", namespace, run, "artifacts", name)}, name)
            + escape(f" ({data.get('mediaType') or 'unknown type'}, {data.get('size') or '?'} bytes)")
        )
    elif entry.kind == "state":
        what = Html(
            escape(f"set the state to {data.get('state', '?')}")
            + (el("div", {"class": "body"}, entry.body) if entry.body else "")
        )
    else:
        what = el("div", {"class": "body"}, entry.body)
    return el(
        "li",
        {"class": f"entry entry-{entry.kind}"},
        el("p", {"class": "meta"}, who, f" · {entry.kind} · ", when(entry.at.isoformat())),
        what,
    )


def item_page(
    item: WorkItem,
    entries: list[ItemEvent],
    runs: list[Obj],
    csrf: str,
    refusal: str | None,
    older: int | None = None,
) -> Html:
    """`entries`: the newest page of the thread; `older`: where the page before it ends, when there is one."""
    thread = el("ol", {"class": "thread", "data-testid": "thread"}, [entry_view(e) for e in entries])
    if older is not None:
        link = url("items", item.namespace, item.item_id, before=str(older))
        thread = Html(
            el("p", {"class": "older"}, el("a", {"href": link, "data-testid": "older"}, "Older entries"))
            + thread
        )
    form = (
        el(
            "form",
            {
                "method": "post",
                "action": url("items", item.namespace, item.item_id, "comments"),
                "class": "comment",
            },
            el("input", {"type": "hidden", "name": "csrf", "value": csrf}),
            el("label", {"for": "comment"}, "Add a comment"),
            el("textarea", {"name": "body", "id": "comment", "rows": "4", "required": True}, ""),
            el("button", {"type": "submit", "data-testid": "add-comment"}, "Comment"),
        )
        if refusal is None
        else el("p", {"class": "why", "data-testid": "why-not-comment"}, refusal)
    )
    return Html(
        el("h1", {}, item.title, " ", el("span", {"class": "item-state"}, item.state))
        + facts([("Namespace", item.namespace), ("Id", item.item_id), ("Created by", item.created_by)])
        + el("div", {"class": "body"}, item.body)
        + el("h2", {}, "Thread")
        + thread
        + form
        + el("h2", {}, "Runs that worked it")
        + (runs_table(runs) if runs else el("p", {"class": "empty"}, "None yet."))
    )


def start_page(
    namespace: str,
    namespaces: list[str],
    agents: list[str],
    teams: list[str],
    csrf: str,
    values: Mapping[str, str],
    refusal: str | None,
) -> Html:
    choose = el(
        "form",
        {"method": "get", "action": url("start"), "class": "filters"},
        el("label", {"for": "s-namespace"}, "Namespace"),
        el("input", {"name": "namespace", "id": "s-namespace", "value": namespace, "list": "namespaces"}),
        el("datalist", {"id": "namespaces"}, [el("option", {"value": n}) for n in namespaces]),
        el("button", {"type": "submit"}, "Choose"),
    )
    if not namespace:
        return Html(el("h1", {}, "Start a run") + choose)
    target = values.get("target", "")
    options = [
        el("option", {"value": f"agent:{a}", "selected": target == f"agent:{a}"}, f"Agent {a}")
        for a in agents
    ]
    options += [
        el("option", {"value": f"team:{t}", "selected": target == f"team:{t}"}, f"Team {t}") for t in teams
    ]
    form = el(
        "form",
        {"method": "post", "action": url("start"), "class": "start"},
        el("input", {"type": "hidden", "name": "csrf", "value": csrf}),
        el("input", {"type": "hidden", "name": "namespace", "value": namespace}),
        el("label", {"for": "s-target"}, "Agent or Team"),
        el("select", {"name": "target", "id": "s-target", "required": True}, options),
        el("label", {"for": "s-name"}, "Run name (empty: made from the agent's)"),
        el("input", {"name": "name", "id": "s-name", "value": values.get("name", "")}),
        el("label", {"for": "s-item"}, "Work item (optional)"),
        el("input", {"name": "workItemRef", "id": "s-item", "value": values.get("workItemRef", "")}),
        el("label", {"for": "s-inputs"}, "Inputs, one name=value a line"),
        el("textarea", {"name": "inputs", "id": "s-inputs", "rows": "5"}, values.get("inputs", "")),
        el("button", {"type": "submit", "data-testid": "start"}, "Start the run"),
    )
    body = form if refusal is None else el("p", {"class": "why", "data-testid": "why-not-start"}, refusal)
    if not options and refusal is None:
        body = el("p", {"class": "empty"}, f"No Agent or Team in {namespace} to start a run with.")
    return Html(el("h1", {}, "Start a run in ", namespace) + choose + body)


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


SCOPE_TITLES = {"teams": "Team", "projects": "Project"}


def memory_chooser(namespace: str, namespaces: list[str], squads: list[tuple[str, str]]) -> Html:
    """The namespace's Teams and Projects (`squads`: (scope, name)), each a link to its memory."""
    chooser = el(
        "form",
        {"method": "get", "action": url("memory"), "class": "filters"},
        el("label", {"for": "m-namespace"}, "Namespace"),
        el("input", {"name": "namespace", "id": "m-namespace", "value": namespace, "list": "namespaces"}),
        el("datalist", {"id": "namespaces"}, [el("option", {"value": n}) for n in namespaces]),
        el("button", {"type": "submit"}, "Show"),
    )
    links = el(
        "ul",
        {"class": "squads"},
        [
            el(
                "li",
                {},
                el("a", {"href": url("memory", namespace, scope, name)}, f"{SCOPE_TITLES[scope]} {name}"),
            )
            for scope, name in squads
        ],
    )
    body = links if squads else el("p", {"class": "empty"}, "No Teams or Projects here.")
    return Html(
        el("h1", {}, "Squad memory") + chooser + (body if namespace else el("p", {}, "Choose a namespace."))
    )


def memory_entry_view(base: str, entry: MemoryEntry, csrf: str, refusal: str | None) -> Html:
    author = entry.author
    who = (
        Html(
            el("strong", {}, author.run)
            + f" (agent, attempt {author.attempt}, for {author.user or 'nobody'})"
        )
        if author.run
        else Html(el("strong", {}, author.user or "someone") + " (person)")
    )
    edited = f" · edited by {entry.edited_by}" if entry.edited_by else ""
    meta = el("p", {"class": "meta"}, who, f" · {entry.kind}{edited} · ", when(entry.created_at.isoformat()))
    if refusal is not None:
        return el(
            "li",
            {"class": "entry", "data-testid": "memory-entry"},
            meta,
            el("div", {"class": "body"}, entry.text),
        )
    action = f"{base}/{entry.id}"
    return el(
        "li",
        {"class": "entry", "data-testid": "memory-entry"},
        meta,
        el(
            "form",
            {"method": "post", "action": action, "class": "memory-edit"},
            el("input", {"type": "hidden", "name": "csrf", "value": csrf}),
            kind_select(f"kind-{entry.id}", entry.kind),
            el("label", {"for": f"text-{entry.id}"}, "Text"),
            el(
                "textarea",
                {"name": "text", "id": f"text-{entry.id}", "rows": "2", "required": True},
                entry.text,
            ),
            el(
                "button",
                {"type": "submit", "name": "do", "value": "save", "data-testid": "memory-save"},
                "Save",
            ),
            el(
                "button",
                {"type": "submit", "name": "do", "value": "delete", "data-testid": "memory-delete"},
                "Delete",
            ),
        ),
    )


def kind_select(field_id: str, chosen: str) -> Html:
    return Html(
        el("label", {"for": field_id}, "Kind")
        + el(
            "select",
            {"name": "kind", "id": field_id},
            [el("option", {"value": k, "selected": k == chosen}, k) for k in ("fact", "decision", "link")],
        )
    )


def memory_page(
    namespace: str,
    scope: str,
    name: str,
    entries: list[MemoryEntry],
    query: str,
    csrf: str,
    refusal: str | None,
) -> Html:
    """A Team's or Project's memory, newest first (those holding `query`), each entry editable by who may write."""
    base = url("memory", namespace, scope, name)
    search = el(
        "form",
        {"method": "get", "action": base, "class": "filters"},
        el("label", {"for": "m-search"}, "Search"),
        el("input", {"name": "q", "id": "m-search", "value": query, "data-testid": "memory-search"}),
        el("button", {"type": "submit"}, "Search"),
        el("a", {"href": f"{base}/export", "data-testid": "memory-export"}, "Export (JSON lines)"),
    )
    listed = el(
        "ol",
        {"class": "thread", "data-testid": "memory"},
        [memory_entry_view(base, e, csrf, refusal) for e in entries],
    )
    add = (
        el(
            "form",
            {"method": "post", "action": base, "class": "comment"},
            el("input", {"type": "hidden", "name": "csrf", "value": csrf}),
            kind_select("kind-new", "fact"),
            el("label", {"for": "memory-text"}, "Remember"),
            el("textarea", {"name": "text", "id": "memory-text", "rows": "3", "required": True}, ""),
            el("button", {"type": "submit", "data-testid": "memory-add"}, "Add"),
        )
        if refusal is None
        else el("p", {"class": "why", "data-testid": "why-not-remember"}, refusal)
    )
    empty = el("p", {"class": "empty"}, "Nothing matches." if query else "Nothing remembered yet.")
    return Html(
        el("h1", {}, f"Memory of {SCOPE_TITLES[scope]} {name}")
        + facts([("Namespace", namespace)])
        + search
        + (listed if entries else empty)
        + add
    )
