"""`ksquad`: the command line.

  ksquad dev [--demo]                 the embedded stack: Temporal's dev server and UI, a worker with local
                                      sandboxes and SQLite, the reference agent, a model (no cluster needed)
  ksquad run -f FILE [-f FILE] [-w]   apply Runs and what they reference (the manifests kubectl takes)
  ksquad runs list [-n NS | -A]       the Runs, their phase, reason, attempt and age
  ksquad runs get NAME                one Run (-o yaml|json for all of it)
  ksquad runs watch NAME              phase changes, resume countdowns and agent progress, live
  ksquad runs cancel|pause|resume NAME [--reason TEXT]
  ksquad runs delete NAME             cancel it, wait for the workflow to end, and remove it
  ksquad items list [-n NS] [--state S]        work items: the coordination record runs and people share
  ksquad items create ID --title T [--body B] [--label L]...
  ksquad items get ID                 the item and its entries: comments, state changes, artifacts, who wrote each
  ksquad items comment ID TEXT        a comment, as you
  ksquad items close ID [--note N]    mark it done (`ksquad items reopen ID` opens it again)
  ksquad usage [--by credential|namespace|person|model] [--since 24h] [--until T] [-n NS | -A]
                                      model calls and tokens the agents reported, summed over a window
  ksquad hello [--keep]               a small workflow on Temporal's dev server (a smoke check)

The runs and items commands talk to the stack `ksquad dev` started from this directory (found through
.ksquad/dev.json), or to a cluster with --kubeconfig. `-o json` prints machine-readable output everywhere;
NAME may be NAMESPACE/NAME. Errors go to stderr with exit status 1.
"""

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO
from urllib.parse import urlencode

import httpx
import yaml

from cli.targets import CliError, ClusterTarget, EmbeddedTarget, Target
from workflows.signals import RunSignal
from workflows.status import Phase

STATE_DIR = Path(".ksquad")


def age(timestamp: str | None) -> str:
    if not timestamp:
        return "-"
    seconds = int(
        (datetime.now(UTC) - datetime.fromisoformat(timestamp.replace("Z", "+00:00"))).total_seconds()
    )
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


RUN_COLUMNS = ["NAMESPACE", "NAME", "PHASE", "REASON", "ATTEMPT", "AGENT", "ITEM", "TOKENS", "AGE"]


def tokens(usage: dict[str, Any] | None) -> str:
    """A run's model tokens, in+out ("-" before any call)."""
    if not usage:
        return "-"
    return f"{usage.get('inputTokens') or 0}+{usage.get('outputTokens') or 0}"


def run_row(run: dict[str, Any]) -> list[str]:
    meta, status = run["metadata"], run.get("status") or {}
    return [
        meta["namespace"],
        meta["name"],
        status.get("phase") or "-",
        status.get("reason") or "-",
        str(status.get("attempt") or 0),
        status.get("agent") or "-",
        (run.get("spec") or {}).get("workItemRef") or "-",
        tokens(status.get("usage")),
        age(meta.get("creationTimestamp")),
    ]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
    )


def describe(run: dict[str, Any]) -> str:
    meta, status = run["metadata"], run.get("status") or {}
    lines = [
        f"Run {meta['namespace']}/{meta['name']} (uid {meta.get('uid')})",
        f"  phase:    {status.get('phase') or 'Pending'}"
        + (f" ({status['reason']})" if status.get("reason") else ""),
    ]
    for label, key in (
        ("message", "message"),
        ("attempt", "attempt"),
        ("agent", "agent"),
        ("model", "model"),
        ("resumes", "resumeAt"),
        ("by", "triggeredBy"),
    ):
        if status.get(key):
            lines.append(f"  {label + ':':<10}{status[key]}")
    ref, claimed = (run.get("spec") or {}).get("workItemRef"), status.get("workItem")
    if ref:
        what = ""  # not claimed yet: whether it names an item is not known
        if claimed:
            what = (
                " (its record: ksquad items get)" if claimed.get("item") else " (names no work item: a lock)"
            )
        lines.append(f"  item:     {ref}{what}")
    if status.get("usage"):
        used = status["usage"]
        lines.append(
            f"  usage:    {used.get('calls') or 0} model calls, {used.get('inputTokens') or 0} tokens in, "
            f"{used.get('outputTokens') or 0} out"
        )
    if status.get("workflow"):
        lines.append(f"  workflow: {status['workflow'].get('id')} (run {status['workflow'].get('runId')})")
    for key, value in (status.get("outputs") or {}).items():
        lines.append(f"  output {key}: {value}")
    for c in status.get("conditions") or []:
        lines.append(
            f"  condition {c['type']}={c['status']} ({c['reason']}) {c.get('message') or ''}".rstrip()
        )
    return "\n".join(lines)


