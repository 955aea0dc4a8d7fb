"""docs/architecture.md's layer table is what the imports do.

The table is read from the document (its "## The layers" section): each row names a
layer and its modules, lowest layer first. A module may import modules of its own row
and of the rows above it, never of a row below it — every import counts: at module
level, inside a function, and those only for type checkers (a type is knowledge too).
Every module of ``app/`` must be in the table; a package's ``__init__.py`` that imports
nothing of ``app`` is only a marker and needs no row. An entry ending in ``/`` (``rules/quotas/``)
covers every module below it, unless a module is named itself.

When a module is missing, the failure names the rows it could go in, from what it
imports and what imports it, so the table is fixed by adding one name to one row.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
DOC = ROOT / "docs" / "architecture.md"


@dataclass(frozen=True)
class Row:
    index: int
    name: str
    entries: tuple[str, ...]
    """As written in the table: ``quantity.py``, ``cluster/view.py``, ``rules/quotas/``."""

    def shown(self) -> str:
        return f"row {self.index + 1} {self.name!r}"


def parse_table(text: str) -> list[Row]:
    """The rows of the first table under ``## The layers``, lowest layer first."""
    section = re.search(r"^## The layers\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if section is None:
        raise AssertionError(f"{DOC.name} has no '## The layers' section")
    rows: list[Row] = []
    for line in section.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or cells[0] in ("layer", "") \
                or set(cells[0]) <= set("-: "):
            continue
        entries = tuple(re.findall(r"`([^`]+)`", cells[1]))
        rows.append(Row(len(rows), cells[0], entries))
    if not rows:
        raise AssertionError(f"{DOC.name}'s '## The layers' section has no table rows")
    return rows


def module_name(path: Path, app: Path = APP) -> str:
    parts = path.relative_to(app.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, is_package: bool, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (module ``name``) imports, anywhere in it."""
    known = set(known)
    package = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            targets = [module, *(f"{module}.{a.name}" for a in node.names)]
        for target in targets:
            if target in known and target != name:
                found.add(target)
    return found


def import_graph(app: Path = APP) -> tuple[dict[str, set[str]], dict[str, Path]]:
    paths = {module_name(p, app): p for p in sorted(app.rglob("*.py"))}
    graph = {name: imports_of(path.read_text(), name, path.name == "__init__.py", paths)
             for name, path in paths.items()}
    # ``from app.rules import base`` names the package too; a package that is only a
    # marker (is_marker) is no dependency.
    markers = {name for name, path in paths.items() if is_marker(path, graph[name])}
    return {name: targets - markers for name, targets in graph.items()}, paths


def entry_of(name: str, path: Path, app: Path = APP) -> str:
    """How the table writes a module: its path below ``app/``."""
    return path.relative_to(app).as_posix()


def layer_of(entry: str, rows: list[Row]) -> Row | None:
    """The row naming ``entry`` itself, else the row of the deepest package entry over it."""
    best: tuple[int, Row] | None = None
    for row in rows:
        for written in row.entries:
            if written == entry:
                return row
            if written.endswith("/") and entry.startswith(written) \
                    and (best is None or len(written) > best[0]):
                best = (len(written), row)
    return best[1] if best else None


def is_marker(path: Path, imports: set[str]) -> bool:
    return path.name == "__init__.py" and not imports


def _short(modules: Iterable[str]) -> str:
    return ", ".join(sorted(m.removeprefix("app.") for m in modules))


def problems(rows: list[Row], graph: Mapping[str, set[str]], paths: Mapping[str, Path],
             app: Path = APP) -> list[str]:
    """Every way the table and the imports disagree, each saying what to change."""
    out: list[str] = []
    rows_of: dict[str, Row | None] = {}
    for name, path in paths.items():
        rows_of[name] = None if is_marker(path, graph[name]) else layer_of(entry_of(name, path, app), rows)
    listed = {entry_of(n, p, app) for n, p in paths.items()}
    for row in rows:
        for written in row.entries:
            if written.endswith("/"):
                if not any(e.startswith(written) for e in listed):
                    out.append(f"{row.shown()} names `{written}`, but app/{written} has no modules: "
                               "remove it from the table")
            elif written not in listed:
                out.append(f"{row.shown()} names `{written}`, but there is no app/{written}: "
                           "remove it from the table (or fix its name)")
    for name, path in paths.items():
        if rows_of[name] is not None or is_marker(path, graph[name]):
            continue
        importers = sorted(m for m, targets in graph.items() if name in targets)
        below = [r for t in graph[name] if (r := rows_of.get(t)) is not None]
        above = [r for m in importers if (r := rows_of.get(m)) is not None]
        low = max((r.index for r in below), default=0)
        high = min((r.index for r in above), default=len(rows) - 1)
        entry = entry_of(name, path, app)
        why = (f"(it imports {_short(graph[name])}" if graph[name] else "(it imports nothing of app") \
            + (f"; imported by {_short(importers)})" if importers else ")")
        if low <= high:
            fits = " or ".join(rows[i].shown() for i in range(low, high + 1))
            out.append(f"app/{entry} is not in {DOC.name}'s layer table: add `{entry}` to "
                       f"{rows[low].shown()} (it fits {fits}) {why}")
        else:
            out.append(f"app/{entry} is not in {DOC.name}'s layer table and no row fits: it needs at "
                       f"least {rows[low].shown()} for its imports but is imported from "
                       f"{rows[high].shown()} {why}; move code so its imports go one way")
    for name, targets in sorted(graph.items()):
        mine = rows_of[name]
        if mine is None:
            continue
        for target in sorted(targets):
            theirs = rows_of.get(target)
            if theirs is not None and theirs.index > mine.index:
                out.append(f"app/{entry_of(name, paths[name], app)} ({mine.shown()}) imports "
                           f"{target} ({theirs.shown()}, a higher layer): imports go only to the "
                           "same row or rows above it — move the code it needs down, or the module up")
    return out


def test_the_layer_table_is_what_the_imports_do() -> None:
    rows = parse_table(DOC.read_text())
    graph, paths = import_graph()
    found = problems(rows, graph, paths)
    assert not found, "\n".join(found)


def test_every_row_has_modules_and_no_module_is_in_two_rows() -> None:
    rows = parse_table(DOC.read_text())
    assert len(rows) >= 3, [r.name for r in rows]
    seen: dict[str, str] = {}
    for row in rows:
        assert row.entries, f"{row.shown()} names no modules"
        for entry in row.entries:
            assert entry not in seen, f"`{entry}` is in {seen[entry]!r} and {row.name!r}"
            seen[entry] = row.name


# --- the check itself, on a small made-up app/ ------------------------------------------

TABLE = """# Architecture

## The layers

| layer | modules | what it knows |
|---|---|---|
| arithmetic | `util.py`, `quantity.py` | numbers |
| rules | `rules/` | rules |
| engine | `engine.py` | judging |
| shell | `cli.py`, `gone.py` | flags |

Imports go one way.

## Next section

| layer | modules |
|---|---|
| not | `parsed.py` |
"""


def _fake_app(tmp_path: Path, files: dict[str, str]) -> Path:
    app = tmp_path / "app"
    for rel, text in {"__init__.py": "", **files}.items():
        (app / rel).parent.mkdir(parents=True, exist_ok=True)
        (app / rel).write_text(text)
    return app


@pytest.fixture
def fake_app(tmp_path: Path) -> Path:
    return _fake_app(tmp_path, {
        "util.py": "",
        "quantity.py": "from app.util import x\n",
        "rules/__init__.py": "",
        "rules/base.py": "from app.quantity import parse\n",
        "rules/bad.py": "def f():\n    from app.engine import evaluate\n",
        "rules/typed.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from app import cli\n"),
        "engine.py": "from . import quantity\nfrom .rules import base\n",
        "cli.py": "import app.engine\nfrom app.kinds import KINDS\n",
        "kinds.py": "from app.quantity import parse\n",
        "render/__init__.py": "from app.render.text import render\n",
        "render/text.py": "from app.engine import Evaluation\n",
    })


def test_the_table_is_read_from_its_section_only() -> None:
    rows = parse_table(TABLE)
    assert [(r.name, r.entries) for r in rows] == [
        ("arithmetic", ("util.py", "quantity.py")), ("rules", ("rules/",)),
        ("engine", ("engine.py",)), ("shell", ("cli.py", "gone.py"))]


def test_an_import_of_a_higher_layer_is_named_with_both_rows(fake_app: Path) -> None:
    graph, paths = import_graph(fake_app)
    assert graph["app.rules.bad"] == {"app.engine"}
    assert graph["app.engine"] == {"app.quantity", "app.rules.base"}
    found = problems(parse_table(TABLE), graph, paths, fake_app)
    assert ("app/rules/bad.py (row 2 'rules') imports app.engine (row 3 'engine', a higher layer): "
            "imports go only to the same row or rows above it — move the code it needs down, "
            "or the module up") in found
    # Type-only imports count; relative imports resolve; a marker package has no row.
    assert any(p.startswith("app/rules/typed.py (row 2 'rules') imports app.cli (row 4 'shell'")
               for p in found), found
    assert not any(p.startswith(("app/engine.py", "app/quantity.py", "app/rules/base.py",
                                 "app/rules/__init__.py")) for p in found), found


def test_a_missing_module_is_told_which_row_to_join(fake_app: Path) -> None:
    graph, paths = import_graph(fake_app)
    found = problems(parse_table(TABLE), graph, paths, fake_app)
    # kinds.py imports arithmetic and is imported by the shell: rows 1 to 4 fit.
    assert ("app/kinds.py is not in architecture.md's layer table: add `kinds.py` to row 1 "
            "'arithmetic' (it fits row 1 'arithmetic' or row 2 'rules' or row 3 'engine' or "
            "row 4 'shell') (it imports quantity; imported by cli)") in found
    # render/text.py imports the engine: the engine's row or the shell's.
    assert any(p.startswith("app/render/text.py is not in architecture.md's layer table: add "
                            "`render/text.py` to row 3 'engine' (it fits row 3 'engine' or row 4 "
                            "'shell')") for p in found), found
    # A package __init__ that imports something is a module like any other.
    assert any(p.startswith("app/render/__init__.py is not in") for p in found), found
    assert ("row 4 'shell' names `gone.py`, but there is no app/gone.py: remove it from the table "
            "(or fix its name)") in found


def test_a_missing_module_that_no_row_fits_says_so(tmp_path: Path) -> None:
    app = _fake_app(tmp_path, {
        "util.py": "from app.kinds import KINDS\n", "quantity.py": "", "rules/x.py": "",
        "engine.py": "", "cli.py": "", "gone.py": "", "kinds.py": "from app import cli\n"})
    graph, paths = import_graph(app)
    found = problems(parse_table(TABLE), graph, paths, app)
    assert ("app/kinds.py is not in architecture.md's layer table and no row fits: it needs at "
            "least row 4 'shell' for its imports but is imported from row 1 'arithmetic' (it "
            "imports cli; imported by util); move code so its imports go one way") in found
