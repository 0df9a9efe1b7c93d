"""The attempt's work item, through the items API with the attempt's token (Contract.work_item): read into the
prompt before the first model call, so a retry or the next agent starts from what earlier attempts and people
wrote; marked in progress while an attempt works it, and done when one finishes, with a comment saying what
each attempt did. The item is context, not the task: when it cannot be read or written the attempt goes on
without it, and says so."""

from typing import Any

from agent.contract import WorkItemAccess
from agent.ksquad_api import ApiRefused, ApiUnreachable, call

MAX_ENTRIES = 200  # the latest ones, when an item's record is longer
MAX_COMMENT = 4000


class WorkItemError(Exception):
    """The items API refused or did not answer; the message says which and why."""


async def _call(access: WorkItemAccess, method: str, path: str, json: Any = None) -> Any:
    try:
        return await call(
            access.url, access.token, access.ca, method, f"/items/{access.namespace}/{access.id}{path}", json
        )
    except ApiRefused as err:
        raise WorkItemError(f"the items API answered {err.status}: {err.reason}") from None
    except ApiUnreachable as err:
        raise WorkItemError(str(err).replace("the API", "the items API")) from None


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
        elif entry["kind"] == "ended":  # the orchestrator's record of a Run's ending
            who = "ksquad"
            what = f"recorded: {entry['body']}"
        else:
            what = f"wrote: {entry['body']}"
        lines.append(f"- {who} {what}")
    return item["state"], "\n".join(lines)


async def comment(access: WorkItemAccess, text: str) -> None:
    await _call(access, "POST", "/comments", {"body": text[:MAX_COMMENT]})


async def set_state(access: WorkItemAccess, state: str) -> None:
    """Move the item to `state` (open, in-progress, blocked, done; the API says which moves its state allows)."""
    await _call(access, "POST", "/state", {"state": state})
