"""HTML built so that nothing a Run, an agent or a comment contains can become markup: every string is escaped
when it is placed, and only `Html` values (made here, from escaped parts) are placed as they are.

    el("a", {"href": url}, "the run ", el("b", {}, name))   ->   <a href="...">the run <b>...</b></a>

Attribute names are fixed by the code; attribute values and text are escaped (quotes too). A URL attribute
takes only the page's own paths or http(s) addresses (`href`), so a `javascript:` link cannot be made from data.
"""

import html
from collections.abc import Iterable, Mapping
from urllib.parse import quote

# Elements with no content and no closing tag.
VOID = frozenset({"br", "hr", "input", "meta", "link", "img"})
URL_ATTRIBUTES = frozenset({"href", "src", "action", "formaction"})


class Html(str):
    """Markup made by this module: placed as it is. Joined with a plain string (`+`, either side), the string
    is escaped: text never becomes markup by being added to some."""

    __slots__ = ()

    def __add__(self, other: object) -> "Html":
        return Html(str.__add__(self, render(other)))

    def __radd__(self, other: object) -> "Html":
        return Html(str.__add__(render(other), self))


def escape(value: object) -> Html:
    return Html(html.escape(str(value), quote=True))


def safe_url(url: str) -> str:
    """`url` when it is one of the page's own paths or an http(s) address; "#" otherwise."""
    if "\\" in url or any(ord(c) < 0x21 for c in url):
        return "#"  # a browser reads a backslash as a slash ("/" + "\\host" is "//host") and drops tabs
    if url.startswith("/") and not url.startswith("//"):
        return url
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    return url if scheme in ("http", "https") else "#"


def render(child: object) -> Html:
    """A child as markup: `Html` as it is, None and False as nothing, lists in order, anything else escaped."""
    if isinstance(child, Html):
        return child
    if child is None or child is False:
        return Html("")
    if isinstance(child, str | int | float):
        return escape(child)
    if isinstance(child, Iterable):
        return Html("".join(render(c) for c in child))
    return escape(child)


def el(tag: str, attrs: Mapping[str, object] | None = None, *children: object) -> Html:
    """An element: attributes with a value of None or False are left out, True is written bare."""
    parts = [tag]
    for name, value in (attrs or {}).items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(name)
            continue
        text = str(value)
        if name in URL_ATTRIBUTES:
            text = safe_url(text)
        parts.append(f'{name}="{escape(text)}"')
    head = f"<{' '.join(parts)}>"
    if tag in VOID:
        return Html(head)
    return Html(f"{head}{render(children)}</{tag}>")


def path(*segments: str, query: Mapping[str, str] | None = None) -> str:
    """A path of the console from segments, each percent-encoded (a name with "/" or "?" stays one segment)."""
    url = "/" + "/".join(quote(s, safe="") for s in segments)
    pairs = [(k, v) for k, v in (query or {}).items() if v]
    if pairs:
        url += "?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)
    return url
