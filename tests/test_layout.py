"""Tests a newcomer can find (docs/testing.md, "Where a test goes").

- Unit tests mirror the wings: ``tests/<wing>/test_<module>[_<aspect>].py`` tests
  ``app/<wing>/<module>.py`` (``tests/rules/test_quotas_usage.py`` tests
  ``app/rules/quotas/usage.py``, ``tests/serve/test_httplimits_probes.py`` an aspect of
  ``app/serve/httplimits.py``). What is not a module of ``app/`` is named after one of
  TOPICS, at the top of ``tests/`` or in the wing it belongs to.
- No test file imports another: shared builders are in ``tests/helpers/`` (and
  ``e2e/builders.py``, ``e2e/harness/``), shared fixtures in a ``conftest.py``.
- ``request.getfixturevalue`` names a fixture of a conftest.py or of its own file.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"
TESTS = ROOT / "tests"
E2E = ROOT / "e2e"

TOPICS = {
    "chart": "the Helm chart (charts/envelope), its manifests, Dockerfile and monitoring",
    "docs": "what the documentation states: commands, metrics, links, schemas",
    "fuzz": "bad and random input through every rule and the real server",
    "layers": "docs/architecture.md's layer table against the imports",
    "layout": "this file: where tests go",
    "e2e_conftest": "e2e/conftest.py's ordering of the e2e tests",
    "image": "the container image: requirements.lock, make image",
    "sizes": "long modules, long functions and module headers say why, in true numbers",
}


def module_stems(app: Path = APP) -> set[str]:
    """``quotas_tree``, ``quotas``, ``view``, ``quantity``, ...: every module and package
    below ``app`` as a test file would name it (its path with ``_`` for ``/``), and the
    folder itself by its own name."""
    stems: set[str] = {app.name}
    for path in app.rglob("*.py"):
        parts = path.relative_to(app).with_suffix("").parts
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        for n in range(1, len(parts) + 1):  # packages too: quotas, quotas_tree
            stems.add("_".join(parts[:n]))
    return stems


def names_what_it_tests(stem: str, allowed: set[str]) -> bool:
    return any(stem == a or stem.startswith(a + "_") for a in allowed)


def misplaced(tests: Path = TESTS, app: Path = APP) -> list[str]:
    """Test files that are neither a topic at the top of tests/ nor, in tests/<wing>/,
    named after a module of app/<wing>/ (or a topic)."""
    wrong: list[str] = []
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests)
        stem = path.stem.removeprefix("test_")
        if len(rel.parts) == 1:
            allowed = set(TOPICS)
        else:
            wing = app.joinpath(*rel.parts[:-1])
            allowed = (module_stems(wing) if wing.is_dir() else set()) | set(TOPICS)
        if not names_what_it_tests(stem, allowed):
            wrong.append(rel.as_posix())
    return wrong


def test_unit_test_files_mirror_the_wings() -> None:
    wrong = misplaced()
    assert not wrong, ("a unit test of app/<wing>/<module>.py is tests/<wing>/test_<module>[_<aspect>].py; "
                       f"at the top of tests/ only the topics of tests/test_layout.py: {wrong}")


def test_the_naming_rule_can_refuse() -> None:
    allowed = {"quotas", "limits", "chart"}
    assert names_what_it_tests("quotas_properties", allowed)
    assert names_what_it_tests("limits", allowed)
    assert not names_what_it_tests("limitsx", allowed)
    assert not names_what_it_tests("quota", allowed)
    assert "quotas_tree" in module_stems(APP / "rules") and "view" in module_stems(APP / "cluster")


def test_a_test_in_the_wrong_wing_is_refused(tmp_path: Path) -> None:
    (tmp_path / "app" / "k8s").mkdir(parents=True)
    (tmp_path / "app" / "k8s" / "quantity.py").write_text("")
    (tmp_path / "tests" / "k8s").mkdir(parents=True)
    (tmp_path / "tests" / "rules").mkdir(parents=True)
    for name in ("k8s/test_quantity_parse.py", "rules/test_quantity.py", "test_quantity.py", "test_docs.py"):
        (tmp_path / "tests" / name).write_text("")
    assert misplaced(tmp_path / "tests", tmp_path / "app") == ["rules/test_quantity.py", "test_quantity.py"]


def _test_files() -> list[Path]:
    return sorted([*TESTS.rglob("*.py"), *E2E.glob("*.py")])


def _is_test_module(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last.startswith("test_") and (name.startswith("tests.") or "." not in name)


def imported_test_modules(source: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _is_test_module(node.module):
                found.append(node.module)
            elif node.module == "tests":
                found += [f"tests.{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def test_no_test_file_imports_another() -> None:
    found = {p.relative_to(ROOT).as_posix(): m for p in _test_files()
             if (m := imported_test_modules(p.read_text()))}
    assert not found, ("move what is shared into tests/helpers/ (builders), a conftest.py "
                       f"(fixtures) or e2e/builders.py: {found}")


def test_the_import_check_can_refuse() -> None:
    assert imported_test_modules("from tests.test_chart import render\n") == ["tests.test_chart"]
    late = "def f():\n    from test_workloads import deployment\n"
    assert imported_test_modules(late) == ["test_workloads"]
    assert imported_test_modules("from tests import test_cli, helpers\n") == ["tests.test_cli"]
    assert imported_test_modules("from tests.helpers.chart import render\nimport harness\n") == []


def _fixtures(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) \
                and any("fixture" in ast.unparse(d) for d in node.decorator_list):
            names.add(node.name)
    return names


def test_getfixturevalue_names_a_conftest_fixture_or_its_own() -> None:
    shared = _fixtures((TESTS / "conftest.py").read_text()) | _fixtures((E2E / "conftest.py").read_text())
    wrong: list[str] = []
    for path in _test_files():
        text = path.read_text()
        for name in re.findall(r"getfixturevalue\(\s*[\"'](\w+)[\"']", text):
            if name not in shared | _fixtures(text):
                wrong.append(f"{path.relative_to(ROOT)}: {name}")
    assert not wrong, f"put these fixtures in a conftest.py: {wrong}"
