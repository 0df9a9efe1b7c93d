"""An import-linter contract type of our own: an allow-list of what a package may import.

import-linter's `forbidden` contract is a deny-list: whatever nobody thought to list gets in. The deterministic
core must stay replayable, so it may import only what is listed, and a Temporal client or an encryption
library cannot creep back by a name nobody forbade. pyproject.toml registers the type (`contract_types`);
lint-imports puts the working directory on sys.path, which is how it finds this module from the checkout.

With `include_external_packages`, grimp squashes a third-party package to its top-level name: an import of
`temporalio.client` and one of `temporalio.workflow` are both an import of `temporalio`. So each import
that leaves the package is read again from its source statement (the file, at the line grimp gives) to
know the dotted names it takes.
"""

import ast
import functools
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.imports import Module


@dataclass(frozen=True)
class Disallowed:
    importer: str
    imported: str  # the dotted name the statement takes, e.g. temporalio.client.Client
    line_number: int
    line_contents: str


class AllowedImportsContract(Contract):
    """The source packages import only themselves, the allowed modules (each with what is below it) and,
    unless `allow_standard_library` is false, the standard library (`sys.stdlib_module_names`).

    Configuration options:
        - source_modules:          the packages held to the list.
        - allowed_modules:         dotted names, e.g. `pydantic` or `temporalio.workflow`: `from temporalio
                                   import workflow` and `from temporalio.workflow import defn` are allowed by
                                   the latter, `from temporalio.client import Client` is not.
        - allow_standard_library:  true by default.
    """

    type_name = "allowed_imports"

    source_modules = fields.ListField(subfield=fields.ModuleField())
    allowed_modules = fields.ListField(subfield=fields.StringField())
    allow_standard_library = fields.BooleanField(required=False, default=True)

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        allowed = cast(list[str], self.allowed_modules)
        stdlib = sys.stdlib_module_names if cast(bool, self.allow_standard_library) else frozenset()
        disallowed: list[Disallowed] = []
        for source in cast(list[Module], self.source_modules):
            package = {source.name} | graph.find_descendants(source.name)
            for importer in sorted(package):
                for imported in sorted(graph.find_modules_directly_imported_by(importer) - package):
                    if imported.partition(".")[0] in stdlib:
                        continue
                    for detail in graph.get_import_details(importer=importer, imported=imported):
                        names = _names_taken(importer, detail["line_number"], imported) or [imported]
                        disallowed += [
                            Disallowed(importer, name, detail["line_number"], detail["line_contents"])
                            for name in names
                            if not _is_within(name, allowed)
                        ]
        return ContractCheck(kept=not disallowed, metadata={"disallowed": disallowed})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for d in check.metadata["disallowed"]:
            output.print_error(
                f"{d.importer} imports {d.imported}, which is not allowed "
                f"(l.{d.line_number}: {d.line_contents})",
                bold=False,
            )
            output.new_line()
        allowed = ", ".join(cast(list[str], self.allowed_modules))
        stdlib = " and the standard library" if cast(bool, self.allow_standard_library) else ""
        output.print_error(f"Allowed: the package itself, {allowed}{stdlib}.", bold=False)
        output.new_line()


def _is_within(name: str, allowed: list[str]) -> bool:
    return any(name == a or name.startswith(a + ".") for a in allowed)


def _names_taken(importer: str, line_number: int, imported: str) -> list[str]:
    """The dotted names that the import statement at `line_number` of `importer` takes from `imported`:
    `from temporalio.client import Client` takes temporalio.client.Client, `import temporalio.client`
    temporalio.client. Empty when the source cannot be read."""
    source = _source_file(importer)
    if source is None:
        return []
    names: list[str] = []
    for node in ast.walk(_parsed(source)):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        if not node.lineno <= line_number <= (node.end_lineno or node.lineno):
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif node.level == 0 and node.module:  # a relative import stays inside the package
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    return [name for name in names if name == imported or name.startswith(imported + ".")]


def _source_file(module: str) -> Path | None:
    """Where `module` is, found without importing it (nor the packages above it)."""
    top, *below = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None:
        return None
    if not spec.submodule_search_locations:
        return Path(spec.origin) if spec.origin else None
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*below)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _parsed(source: Path) -> ast.Module:
    return ast.parse(source.read_text(), filename=str(source))
