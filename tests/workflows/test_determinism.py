"""The deterministic core stays deterministic: a static check of every module under workflows/.

The worker runs workflows without Temporal's sandbox (worker/registry.py: UnsandboxedWorkflowRunner, for what the
sandbox costs: `python -m bench.workflow_sandbox`), so nothing restricts them at run time: a `datetime.now()` in
workflows/ would run, and a replay on another worker would then take another path. So this test is the guard the
sandbox would be: it fails on what the sandbox refuses (the process's clock, even passed uncalled as a
`default_factory`; randomness, uuids, the environment and I/O through their imports; the parts of `email.utils`
that read the clock), on iteration over a set (its order is the process's hash seed's, not the history's), and on
what a shared module makes newly dangerous (state kept at module level is shared by every run in the process).
The replays of recorded histories (test_replay.py) are the other half: they catch a change of commands.
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
    "email.utils",  # parsedate_to_datetime (Retry-After as an HTTP date) only: EMAIL_UTILS_ALLOWED
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
CLOCK_OWNERS = {"datetime", "date", "time", "pendulum", "arrow"}  # datetime.datetime.now, date.today, ...
ASYNCIO_FORBIDDEN = {"get_event_loop", "get_running_loop", "new_event_loop", "run", "to_thread", "wait_for"}
# email.utils' pure parser; the rest reads the clock (formatdate, localtime), the host or randomness (make_msgid).
EMAIL_UTILS_ALLOWED = {"parsedate_to_datetime"}
# What walks a collection in its own order (a set's is the process's hash seed's).
ORDERED_WALKS = {"list", "tuple", "enumerate", "zip", "next", "iter", "join", "map", "filter", "reversed"}
SET_TYPES = {"set", "frozenset", "Set", "AbstractSet", "MutableSet"}
MUTATORS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend", "insert", "remove"}


def findings(source: str, name: str) -> list[str]:
    """What in `source` (the module `name`) would make a workflow non-deterministic, one line each."""
    tree = ast.parse(source)
    found: list[str] = []

    def at(node: ast.AST, what: str) -> None:
        found.append(f"{name}:{getattr(node, 'lineno', 0)}: {what}")

    module_names = _module_level_names(tree)
    set_names = _set_typed_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not _allowed_import(alias.name):
                    at(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if not _allowed_import(node.module):
                at(node, f"imports from {node.module}")
            elif node.module == "email.utils":
                for alias in node.names:
                    if alias.name not in EMAIL_UTILS_ALLOWED:
                        at(node, f"imports email.utils.{alias.name}")
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
                if owner == "asyncio" and func.attr in ASYNCIO_FORBIDDEN:
                    at(node, f"calls asyncio.{func.attr}()")
                elif func.attr in MUTATORS and owner in module_names:
                    at(node, f"changes module-level {owner}: every run in the process shares it")
            if _walks_in_set_order(node, set_names):
                at(node, "walks a set: its order is the process's hash seed's (sorted() it)")
        elif isinstance(node, ast.Attribute):
            owner = _dotted(node.value)
            if node.attr in CLOCK_METHODS and owner != "workflow" and owner.split(".")[-1] in CLOCK_OWNERS:
                at(node, f"uses {owner}.{node.attr}: the process's clock, not workflow.now()")
            elif owner in ("email.utils", "utils") and node.attr not in EMAIL_UTILS_ALLOWED:
                at(node, f"uses email.utils.{node.attr}")
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            if _is_set(node.iter, set_names):
                at(
                    node if isinstance(node, ast.stmt) else node.iter,
                    "iterates a set: its order is the process's hash seed's (sorted() it)",
                )
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


def _set_typed_names(tree: ast.Module) -> set[str]:
    """Names (variables, attributes, fields) the module annotates or assigns as a set."""

    def set_typed(annotation: ast.AST | None) -> bool:
        while isinstance(annotation, ast.Subscript):
            annotation = annotation.value
        return annotation is not None and _dotted(annotation).split(".")[-1] in SET_TYPES

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            if set_typed(node.annotation):
                names.add(node.arg)
            continue
        if isinstance(node, ast.AnnAssign):
            typed = set_typed(node.annotation)
        elif isinstance(node, ast.Assign):
            typed = _is_set(node.value, set())
        else:
            continue
        for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if typed and isinstance(target, ast.Name | ast.Attribute):
                names.add(target.id if isinstance(target, ast.Name) else target.attr)
    return names


def _is_set(node: ast.AST, set_names: set[str]) -> bool:
    """A set literal or comprehension, set()/frozenset(), a set operation on one, or a name typed as a set."""
    if isinstance(node, ast.Set | ast.SetComp):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("set", "frozenset")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr | ast.BitAnd | ast.Sub | ast.BitXor):
        return _is_set(node.left, set_names) or _is_set(node.right, set_names)
    if isinstance(node, ast.Name):
        return node.id in set_names
    if isinstance(node, ast.Attribute):
        return node.attr in set_names
    return False


def _walks_in_set_order(call: ast.Call, set_names: set[str]) -> bool:
    """list(s), tuple(s), ",".join(s), next(iter(s)), s.pop(): a set's order taken as if it were the history's."""
    func = call.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    if isinstance(func, ast.Attribute) and func.attr == "pop" and not call.args:
        return _is_set(func.value, set_names)
    return name in ORDERED_WALKS and any(_is_set(arg, set_names) for arg in call.args)


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
        ("import datetime\nx = datetime.datetime.now()\n", "uses datetime.datetime.now"),
        ("from datetime import date\nd = date.today()\n", "uses date.today"),
        (  # the clock handed over uncalled: pydantic calls it when a model is made, in the workflow
            "from datetime import datetime\nfrom pydantic import BaseModel, Field\n"
            "class M(BaseModel):\n    at: datetime = Field(default_factory=datetime.now)\n",
            "uses datetime.now",
        ),
        ("import datetime\nx = datetime.datetime.utcnow\n", "uses datetime.datetime.utcnow"),
        ("from email.utils import formatdate\n", "imports email.utils.formatdate"),
        ("import email.utils\nx = email.utils.formatdate()\n", "uses email.utils.formatdate"),
        ("from email import utils\nx = utils.make_msgid()\n", "uses email.utils.make_msgid"),
        ("def f(xs):\n    for x in set(xs):\n        yield x\n", "iterates a set"),
        ("def f():\n    return [x for x in {'a', 'b'}]\n", "iterates a set"),
        ("KINDS = {'a', 'b'}\ndef f():\n    return list(KINDS)\n", "walks a set"),
        (
            "class R:\n    seen: set[str]\n    def f(self):\n        for s in self.seen:\n            pass\n",
            "iterates a set",
        ),
        ("def f(a: frozenset[str], b: set[str]):\n    return ','.join(a | b)\n", "walks a set"),
        ("S = frozenset({'x'})\ndef f():\n    return S.pop()\n", "walks a set"),
        ("import secrets\n", "imports secrets"),
        ("from os import environ\n", "imports from os"),
        ("import socket\n", "imports socket"),
        ("from pathlib import Path\n", "imports from pathlib"),
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
        "from temporalio import workflow\nimport datetime\nfrom email.utils import parsedate_to_datetime\n"
        "LIMITS = {'a': 1}\nKINDS = frozenset({'a'})\n"
        "def f(d, x):\n    d['x'] = LIMITS['a']\n    ok = x in KINDS and sorted(KINDS)\n"
        "    return workflow.now() + datetime.timedelta(seconds=1)\n"
    )
    assert findings(source, "probe") == []