def split_name(name: str, namespace: str) -> tuple[str, str]:
    return tuple(name.split("/", 1)) if "/" in name else (namespace, name)  # type: ignore[return-value]


def read_manifests(files: list[str]) -> list[Any]:
    docs = []
    for file in files:
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text()
            docs += [d for d in yaml.safe_load_all(text) if d is not None]
        except OSError as err:
            raise CliError(f"cannot read {file}: {err.strerror}") from None
        except yaml.YAMLError as err:
            raise CliError(f"{file} is not valid YAML: {err}") from None
    return docs


class Watcher:
    """Prints a run's events; while it is paused with a resume time, counts down (on a terminal)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.resume_at: datetime | None = None
        self.live = sys.stdout.isatty() and not as_json
        self.countdown_shown = False

    def show(self, event: dict[str, Any]) -> None:
        if self.as_json:
            print(json.dumps(event), flush=True)
            return
        self.clear_countdown()
        data = event.get("data") or {}
        at = (event.get("at") or datetime.now(UTC).isoformat())[11:19]
        print(f"{at}  {event.get('kind', ''):<9} {event.get('message', '')}", flush=True)
        if event.get("kind") == "phase":
            resume = data.get("resumeAt")
            self.resume_at = (
                datetime.fromisoformat(resume) if resume and data.get("phase") == Phase.PAUSED else None
            )
            if self.resume_at and not self.live:
                print(
                    f"          resumes at {self.resume_at:%H:%M:%S} (in {self.seconds_left():.0f}s)",
                    flush=True,
                )

    def seconds_left(self) -> float:
        assert self.resume_at is not None
        return max(0.0, (self.resume_at - datetime.now(UTC)).total_seconds())

    def tick(self) -> None:
        if self.live and self.resume_at is not None:
            sys.stdout.write(f"\r          resuming in {self.seconds_left():4.0f}s ")
            sys.stdout.flush()
            self.countdown_shown = True

    def clear_countdown(self) -> None:
        if self.countdown_shown:
            sys.stdout.write("\r" + " " * 40 + "\r")
            self.countdown_shown = False


async def artifacts(target: Target, namespace: str, name: str, artifact: str | None, as_json: bool) -> int:
    """Without `artifact`: the Run's artifacts (from its status). With it: that artifact's content, raw."""
    if artifact is not None:
        content = await target.artifact(namespace, name, artifact)
        if sys.stdout.isatty():  # shown: its control characters escaped (TerminalText)
            print(content.decode("utf-8", errors="replace"), end="")
        else:  # into a file or a pipe: the bytes as the agent wrote them
            sys.stdout.buffer.write(content)
        sys.stdout.buffer.flush()
        return 0
    listed = ((await target.get(namespace, name)).get("status") or {}).get("artifacts") or []
    if as_json:
        print(json.dumps({"items": listed}, indent=2))
    elif not listed:
        print(f"Run {namespace}/{name} has no artifacts.", file=sys.stderr)
    else:
        rows = [[a.get("name", ""), a.get("mediaType") or "", str(a.get("size") or "")] for a in listed]
        print(table(["NAME", "TYPE", "SIZE"], rows))
    return 0


async def watch(target: Target, namespace: str, name: str, as_json: bool) -> int:
    watcher = Watcher(as_json)
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def read() -> None:
        try:
            async for event in target.events(namespace, name, 0):
                await queue.put(event)
        finally:
            await queue.put(None)

    reader = asyncio.create_task(read())
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:
                watcher.tick()
                continue
            if event is None:
                break
            watcher.show(event)
        reader.result()  # an error of the stream surfaces here
    finally:
        reader.cancel()
    watcher.clear_countdown()
    run = await target.get(namespace, name)
    phase = (run.get("status") or {}).get("phase")
    if not as_json:
        print(describe(run))
    return 0 if phase != Phase.FAILED else 2


async def runs_command(args: argparse.Namespace) -> int:
    target: Target = (
        ClusterTarget(args.kubeconfig, args.context, args.api or os.environ.get("KSQUAD_API"))
        if args.kubeconfig or args.context
        else EmbeddedTarget.from_state(args.state_dir, args.api or os.environ.get("KSQUAD_API"))
    )
    as_json = args.output == "json"
    try:
        if args.command == "items":
            return await items_command(target, args)
        if args.command == "usage":
            return await usage_command(target, args)
        if args.command == "memory":
            return await memory_command(target, args)
        if args.command == "run":
            applied = await target.apply(read_manifests(args.filename))
            if as_json:
                print(json.dumps({"applied": applied}, indent=2))
            else:
                for a in applied:
                    print(
                        f"{a['kind'].lower()}.ksquad.io/{a['name']} {a['action']} (namespace {a['namespace']})"
                    )
            runs = [a for a in applied if a["kind"] == "Run"]
            if args.watch and runs:
                return await watch(target, runs[0]["namespace"], runs[0]["name"], as_json)
            return 0
        action = args.action
        if action == "list":
            items = await target.list(None if args.all_namespaces else args.namespace or target.namespace)
            if as_json:
                print(json.dumps({"items": items}, indent=2))
            elif not items:
                print("No runs found.", file=sys.stderr)
            else:
                print(
                    table(
                        RUN_COLUMNS,
                        [run_row(r) for r in items],
                    )
                )
            return 0
        namespace, name = split_name(args.name, args.namespace or target.namespace)
        if action == "get":
            run = await target.get(namespace, name)
            if as_json:
                print(json.dumps(run, indent=2))
            elif args.output == "yaml":
                print(yaml.safe_dump(run, sort_keys=False), end="")
            else:
                print(table(RUN_COLUMNS, [run_row(run)]))
            return 0
        if action == "artifacts":
            return await artifacts(target, namespace, name, args.artifact, as_json)
        if action == "describe":
            print(describe(await target.get(namespace, name)))
            return 0
        if action == "watch":
            return await watch(target, namespace, name, as_json)
        if action == "delete":
            await target.delete(namespace, name)
            result = {"run": f"{namespace}/{name}", "deleted": True}
        else:
            argument = args.text if action == RunSignal.INPUT else getattr(args, "reason", None)
            await target.signal(namespace, name, RunSignal(action), argument)
            result = {"run": f"{namespace}/{name}", "signal": action}
        print(
            json.dumps(result)
            if as_json
            else f"run {namespace}/{name}: {action} sent"
            if action != "delete"
            else f"run {namespace}/{name} deleted"
        )
        return 0
    finally:
        await target.close()


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


def log_to_file(path: Path) -> None:
    """The stack's log in full goes to `path`; the terminal gets warnings, without the tracebacks of activity
    failures the workflows handle (a 429 is news in the run's events, not a stack trace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(path)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in root.handlers:
        handler.setLevel(logging.WARNING)
        handler.addFilter(lambda record: not record.name.startswith("temporalio.activity"))
    root.addHandler(to_file)
    for noisy in ("httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


async def dev_command(args: argparse.Namespace) -> int:
    # Imported here: the stack's modules take a second to import, and the runs commands need none of them.
    from dev.demo import run_demo, run_real_model_demo
    from dev.stack import DevOptions, dev_stack, private_state, serve

    private_state(args.state_dir)  # before the log file: it too is this user's only
    log_to_file(args.state_dir / "dev.log")
    if args.real_model and not os.environ.get("OPENAI_BASE_URL"):
        print("ksquad dev --real-model: set OPENAI_BASE_URL (and OPENAI_MODEL, OPENAI_API_KEY) to the model")
        return 2
    options = DevOptions(state_dir=args.state_dir, scripted_model=args.demo and not args.real_model)
    for port in ("temporal_port", "ui_port", "api_port", "model_port"):
        if getattr(args, port) is not None:
            setattr(options, port, getattr(args, port))
    if not args.demo:
        return await serve(options)
    t0 = time.monotonic()
    async with dev_stack(options) as dev:
        print(
            f"ksquad dev is up in {time.monotonic() - t0:.1f}s: Temporal UI {dev.ui_url}, API {dev.api_url}"
        )
        code = await (run_real_model_demo(dev) if args.real_model else run_demo(dev))
    print(f"demo finished in {time.monotonic() - t0:.0f}s")
    return code


async def hello_command(args: argparse.Namespace) -> int:
    from dev.hello import hello

    return await hello(args.keep, args.state_dir)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ksquad", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--state-dir", type=Path, default=STATE_DIR, help="the embedded stack's state (default .ksquad)"
    )
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("dev", help="run the embedded stack until Ctrl-C")
    d.add_argument("--demo", action="store_true", help="run the demo's three runs, print a summary, and stop")
    d.add_argument(
        "--real-model",
        action="store_true",
        help="with --demo: the seed's Run against the model at OPENAI_BASE_URL instead (make demo MODEL=local)",
    )
    for port, default in (
        ("temporal-port", 7233),
        ("ui-port", 8233),
        ("api-port", 8234),
        ("model-port", 8400),
    ):
        d.add_argument(f"--{port}", type=int, help=f"(default {default}, or any free port when it is taken)")

    def target_options(q: argparse.ArgumentParser, output: tuple[str, ...] = ("json",)) -> None:
        q.add_argument("-o", "--output", choices=output, help="machine-readable output")
        q.add_argument(
            "--kubeconfig",
            help="use the cluster of this kubeconfig (several joined with ':', as in $KUBECONFIG) instead of "
            "the embedded stack",
        )
        q.add_argument(
            "--context",
            help="the kubeconfig context to use (default: its current-context); implies a cluster",
        )
        q.add_argument(
            "--api",
            help="the embedded stack's API (default: from .ksquad/dev.json); with a cluster, ksquad-api's URL "
            "(default: the chart's api.url, from the ClusterRole ksquad-locator, which must say https)",
        )

    r = sub.add_parser("run", help="apply Runs and the objects they reference")
    r.add_argument("-f", "--filename", action="append", required=True, help="a YAML file ('-' for stdin)")
    r.add_argument("-w", "--watch", action="store_true", help="then watch the (first) Run until it ends")
    target_options(r)

    runs = sub.add_parser("runs", help="list, inspect, follow and steer runs")
    actions = runs.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help="the Runs of a namespace (-A: all)")
    ls.add_argument("-n", "--namespace", help="default: the context's namespace on a cluster, else default")
    ls.add_argument("-A", "--all-namespaces", action="store_true")
    target_options(ls)
    for action, help_text in (
        ("get", "one Run"),
        ("describe", "one Run, its status in words"),
        ("watch", "follow a Run until it ends"),
        ("cancel", "cancel a Run"),
        ("pause", "pause a Run (it resumes with `resume`)"),
        ("resume", "resume a paused Run"),
        ("delete", "cancel and remove a Run"),
        ("artifacts", "list a Run's artifacts, or write one's content to stdout"),
        ("input", "answer the question of a Run paused for input (InputRequired)"),
    ):
        q = actions.add_parser(action, help=help_text)
        q.add_argument("name", help="NAME or NAMESPACE/NAME")
        q.add_argument(
            "-n", "--namespace", help="default: the context's namespace on a cluster, else default"
        )
        if action in (RunSignal.CANCEL, RunSignal.PAUSE):
            q.add_argument("--reason", help="recorded in the Run's status")
        if action == "artifacts":
            q.add_argument(
                "artifact", nargs="?", help="an artifact's name: its content, as the agent made it"
            )
        if action == RunSignal.INPUT:
            q.add_argument("text", help="the answer, as the agent will read it")
        target_options(q, ("json", "yaml") if action == "get" else ("json",))

    items = sub.add_parser("items", help="work items: create, list, read, comment on and close them")
    item_actions = items.add_subparsers(dest="action", required=True)
    for action, help_text in (
        ("list", "the work items of a namespace"),
        ("create", "a new work item, open"),
        ("get", "one work item and its entries"),
        ("comment", "comment on a work item, as you"),
        ("close", "mark a work item done"),
        ("reopen", "open a done work item again"),
    ):
        q = item_actions.add_parser(action, help=help_text)
        if action != "list":
            q.add_argument("id", help="the item's id (what a Run's spec.workItemRef names)")
        q.add_argument(
            "-n", "--namespace", help="default: the context's namespace on a cluster, else default"
        )
        if action == "list":
            q.add_argument("--state", choices=("open", "in-progress", "blocked", "done"))
        if action == "create":
            q.add_argument("--title", required=True, help="one line")
            q.add_argument("--body", help="what the item is about, as the agent will read it")
            q.add_argument("--label", action="append", help="a label (again for more)")
        if action == "comment":
            q.add_argument("text", help="the comment")
        if action in ("close", "reopen"):
            q.add_argument("--note", help="why, recorded with the change")
        target_options(q)

    memory = sub.add_parser(
        "memory", help="a Team's or a Project's memory: list, search, add, edit, delete, export"
    )
    memory_actions = memory.add_subparsers(dest="action", required=True)
    for action, help_text in (
        ("list", "its entries, newest first"),
        ("add", "a new entry, as you"),
        ("edit", "change an entry"),
        ("delete", "delete an entry"),
        ("export", "every entry, oldest first, as JSON lines"),
    ):
        q = memory_actions.add_parser(action, help=help_text)
        q.add_argument("memory", help="team/NAME or project/NAME")
        q.add_argument(
            "-n", "--namespace", help="default: the context's namespace on a cluster, else default"
        )
        if action == "list":
            q.add_argument("--search", help="entries whose text holds this (any case)")
            q.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
        if action in ("edit", "delete"):
            q.add_argument("id", type=int, help="the entry's number")
        if action in ("add", "edit"):
            q.add_argument("text", help="the entry, as agents will read it")
            q.add_argument("--kind", choices=("fact", "decision", "link"), default="fact")
        target_options(q)

    u = sub.add_parser(
        "usage", help="model calls and tokens, summed by credential, namespace, person or model"
    )
    u.add_argument("--by", choices=("credential", "namespace", "person", "model"), default="credential")
    u.add_argument(
        "--since",
        default="24h",
        help="a time (2026-12-04T10:00:00Z) or a duration back from now (default 24h)",
    )
    u.add_argument("--until", help="a time or a duration back from now (default now)")
    u.add_argument("-n", "--namespace", help="default: the context's namespace on a cluster, else default")
    u.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace (a cluster-wide list)"
    )
    target_options(u)

    h = sub.add_parser("hello", help="a small workflow on Temporal's dev server (a smoke check)")
    h.add_argument("--keep", action="store_true", help="keep the dev server and its UI running afterwards")
    return p


