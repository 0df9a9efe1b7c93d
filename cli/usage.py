"""`ksquad usage`: the model calls and tokens the agents reported, summed over a window."""

import argparse
import json
import sys

from cli.targets import Target
from cli.text import table


async def usage_command(target: Target, args: argparse.Namespace) -> int:
    query = {"by": args.by, "since": args.since}
    if args.until:
        query["until"] = args.until
    if not args.all_namespaces:
        query["namespace"] = args.namespace or target.namespace
    found = await target.usage(query)
    if args.output == "json":
        print(json.dumps(found, indent=2))
        return 0
    where = f"namespace {found['namespace']}" if found.get("namespace") else "all namespaces"
    window = f"{found['since'][:19]}Z to {found['until'][:19]}Z"
    if not found["items"]:
        print(f"No model calls in {where} from {window}.", file=sys.stderr)
        return 0
    rows = [
        [str(u[args.by]), str(u["calls"]), str(u["inputTokens"]), str(u["outputTokens"])]
        for u in found["items"]
    ]
    print(f"Model usage in {where}, {window}, by {args.by}:")
    print(table([args.by.upper(), "CALLS", "INPUT TOKENS", "OUTPUT TOKENS"], rows))
    return 0
