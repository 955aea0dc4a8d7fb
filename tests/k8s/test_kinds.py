"""The kind registry (app/k8s/kinds.py): one entry per kind, everything else derived, and
same-named kinds of different groups told apart one way, by (group, kind)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from app.audit import judged_for
from app.cluster.kube import pages
from app.cluster.live import RESOURCES, resources_for
from app.cluster.snapshot import merge
from app.cluster.view import StaticView
from app.core.ruleset import NEEDS, default_ruleset
from app.k8s import kinds

RULES = default_ruleset()


def test_names_and_refs_are_unique_and_round_trip() -> None:
    assert len({k.ref for k in kinds.KINDS}) == len(kinds.KINDS)
    assert len({k.name for k in kinds.KINDS}) == len(kinds.KINDS)
    for k in kinds.KINDS:
        assert kinds.ref(k.name) == k.ref
        assert kinds.name_of(*k.ref) == k.name
        assert kinds.ref_of({"apiVersion": k.api_version, "kind": k.kind}) == k.ref
    assert kinds.KARPENTER_NODEPOOL == "NodePool.karpenter.sh"
    assert kinds.ref("NodePool") == ("kai.resources", "NodePool")


def test_paths_are_the_api_servers_collection_urls() -> None:
    assert kinds.by_ref("", "Node") is not None and kinds.by_ref("", "Node").path == "/api/v1/nodes"
    quota = kinds.by_ref("kai.resources", "Project")
    assert quota is not None and quota.path == "/apis/kai.resources/v1alpha1/projects"
    runtime = kinds.by_ref("node.k8s.io", "RuntimeClass")
    assert runtime is not None and (runtime.path, runtime.namespaced, runtime.optional) == (
        "/apis/node.k8s.io/v1/runtimeclasses", False, False)


def test_every_kind_a_rule_judges_or_reads_has_an_entry() -> None:
    assert {j.ref for j in judged_for(RULES)} == RULES.kinds
    assert {r.kind for r in resources_for(RULES.reads)} == set(RULES.reads)
    assert {r.kind for r in RESOURCES} == {k.name for k in kinds.KINDS if k.trim}
    for rule_id, needed in NEEDS.items():  # what check's "not evaluated" asks for
        assert set(needed) <= RULES[rule_id].reads, rule_id


def test_a_kind_without_an_entry_or_a_trim_is_refused() -> None:
    with pytest.raises(ValueError, match=r"app/k8s/kinds\.py"):
        kinds.read_kinds({"Gadget"})
    with pytest.raises(ValueError, match=r"app/k8s/kinds\.py"):
        kinds.read_kinds({"Pod"})  # judged only: the live view has no trim for it


def test_objects_are_filed_by_group_and_kind() -> None:
    kai = {"apiVersion": "kai.resources/v1alpha1", "kind": "NodePool", "metadata": {"name": "a"}}
    karpenter = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "a"}}
    volcano = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
               "metadata": {"name": "q"}}
    bare = {"kind": "NodePool", "metadata": {"name": "b"}}  # a fixture: the registered kind
    view = StaticView([kai, karpenter, volcano, bare])
    assert view.list("NodePool") == [kai, bare]
    assert view.list(kinds.KARPENTER_NODEPOOL) == [karpenter]
    assert view.list("Queue") == []
    assert view.list("Queue.scheduling.volcano.sh") == [volcano]
    assert view.count("NodePool") == 2 and view.count(kinds.KARPENTER_NODEPOOL) == 1


def test_a_manifest_replaces_the_cluster_object_of_its_own_group() -> None:
    kai = {"apiVersion": "kai.resources/v1alpha1", "kind": "NodePool", "metadata": {"name": "a"}}
    karpenter = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "a"},
                 "spec": {}}
    new_kai = {**kai, "spec": {"new": True}}
    assert merge([kai], [karpenter]) == [kai, karpenter]
    assert merge([kai, karpenter], [new_kai]) == [karpenter, new_kai]


class _Pages:
    """A client whose LIST answers in pages of two, with continue tokens."""

    def __init__(self, items: list[int]) -> None:
        self.items = items
        self.asked: list[dict[str, Any]] = []

    def get(self, path: str, fields: dict[str, Any], timeout: float) -> Any:
        self.asked.append(dict(fields))
        start = int(fields.get("continue") or 0)
        chunk = self.items[start:start + fields["limit"]]
        more = start + fields["limit"] < len(self.items)
        body = {"items": chunk, "metadata": {"resourceVersion": "7",
                                             **({"continue": str(start + 2)} if more else {})}}
        return type("R", (), {"data": orjson.dumps(body)})()


def test_pages_follows_continue_to_the_last_page() -> None:
    client = _Pages([1, 2, 3, 4, 5])
    got = [body["items"] for body in pages(client, "/api/v1/nodes", 2)]  # type: ignore[arg-type]
    assert got == [[1, 2], [3, 4], [5]]
    assert client.asked == [{"limit": 2}, {"limit": 2, "continue": "2"},
                            {"limit": 2, "continue": "4"}]
