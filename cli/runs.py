"""The Run verbs: `ksquad run` (apply manifests) and `ksquad runs` (list, get, describe, watch, artifacts,
and the signals: cancel, pause, resume, input, delete), and how a Run is shown: its row, its description
and its events as they come."""

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from cli.targets import CliError, Target
from cli.text import age, table
from workflows.signals import RunSignal
from workflows.status import Phase

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
        if sys.stdout.isatty():  # shown: its control characters escaped (cli.main.TerminalText)
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


async def runs_command(target: Target, args: argparse.Namespace) -> int:
    """`ksquad run` (apply, then maybe watch the first Run) and `ksquad runs ACTION`."""
    as_json = args.output == "json"
    if args.command == "run":
        applied = await target.apply(read_manifests(args.filename))
        if as_json:
            print(json.dumps({"applied": applied}, indent=2))
        else:
            for a in applied:
                print(f"{a['kind'].lower()}.ksquad.io/{a['name']} {a['action']} (namespace {a['namespace']})")
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
