"""The allow-list contract (devtools.import_contracts) on a package of its own: what it lets through, and that
it names the module and the statement of each import it does not."""

from pathlib import Path

import grimp
import pytest

from devtools.import_contracts import AllowedImportsContract

CORE = {
    "__init__.py": "",
    "allowed.py": (
        "import asyncio\n"
        "from collections.abc import Callable\n"
        "from pydantic import BaseModel\n"
        "from temporalio import workflow\n"
        "from temporalio.common import RetryPolicy\n"
        "from core import allowed\n"
    ),
}


def check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **extra: str) -> list[tuple[str, str, int]]:
    for name, text in {**CORE, **extra}.items():
        (tmp_path / "core" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "core" / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("core", include_external_packages=True, cache_dir=None)
    contract = AllowedImportsContract(
        "the core's allow-list",
        session_options={},
        contract_options={
            "source_modules": ["core"],
            "allowed_modules": ["pydantic", "temporalio.workflow", "temporalio.common"],
        },
    )
    result = contract.check(graph, verbose=False)
    assert result.kept == (not result.metadata["disallowed"])
    return [(d.importer, d.imported, d.line_number) for d in result.metadata["disallowed"]]


def test_the_standard_library_the_allowed_modules_and_the_package_itself_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert check(tmp_path, monkeypatch) == []


def test_a_module_below_an_allowed_top_level_name_is_named_with_its_statement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = (
        "from temporalio.client import Client\n"
        "import cryptography\n"
        "from temporalio import (\n"
        "    workflow,\n"
        "    converter,\n"
        ")\n"
        "import temporalio\n"
    )
    assert sorted(check(tmp_path, monkeypatch, **{"bad.py": bad})) == [
        ("core.bad", "cryptography", 2),
        ("core.bad", "temporalio", 7),
        ("core.bad", "temporalio.client.Client", 1),
        ("core.bad", "temporalio.converter", 3),
    ]
