"""The deterministic core stays deterministic: a static check of every module under workflows/.

The worker passes `workflows` through Temporal's workflow sandbox (worker/registry.py: re-importing it for each
new run cost 380 KB a cached run and ~18 ms of CPU). A module passed through is not restricted at run time: a
`datetime.now()` in it would run, and a replay on another worker would then take another path. So this test is
the guard the sandbox was: it fails on what the sandbox would have refused, and on what a shared module makes
newly dangerous (state kept at module level is shared by every run in the process). The replays of recorded
histories (test_replay.py) are the other half: they catch a change of commands.
"""

import ast
from pathlib import Path

import pytest

WORKFLOWS = Path(__file__).parents[2] / "workflows"

# What the core may import (import-linter keeps ksquad's own packages out): pure standard-library modules,
# pydantic, temporalio's workflow API, and the core itself.
ALLOWED_IMPORTS = {
    "__future__",
    "asyncio",
    "collections",
    "collections.abc",
    "contextlib",
    "contextvars",  # the proof the worker checked, set around each signal handler (workflows.inbox)
    "dataclasses",
    "datetime",
    "email.utils",  # parsedate_to_datetime: Retry-After as an HTTP date
    "enum",
    "functools",
    "math",
    "re",
    "typing",
    "pydantic",
    "pydantic.alias_generators",
    "temporalio",
    "temporalio.common",
    "temporalio.exceptions",
    "temporalio.workflow",
}
# temporalio's names the core may use (`from temporalio import ...`): not the client or the worker.
ALLOWED_TEMPORALIO = {"activity", "common", "exceptions", "workflow"}
# Calls whose result differs between the first run and a replay, or that touch the world.
FORBIDDEN_CALLS = {"open", "print", "input", "hash", "id", "eval", "exec", "compile", "__import__", "globals"}
# Clocks: workflow.now() is the only clock (datetime.now, date.today, utcnow... are the process's).
CLOCK_METHODS = {"now", "utcnow", "today", "fromtimestamp", "utcfromtimestamp"}
ASYNCIO_FORBIDDEN = {"get_event_loop", "get_running_loop", "new_event_loop", "run", "to_thread", "wait_for"}
MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend", "insert", "remove"}


def findings(source: str, name: str) -> list[str]:
    """What in `source` (the module `name`) would make a workflow non-deterministic, one line each."""
    tree = ast.parse(source)
    found: list[str] = []

    def at(node: ast.AST, what: str) -> None:
        found.append(f"{name}:{getattr(node, 'lineno', 0)}: {what}")

    module_names = _module_level_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _allowed_import(alias.name):
                    at(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not _allowed_import(node.module):
                at(node, f"imports from {node.module}")
            elif node.module == "temporalio":
                for alias in node.names:
                    if alias.name not in ALLOWED_TEMPORALIO:
                        at(node, f"imports temporalio.{alias.name}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                at(node, f"calls {func.id}()")
            elif isinstance(func, ast.Attribute):
                owner = _dotted(func.value)
                if func.attr in CLOCK_METHODS and owner != "workflow":
                    at(node, f"calls {owner}.{func.attr}(): the process's clock, not workflow.now()")
                elif owner == "asyncio" and func.attr in ASYNCIO_FORBIDDEN:
                    at(node, f"calls asyncio.{func.attr}()")
                elif func.attr in MUTATORS and owner in module_names:
                    at(node, f"changes module-level {owner}: every run in the process shares it")
        elif isinstance(node, ast.Global):
            at(node, f"declares global {', '.join(node.names)}: every run in the process shares it")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Subscript | ast.Attribute)
                    and _dotted(target.value) in module_names
                ):
                    at(
                        node,
                        f"changes module-level {_dotted(target.value)}: every run in the process shares it",
                    )
    return found


def _allowed_import(module: str) -> bool:
    return module in ALLOWED_IMPORTS or module == "workflows" or module.startswith("workflows.")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def _module_level_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level to a value (not its imports, functions or classes)."""
    names: set[str] = set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def core_modules() -> list[Path]:
    return sorted(WORKFLOWS.rglob("*.py"))


def test_the_core_makes_no_call_a_replay_could_not_repeat() -> None:
    assert len(core_modules()) > 20, "the check reads the whole core"
    found = [
        f for path in core_modules() for f in findings(path.read_text(), str(path.relative_to(WORKFLOWS)))
    ]
    assert found == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import datetime\nx = datetime.datetime.now()\n", "calls datetime.datetime.now()"),
        ("from datetime import date\nd = date.today()\n", "calls date.today()"),
        ("import random\n", "imports random"),
        ("import time\n", "imports time"),
        ("from uuid import uuid4\n", "imports from uuid"),
        ("import os\n", "imports os"),
        ("from temporalio import client\n", "imports temporalio.client"),
        ("with open('x') as f:\n    pass\n", "calls open()"),
        ("key = hash('run')\n", "calls hash()"),
        ("import asyncio\nasyncio.get_running_loop()\n", "calls asyncio.get_running_loop()"),
        ("SEEN = []\ndef f(x):\n    SEEN.append(x)\n", "changes module-level SEEN"),
        ("CACHE = {}\ndef f(k, v):\n    CACHE[k] = v\n", "changes module-level CACHE"),
        ("COUNT = 0\ndef f():\n    global COUNT\n    COUNT += 1\n", "declares global COUNT"),
    ],
)
def test_the_check_finds_what_the_sandbox_no_longer_refuses(source: str, expected: str) -> None:
    found = findings(source, "probe")
    assert any(expected in f for f in found), found


def test_the_workflow_clock_and_pure_code_pass() -> None:
    source = (
        "from temporalio import workflow\nimport datetime\n"
        "LIMITS = {'a': 1}\n"
        "def f(d):\n    d['x'] = LIMITS['a']\n    return workflow.now() + datetime.timedelta(seconds=1)\n"
    )
    assert findings(source, "probe") == []
