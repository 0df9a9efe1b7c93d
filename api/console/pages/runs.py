"""The runs list: its filters (namespace, phase, Team, Agent, person), which Runs they match, and the table the
page fetches again when told it changed (also the table of an item's page: the Runs that worked it)."""

from collections.abc import Callable, Iterable, Mapping

from api.console.backend import Obj
from api.console.html import Html, el
from api.console.pages.layout import PHASES, as_list, countdown, phase_badge, spec_of, status_of, url, when


def run_agents(run: Obj) -> str:
    spec = spec_of(run)
    agents = as_list(spec.get("agents"))
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
    status, spec = status_of(run), spec_of(run)
    agents = [str(a) for a in as_list(spec.get("agents"))]
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
        meta, status = run.get("metadata", {}), status_of(run)
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
