"""Work items: a namespace's list, and an item's page (its thread, newest first a page at a time, who wrote each
entry, the comment form or why not, and the Runs that worked it)."""

from api.console.backend import Obj
from api.console.html import Html, el, escape
from api.console.pages.layout import as_object, facts, url, when
from api.console.pages.runs import runs_table
from store import ItemEvent, WorkItem
from store.work_items import ORCHESTRATOR


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
    author, data = entry.author, as_object(entry.data)
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
