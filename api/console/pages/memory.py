"""Squad memory: a namespace's Teams and Projects, and one's memory (newest first, searched, exported), each
entry editable and a new one added by who may write it."""

from api.console.html import Html, el
from api.console.pages.layout import facts, url, when
from store import MemoryEntry

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
