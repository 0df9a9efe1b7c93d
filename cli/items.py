"""The work-item verbs (`ksquad items`: list, create, get, comment, close, reopen) and how an item and its
entries are shown."""

import argparse
import json
import sys
from typing import Any

from cli.targets import Target
from cli.text import age, table


def author(entry: dict[str, Any]) -> str:
    """Who wrote an item's entry: a person, or an agent's Run and attempt for the person who started it."""
    who = entry.get("author") or {}
    if entry.get("kind") == "ended":  # ksquad's own record of a Run's ending
        return "ksquad"
    if who.get("run"):
        return f"{who['run']} (attempt {who.get('attempt')}, for {who.get('user') or '-'})"
    return str(who.get("user") or "-")


def describe_item(item: dict[str, Any], entries: list[dict[str, Any]]) -> str:
    lines = [
        f"Work item {item['namespace']}/{item['item_id']}: {item['title']}",
        f"  state:    {item['state']}",
        f"  by:       {item['created_by']} ({age(item['created_at'])} ago)",
    ]
    if item["labels"]:
        lines.append(f"  labels:   {', '.join(item['labels'])}")
    if item["body"]:
        lines += ["", *(f"  {line}" for line in item["body"].splitlines())]
    lines.append("")
    for e in entries:
        what = {"state": f"-> {(e.get('data') or {}).get('state')}", "artifact": "artifact"}.get(
            e["kind"], e["kind"]
        )
        detail = e["body"] if e["kind"] != "artifact" else (e.get("data") or {}).get("name", "")
        lines.append(
            f"  #{e['seq']} {age(e['at'])} ago, {author(e)}: {what}" + (f": {detail}" if detail else "")
        )
    return "\n".join(lines)


async def items_command(target: Target, args: argparse.Namespace) -> int:
    as_json = args.output == "json"
    action = args.action
    namespace = args.namespace or target.namespace
    base = f"/items/{namespace}"
    if action == "list":
        query = f"?state={args.state}" if args.state else ""
        found = (await target.items("GET", base + query))["items"]
        if as_json:
            print(json.dumps({"items": found}, indent=2))
        elif not found:
            print(f"No work items in namespace {namespace}.", file=sys.stderr)
        else:
            rows = [
                [i["item_id"], i["state"], i["title"][:60], i["created_by"], age(i["updated_at"])]
                for i in found
            ]
            print(table(["ID", "STATE", "TITLE", "BY", "UPDATED"], rows))
        return 0
    item_url = f"{base}/{args.id}"
    if action == "create":
        body = {"id": args.id, "title": args.title, "body": args.body or "", "labels": args.label or []}
        created = await target.items("POST", base, body)
        print(json.dumps(created) if as_json else f"work item {namespace}/{args.id} created")
        return 0
    if action == "get":
        item = await target.items("GET", item_url)
        entries: list[dict[str, Any]] = []
        while True:  # a page at a time: an item's record can be long
            after = entries[-1]["seq"] if entries else 0
            page = (await target.items("GET", f"{item_url}/entries?after={after}"))["entries"]
            entries += page
            if not page or entries[-1]["seq"] >= item["last_seq"]:
                break
        print(json.dumps({**item, "entries": entries}, indent=2) if as_json else describe_item(item, entries))
        return 0
    if action == "comment":
        entry = await target.items("POST", f"{item_url}/comments", {"body": args.text})
        print(
            json.dumps(entry)
            if as_json
            else f"work item {namespace}/{args.id}: comment #{entry['seq']} added"
        )
        return 0
    state = {"close": "done", "reopen": "open"}[action]
    entry = await target.items("POST", f"{item_url}/state", {"state": state, "note": args.note or ""})
    print(json.dumps(entry) if as_json else f"work item {namespace}/{args.id}: {state}")
    return 0
