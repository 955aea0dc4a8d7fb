"""Tests a newcomer can find (docs/testing.md, "Where a test goes").

- A unit test file is named after the module of ``app/`` it tests, its path with ``_``
  for ``/`` and an optional aspect: ``test_rules_quotas.py`` tests ``app/rules/quotas/``,
  ``test_limits_probes.py`` an aspect of ``app/limits.py``. Tests of what is not a module
  of ``app/`` are named after one of TOPICS.
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
}


def module_stems() -> set[str]:
    """``rules_quotas_tree``, ``rules_quotas``, ``cluster_view``, ``quantity``, ...: every
    module and package of app/ as a test file would name it."""
    stems: set[str] = set()
    for path in APP.rglob("*.py"):
        parts = path.relative_to(APP).with_suffix("").parts
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        for n in range(1, len(parts) + 1):  # packages too: rules, rules_quotas
            stems.add("_".join(parts[:n]))
    return stems


def names_what_it_tests(stem: str, allowed: set[str]) -> bool:
    return any(stem == a or stem.startswith(a + "_") for a in allowed)


def test_unit_test_files_are_named_after_a_module_or_a_topic() -> None:
    allowed = module_stems() | set(TOPICS)
    wrong = sorted(p.name for p in TESTS.glob("test_*.py")
                   if not names_what_it_tests(p.stem.removeprefix("test_"), allowed))
    assert not wrong, (f"name these after the app/ module they test (test_<path with _>[_<aspect>].py) "
                       f"or a topic of {sorted(TOPICS)} in tests/test_layout.py: {wrong}")


def test_the_naming_rule_can_refuse() -> None:
    allowed = {"rules_quotas", "limits", "chart"}
    assert names_what_it_tests("rules_quotas_properties", allowed)
    assert names_what_it_tests("limits", allowed)
    assert not names_what_it_tests("limitsx", allowed)
    assert not names_what_it_tests("quotas", allowed)
    assert "rules_quotas_tree" in module_stems() and "cluster_view" in module_stems()


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
