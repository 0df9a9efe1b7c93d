"""docs/architecture.md stays a true map: every file and folder it names exists, and every symbol it names beside a
file, as in `workflows/policies.py` (`transition`), is defined there (a function, class, method or name)."""

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
MAP = ROOT / "docs" / "architecture.md"
PATH = re.compile(r"^[\w.\-/*]+(\.(py|yaml|md|tpl)|/)$")
# A file, then in parentheses the symbols it holds: (`transition`), (`Router.on_rate_limit`), (`a`, `b`: ...).
FILE_WITH_SYMBOLS = re.compile(r"`([\w.\-/]+\.py)`\s*\(((?:`[^`]+`(?:,\s*)?)+)")
IDENTIFIER = re.compile(r"^[A-Za-z_][\w.]*$")
TRACKED = [
    ROOT / line
    for line in subprocess.run(
        ["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
]


def where(name: str, section: str) -> list[Path]:
    """The files a name in the map may mean: a path from the repo's root (crd_bridge's in crd-bridge/), or, bare,
    a file of the section's own folder (`workflow.py` under "The Run workflow (`workflows/run/`)"), else one the
    row names the folder of (a chart template by its name)."""
    name = name.rstrip("/")
    candidates = [ROOT / name, ROOT / "crd-bridge" / name]
    if "/" not in name:
        candidates += [ROOT / section / name, *(p for p in TRACKED if p.name == name)]
    return [c for c in candidates if c.exists() or any(c.parent.glob(c.name))]


def defined(path: Path) -> set[str]:
    """Every name `path` defines: functions, classes and their methods (also as Class.method), assignments."""
    names: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(f"{node.name}.{item.name}")
                    elif isinstance(item, ast.AnnAssign | ast.Assign):
                        for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                            if isinstance(target, ast.Name):
                                names.add(f"{node.name}.{target.id}")
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    return names


def sections() -> list[tuple[str, str]]:
    """(the folder a section is about, or "", its text) for each `##` section of the map."""
    found = []
    for block in re.split(r"^## ", MAP.read_text(), flags=re.MULTILINE):
        folder = re.search(r"^[^\n]*\(`([\w\-/]+/)`\)", block)
        found.append((folder[1] if folder else "", block))
    return found


def test_every_path_the_map_names_exists() -> None:
    named = [(token, folder) for folder, text in sections() for token in re.findall(r"`([^`]+)`", text)]
    paths = [(token, folder) for token, folder in named if PATH.match(token) and not token.startswith(".")]
    assert len(paths) > 60, paths
    missing = [token for token, folder in paths if not where(token, folder)]
    assert not missing, f"docs/architecture.md names what is not there: {missing}"


def test_every_symbol_the_map_names_beside_a_file_is_defined_there() -> None:
    pairs = [
        (file, symbol, folder)
        for folder, text in sections()
        for file, inside in FILE_WITH_SYMBOLS.findall(text)
        for symbol in re.findall(r"`([^`]+)`", inside)
        if IDENTIFIER.match(symbol) and not PATH.match(symbol)
    ]
    assert len(pairs) > 10, pairs
    wrong = []
    for file, symbol, folder in pairs:
        paths = where(file, folder)
        if not paths or symbol not in defined(paths[0]):
            wrong.append(f"{file} ({symbol})")
    assert not wrong, f"docs/architecture.md names symbols its files do not define: {wrong}"