class TerminalText(io.TextIOBase):
    """A text stream that shows control characters instead of sending them: what ksquad prints comes in part from
    agents and the people who write to work items (an answer, a question, a comment, a failure's message), and an
    escape sequence there would otherwise move the cursor, rewrite the screen or set the terminal's title. Newlines
    and tabs pass; every other C0 and C1 control and DEL is printed as its escape (\\x1b). JSON output escapes
    them itself; an artifact's bytes written to a file (not a terminal) are left as they are."""

    def __init__(self, raw: TextIO) -> None:
        self.raw = raw

    def write(self, text: str) -> int:
        self.raw.write(text.translate(SHOWN))
        return len(text)

    def flush(self) -> None:
        self.raw.flush()

    def isatty(self) -> bool:
        return self.raw.isatty()

    @property
    def buffer(self) -> BinaryIO:
        return self.raw.buffer


SHOWN = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x0A, 0x09)}


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.stdout, sys.stderr = TerminalText(sys.stdout), TerminalText(sys.stderr)
    try:
        if args.command == "dev":
            code = asyncio.run(dev_command(args))
        elif args.command == "hello":
            code = asyncio.run(hello_command(args))
        else:
            code = asyncio.run(runs_command(args))
    except CliError as err:
        print(f"Error: {err}", file=sys.stderr)
        for problem in err.problems:
            print(f"  {problem}", file=sys.stderr)
        code = 1
    except (KeyError, TypeError, ValueError, AttributeError, httpx.HTTPError) as err:
        # An answer of a shape the CLI does not expect (an API that is not ksquad's, a version apart): one line.
        if os.environ.get("KSQUAD_DEBUG"):
            raise
        print(
            f"Error: an unexpected answer ({type(err).__name__}: {err}); KSQUAD_DEBUG=1 shows where",
            file=sys.stderr,
        )
        code = 1
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
