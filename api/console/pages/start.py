"""Starting a run: choose the namespace, then an Agent or a Team, a name, a work item and inputs (or why the
person may not)."""

from collections.abc import Mapping

from api.console.html import Html, el
from api.console.pages.layout import url


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
