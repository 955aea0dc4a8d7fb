"""``fix`` and ``krm-fn`` linear in the operations of one object (issue 38, class 7): a
Deployment of 1,000 containers took 162 s, each of its ~2,000 operations composing the
whole document again. Operations inside list items are now written item by item; the
text is the same as writing them one by one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

import app.fix.edit as fix
from app.cluster.static import compose
from app.fix.edit import patch_text

DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "big", "namespace": "a"},
              "spec": {"template": {"spec": {"containers": []}}}}


def deployment(n: int) -> str:
    containers = [{"name": f"c{i}", "image": "x",
                   "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}} for i in range(n)]
    doc = {**DEPLOYMENT, "spec": {"template": {"spec": {"containers": containers}}}}
    return yaml.safe_dump(doc, sort_keys=False)


def cpu_patch(n: int) -> list[dict[str, Any]]:
    """What cpu-limits asks of every container, and the mutations annotation."""
    ops: list[dict[str, Any]] = [{"op": "add", "path": "/metadata/annotations",
                                  "value": {"envelope.io/mutations": "cpu-limits"}}]
    for i in range(n):
        base = f"/spec/template/spec/containers/{i}/resources"
        ops += [{"op": "remove", "path": f"{base}/limits/cpu"},
                {"op": "add", "path": f"{base}/requests", "value": {"cpu": "1"}}]
    return ops


@pytest.fixture
def composed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The length of every text fix composes (the cost that was quadratic)."""
    sizes: list[int] = []

    def counted(text: str) -> Any:
        sizes.append(len(text))
        return compose(text)

    monkeypatch.setattr(fix, "compose", counted)
    yield sizes


def sequential(text: str, patch: list[dict[str, Any]]) -> str:
    for op in patch:
        text = fix._apply_op(text, compose(text), op, {})
    return text


def test_a_thousand_containers_are_composed_a_bounded_number_of_times(composed: list[int]) -> None:
    text = deployment(1000)
    out = patch_text(text, cpu_patch(1000))
    assert yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][999]["resources"] == {
        "limits": {"memory": "1Gi"}, "requests": {"cpu": "1"}}
    # Before: ~2,000 compositions of the whole text (2,000 x its length).
    assert sum(composed) <= 4 * len(text), (len(composed), sum(composed) / len(text))


@pytest.mark.parametrize("n", [3, 7, 20])
def test_item_by_item_gives_the_text_one_by_one_gives(n: int) -> None:
    text = deployment(n)
    patch = cpu_patch(n)
    # Operations outside the items, on other lists and in an order that interleaves.
    patch.insert(2, {"op": "replace", "path": "/metadata/name", "value": "bigger"})
    patch.append({"op": "add", "path": "/spec/template/spec/containers/1/env",
                  "value": [{"name": "A", "value": "1"}]})
    patch.append({"op": "replace", "path": "/spec/template/spec/containers/1/env/0/value", "value": "2"})
    patch.append({"op": "add", "path": "/spec/template/spec/restartPolicy", "value": "Always"})
    assert patch_text(text, patch) == sequential(text, patch)


def test_an_operation_on_the_list_itself_is_refused_as_one_by_one_refuses_it() -> None:
    text = deployment(4)
    for patch in ([*cpu_patch(4), {"op": "remove", "path": "/spec/template/spec/containers/0"}],
                  [{"op": "remove", "path": "/spec/template/spec/containers/0"}, *cpu_patch(3)]):
        with pytest.raises(fix.FixError) as grouped:
            patch_text(text, patch)
        with pytest.raises(fix.FixError) as alone:
            sequential(text, patch)
        assert str(grouped.value) == str(alone.value) == "removing a list item is not supported in place"
