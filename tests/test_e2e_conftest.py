"""e2e/conftest.py's ordering: tests marked ``last`` run after all others, and the two
that must (the API-server restart, the caller tokens) carry the marker."""

from __future__ import annotations

import ast
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

E2E = Path(__file__).resolve().parent.parent / "e2e"


def _conftest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("e2e_conftest_under_test", E2E / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Item:
    name: str
    markers: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_last_items_move_to_the_end_in_their_order() -> None:
    items = [Item("a"), Item("restart", ("last",)), Item("b", ("e2e",)), Item("token", ("e2e", "last")),
             Item("c")]
    _conftest().run_last(items)
    assert [i.name for i in items] == ["a", "b", "c", "restart", "token"]


def test_nothing_marked_keeps_the_order() -> None:
    items = [Item("b"), Item("a"), Item("c")]
    _conftest().run_last(items)
    assert [i.name for i in items] == ["b", "a", "c"]


def _module_mark(path: Path) -> str | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                for t in node.targets):
            return ast.unparse(node.value)
    return None


def test_the_tests_that_must_run_last_are_marked() -> None:
    for name in ("test_apiserver_restart.py", "test_caller_token.py"):
        assert _module_mark(E2E / name) == "pytest.mark.last", name


def test_no_file_is_named_to_sort_last() -> None:
    named = sorted(p.name for p in E2E.glob("test_z*.py"))
    assert not named, f"order e2e tests with @pytest.mark.last, not by file name: {named}"
