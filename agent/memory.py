"""The squad's memory, as the reference agent uses it (api.memory, with the attempt's token): the newest entries of
its Run's Team's and Project's memories go into the conversation before the first model call, and the model may add
an entry with the agent's own tool `ksquad_remember` (a fact, a decision or a link), written under the attempt's
fence. Memory is context: when it cannot be read the attempt goes on without it and says so; an attempt fenced off
is told so (Superseded) and stops."""

import json
from typing import Any

from agent.contract import AttemptApi
from agent.journal import Superseded
from agent.ksquad_api import ApiRefused, ApiUnreachable, call

REMEMBER = "ksquad_remember"
NEWEST = 50  # entries of each memory read into the conversation


def remember_tool(api: AttemptApi) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": REMEMBER,
            "description": "Remember a fact, a decision or a link for your squad's later Runs (they read it at "
            "their start). Keep it short and true.",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "kind": {"type": "string", "enum": ["fact", "decision", "link"]},
                    "memory": {"type": "string", "enum": api.memory},
                },
                "required": ["text"],
            },
        },
    }


async def recall(api: AttemptApi, namespace: str) -> str | None:
    """The squad's memories as the model reads them (None: all empty). ApiRefused/ApiUnreachable when one cannot
    be read; Superseded when the attempt is no longer current."""
    lines: list[str] = []
    for memory in api.memory:
        try:
            answer = await call(
                api.url, api.token, api.ca, "GET", f"/memory/{namespace}/{memory}?limit={NEWEST}"
            )
        except ApiRefused as err:
            if err.status == 409:
                raise Superseded(err.reason) from None
            raise
        entries = answer["entries"]
        if not entries:
            continue
        scope, _, name = memory.partition("/")
        lines.append(
            f"\nWhat your squad remembers ({'Team' if scope == 'teams' else 'Project'} {name}), newest first:"
        )
        for entry in entries:
            author = entry.get("author") or {}
            who = (
                f"{author['run']} attempt {author.get('attempt')}"
                if author.get("run")
                else author.get("user", "?")
            )
            lines.append(f"- [{entry['kind']}] {entry['text']} (by {who})")
    return "\n".join(lines).strip() or None


async def remember(api: AttemptApi, namespace: str, arguments: str) -> tuple[str, bool]:
    """The model's `ksquad_remember` call: (what the tool answers, whether it is an error)."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as err:
        return f"arguments are not JSON: {err}", True
    memory = args.get("memory") or api.memory[0]
    if memory not in api.memory:
        return f"no memory {memory!r}: this Run's are {', '.join(api.memory)}", True
    body = {"kind": args.get("kind") or "fact", "text": str(args.get("text") or "")}
    try:
        entry = await call(api.url, api.token, api.ca, "POST", f"/memory/{namespace}/{memory}", body)
    except ApiRefused as err:
        if err.status == 409:
            raise Superseded(err.reason) from None
        return f"not remembered: {err.reason}", True
    except ApiUnreachable as err:
        return f"not remembered: {err}", True
    return f"remembered in {memory} as entry {entry['id']}", False
