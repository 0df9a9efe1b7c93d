"""The squad-memory verbs (`ksquad memory`: list, search, add, edit, delete, export a Team's or a
Project's memory)."""

import argparse
import json
import sys
from typing import Any
from urllib.parse import urlencode

from cli.targets import CliError, Target
from cli.text import age, table

MEMORY_EXPORT_LIMIT = 1000  # a memory's most entries, and the API's largest page (store.memory)


def memory_url(memory: str, namespace: str) -> str:
    """team/NAME or project/NAME as the API's path."""
    scope, _, name = memory.partition("/")
    plural = {"team": "teams", "teams": "teams", "project": "projects", "projects": "projects"}.get(scope)
    if plural is None or not name:
        raise CliError(f"{memory!r}: name a Team's memory as team/NAME, or a Project's as project/NAME")
    return f"/memory/{namespace}/{plural}/{name}"


async def memory_command(target: Target, args: argparse.Namespace) -> int:
    as_json = args.output == "json"
    namespace = args.namespace or target.namespace
    base = memory_url(args.memory, namespace)
    what = f"the memory of {args.memory} in {namespace}"
    if args.action == "list":
        query = urlencode({"q": args.search or "", "limit": args.limit})
        found = await target.items("GET", f"{base}?{query}", what=what)
        if as_json:
            print(json.dumps(found, indent=2))
        elif not found["entries"]:
            print(f"Nothing in {what}{' matches' if args.search else ''}.", file=sys.stderr)
        else:
            rows = [
                [str(e["id"]), e["kind"], e["text"][:70], memory_author(e), age(e["created_at"])]
                for e in found["entries"]
            ]
            print(table(["ID", "KIND", "TEXT", "BY", "AGE"], rows))
        return 0
    if args.action == "export":
        exported = await target.items("GET", f"{base}?limit={MEMORY_EXPORT_LIMIT}", what=what)
        for entry in reversed(exported["entries"]):
            print(json.dumps({"namespace": namespace, "memory": args.memory, **entry}))
        return 0
    if args.action == "add":
        entry = await target.items("POST", base, {"kind": args.kind, "text": args.text}, what=what)
        print(json.dumps(entry) if as_json else f"{what}: entry {entry['id']} added")
        return 0
    if args.action == "edit":
        entry = await target.items(
            "PUT", f"{base}/{args.id}", {"kind": args.kind, "text": args.text}, what=what
        )
        print(json.dumps(entry) if as_json else f"{what}: entry {args.id} changed")
        return 0
    await target.items("DELETE", f"{base}/{args.id}", what=what)
    print(f"{what}: entry {args.id} deleted")
    return 0


def memory_author(entry: dict[str, Any]) -> str:
    author = entry.get("author") or {}
    if author.get("run"):
        return f"{author['run']} #{author.get('attempt')} for {author.get('user') or '?'}"
    return str(author.get("user") or "?")
