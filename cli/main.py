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
import gc
import io
import logging
import os
import sys
import time
from pathlib import Path
from typing import BinaryIO, TextIO

import httpx

from cli.items import items_command
from cli.memory import memory_command
from cli.runs import runs_command
from cli.targets import CliError, ClusterTarget, EmbeddedTarget, Target
from cli.usage import usage_command
from workflows.signals import RunSignal

STATE_DIR = Path(".ksquad")


async def target_command(args: argparse.Namespace) -> int:
    """The verbs that act on the embedded stack or a cluster: the target the options name, handed to the verb's
    family, and closed after."""
    target: Target = (
        ClusterTarget(args.kubeconfig, args.context, args.api or os.environ.get("KSQUAD_API"))
        if args.kubeconfig or args.context
        else EmbeddedTarget.from_state(args.state_dir, args.api or os.environ.get("KSQUAD_API"))
    )
    try:
        if args.command == "items":
            return await items_command(target, args)
        if args.command == "usage":
            return await usage_command(target, args)
        if args.command == "memory":
            return await memory_command(target, args)
        return await runs_command(target, args)
    finally:
        await target.close()


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

    gc.freeze()  # the stack's modules, as main() did the CLI's

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
    # What the imports built lives as long as the process: no garbage collection walks it again, nor does the
    # interpreter's exit (the worker's imports and exit: about a fifth less CPU).
    gc.freeze()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.stdout, sys.stderr = TerminalText(sys.stdout), TerminalText(sys.stderr)
    try:
        if args.command == "dev":
            code = asyncio.run(dev_command(args))
        elif args.command == "hello":
            code = asyncio.run(hello_command(args))
        else:
            code = asyncio.run(target_command(args))
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
