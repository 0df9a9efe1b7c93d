"""The attempt's work item, through the items API with the attempt's token (Contract.work_item): read into the
prompt before the first model call, so a retry or the next agent starts from what earlier attempts and people
wrote; marked in progress while an attempt works it, and done when one finishes, with a comment saying what
each attempt did. The item is context, not the task: when it cannot be read or written the attempt goes on
without it, and says so."""

import ssl
from functools import lru_cache
from typing import Any

import httpx2

from agent.contract import WorkItemAccess

TIMEOUT_SECONDS = 30.0
MAX_ENTRIES = 200  # the latest ones, when an item's record is longer
MAX_COMMENT = 4000


class WorkItemError(Exception):
    """The items API refused or did not answer; the message says which and why."""


@lru_cache(maxsize=4)
def trusting(ca: str) -> ssl.SSLContext:
    """A TLS context that trusts this CA alone: the item token goes to the API whose certificate it signed, and
    to no one a public CA vouches for."""
    return ssl.create_default_context(cadata=ca)


async def _call(access: WorkItemAccess, method: str, path: str, json: Any = None) -> Any:
    url = f"{access.url.rstrip('/')}/items/{access.namespace}/{access.id}{path}"
    try:
        verify: ssl.SSLContext | bool = trusting(access.ca) if access.ca else True
    except ssl.SSLError as err:
        raise WorkItemError(f"the contract's CA for the items API is no PEM certificate: {err}") from None
    try:
        async with httpx2.AsyncClient(timeout=TIMEOUT_SECONDS, verify=verify) as http:
            response = await http.request(
                method, url, json=json, headers={"Authorization": f"Bearer {access.token}"}
            )
    except httpx2.TransportError as err:
        raise WorkItemError(f"the items API at {access.url} does not answer: {err!r}") from None
    if response.status_code >= 300:
        try:
            reason = response.json().get("error")
        except ValueError:
            reason = None
        raise WorkItemError(f"the items API answered {response.status_code}: {reason or response.text[:200]}")
    return response.json()


async def read_item(access: WorkItemAccess) -> tuple[str, str]:
    """The item's state, and the item as the model reads it: its title, state, body, then its entries in order
    with their authors."""
    item = await _call(access, "GET", "")
    # The newest entries only, one request: an item's whole record is not read on every attempt.
    entries: list[dict[str, Any]] = (await _call(access, "GET", f"/entries?newest={MAX_ENTRIES + 1}"))[
        "entries"
    ]
    lines = [
        f"Work item {access.namespace}/{access.id}: {item['title']} (state: {item['state']})",
        *([item["body"]] if item["body"] else []),
    ]
    earlier = [e for e in entries if e["kind"] != "created"][-MAX_ENTRIES:]
    if earlier:
        lines.append("\nIts record so far, oldest first:")
    for entry in earlier:
        author = entry.get("author") or {}
        who = (
            f"{author['run']} attempt {author.get('attempt')}"
            if author.get("run")
            else author.get("user") or "?"
        )
        if entry["kind"] == "state":
            what = f"set the state to {(entry.get('data') or {}).get('state')}"
            what += f": {entry['body']}" if entry["body"] else ""
        elif entry["kind"] == "artifact":
            what = f"published the artifact {(entry.get('data') or {}).get('name')}"
        else:
            what = f"wrote: {entry['body']}"
        lines.append(f"- {who} {what}")
    return item["state"], "\n".join(lines)


async def comment(access: WorkItemAccess, text: str) -> None:
    await _call(access, "POST", "/comments", {"body": text[:MAX_COMMENT]})


async def set_state(access: WorkItemAccess, state: str) -> None:
    """Move the item to `state` (open, in-progress, blocked, done; the API says which moves its state allows)."""
    await _call(access, "POST", "/state", {"state": state})
