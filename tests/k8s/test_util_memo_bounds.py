"""Every memo is bounded in bytes and keyed by what its consumer reads (issue 38,
classes 1, 3 and 4): distinct large inputs cannot take a memo past its budget (the
bytes it accounts and what tracemalloc sees), writes that change nothing a rule reads
add nothing, and Node status reports or a claim's labels do not resplit DRA devices.
The e2e counterpart through kube-apiserver: ``e2e/test_memory_bounds.py``."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

import app.crds.actortypes as actortypes
import app.crds.kai as kai
import app.rules.actors as actor_rules
import app.rules.namespace as namespace_rules
import app.rules.namespace.memory as memory_rules
import app.rules.namespace.node_groups as node_groups
from app.cluster.live import trim_node
from app.cluster.view import NODE_LABEL, ScopedView, StaticView
from app.k8s.util import Memo, footprint
from app.rules.quotas.objects import NODE_CARDS
from tests.conftest import container, run, workload
from tests.helpers.actors import ROOMY, template
from tests.helpers.actors import run as run_actor
from tests.helpers.namespace import node, quota
from tests.helpers.quotas import department

MiB = 2**20
DRIVER = "gpu.example.com"


def device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
            "spec": {"extendedResourceName": "nvidia.com/gpu",
                     "selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}


def gpu(name: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"model": {"string": "H100"}}}


def slice_(node_name: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": node_name},
            "spec": {"driver": DRIVER, "nodeName": node_name, "devices": devices,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1}}}


def allocated(name: str, node_name: str, devices: list[str]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "team-a"}, "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": DRIVER, "pool": node_name, "device": d} for d in devices]}}}}


def claim_pod() -> dict[str, Any]:
    sized = container(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "1Gi"})
    obj = workload("Deployment", [sized])
    obj["spec"]["template"]["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "t"}]
    return obj


def _retained(work: Any) -> int:
    """Bytes still allocated after ``work()`` returns (its result dropped, cycles collected)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        work()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.fixture(autouse=True)
def _fresh_memos() -> Iterator[None]:
    memos = (actortypes._DECODED, actor_rules._PLACEMENTS, kai._parsed, memory_rules._derived,
             memory_rules._pods, memory_rules._sums, node_groups._splits)
    for memo in memos:
        memo.clear()
    yield
    for memo in memos:
        memo.clear()


# ----------------------------------------------------------------------------- Memo


def test_footprint_agrees_with_tracemalloc_on_decoded_json() -> None:
    raw = orjson.dumps({"env": [{"name": f"V{i}", "value": "x" * (i % 50)} for i in range(5000)],
                        "nested": {"a": [1.5, 2, None, True], "b": "y" * 100_000}})
    held: list[Any] = []
    seen = _retained(lambda: held.append(orjson.loads(raw)))
    assert 0.7 * seen <= footprint(held[0]) <= 1.5 * seen


def test_a_memo_never_holds_more_than_its_budget_whatever_it_is_given() -> None:
    memo: Memo[int, str] = Memo(100_000, 2 * MiB)

    def fill() -> None:
        for i in range(200):
            memo.put(i, f"{i}" + "x" * 100_000)  # 20 MB offered
        memo.put(-1, "y" * (3 * MiB))  # heavier than the budget: not kept

    retained = _retained(fill)
    assert memo.weight <= memo.budget
    assert memo.get(-1) is None and memo.get(199) is not None and memo.get(0) is None
    assert retained <= 2 * MiB + 256 * 1024
    assert memo.weight == sum(footprint((k, memo.get(k))) for k in range(200) if memo.get(k) is not None)


# ---------------------------------------------------- class 1: a tenant's large inputs


def test_distinct_large_actor_templates_stay_within_the_decoder_and_placement_budgets() -> None:
    """Before issue 38: the placement memo kept 256 decoded templates whatever their size
    (and the decoder memo 16 MiB of JSON keys besides the models): 40 templates of 1 MB
    retained ~100 MB."""
    def dry_runs() -> None:
        for i in range(40):
            big = [{"name": "BLOB", "value": f"{i}-" + "x" * 1_000_000}]
            obj = template({"cpu": "1", "memory": "1Gi"},
                           containers=[{"name": "main", "image": "r.example/a@sha256:00", "env": big}])
            result = run_actor(obj, cluster=[ROOMY])
            assert result.internal_errors == []

    retained = _retained(dry_runs)
    assert actortypes._DECODED.weight <= actortypes.DECODED_BUDGET
    assert actor_rules._PLACEMENTS.weight <= actor_rules.PLACEMENTS_BUDGET
    assert retained <= actortypes.DECODED_BUDGET + actor_rules.PLACEMENTS_BUDGET + 2 * MiB, retained


def test_the_placement_memo_holds_no_template() -> None:
    obj = template({"cpu": "1", "memory": "1Gi"},
                   containers=[{"name": "main", "image": "r.example/a@sha256:00",
                                "env": [{"name": "BLOB", "value": "x" * 1_000_000}]}])
    run_actor(obj, cluster=[ROOMY])
    assert len(actor_rules._PLACEMENTS) == 1
    assert actor_rules._PLACEMENTS.weight < 100_000


def test_distinct_large_kai_specs_stay_within_the_parse_budget() -> None:
    """Before: keyed by the spec's bytes, 20,000 entries: 250 distinct 1 MB Departments
    held 819 MiB in the webhook."""
    from app.crds.kai import DepartmentSpec

    def parses() -> None:
        for i in range(40):
            spec = department(f"d{i}", {"name": "q", "quota": {"gpu": 1}})["spec"]
            spec["description"] = f"{i}" + "x" * 1_000_000
            kai.parse(DepartmentSpec, spec)

    retained = _retained(parses)
    assert kai._parsed.weight <= kai.PARSED_BUDGET
    assert retained <= kai.PARSED_BUDGET + 2 * MiB, retained


# ------------------------------------------------- class 3: writes no rule reads


def _annotated(obj: dict[str, Any], i: int) -> dict[str, Any]:
    meta = {**obj["metadata"], "resourceVersion": str(1000 + i), "annotations": {"patched": str(i)}}
    return {**obj, "metadata": meta}


def test_annotation_patches_do_not_grow_the_namespace_sums() -> None:
    """Before: keyed by the object's identity, every patched version was kept (48,000
    annotation patches on the 30k cluster: RSS 184 -> 398 MiB)."""
    deployments = [workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})],
                            name=f"w{i}") for i in range(20)]
    view = StaticView([quota({"requests.memory": "100Gi"}), *deployments])
    written = workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})],
                       name="new")
    assert run(written, view=view).internal_errors == []
    entries, weight = len(memory_rules._derived), memory_rules._derived.weight
    assert entries == 20

    def patches() -> None:
        for i in range(500):
            view.add(_annotated(deployments[i % 20], i))
            assert run(written, view=view).internal_errors == []

    retained = _retained(patches)
    assert len(memory_rules._derived) == entries
    assert memory_rules._derived.weight == weight
    assert len(memory_rules._pods) == 1 and len(memory_rules._sums) == 1  # requests.memory
    assert retained < 256 * 1024, retained


def test_a_changed_spec_is_derived_again() -> None:
    deployments = [workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})],
                            name=f"w{i}") for i in range(3)]
    view = StaticView([quota({"requests.memory": "10Gi"}), *deployments])
    written = workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})],
                       name="new")
    assert run(written, view=view).warnings == []
    bigger = workload("Deployment", [container(requests={"memory": "9Gi"}, limits={"memory": "9Gi"})],
                      name="w0")
    view.add(bigger)
    found = run(written, view=view).warnings
    [warning] = [f.message for f in found if f.rule == "namespace-memory-composition"]
    assert "w0" in warning


# ----------------------------------------------- class 4: reports that change nothing read


def _dra_view() -> tuple[StaticView, ScopedView]:
    nodes = [node(f"n{i:03d}", "16", "64Gi", labels={"zone": f"z{i % 3}"}) for i in range(200)]
    claim = allocated("held", "n007", ["g0"])
    store = StaticView([*nodes, device_class(), claim,
                        *(slice_(f"n{i:03d}", [gpu(f"g{d}") for d in range(4)]) for i in range(0, 200, 7))],
                       namespace_rules.INDEXES)
    return store, ScopedView(store, namespace_rules.pod_fits_node.rule.reads, "pod-fits-node")  # type: ignore[attr-defined]


def _reported(obj: dict[str, Any], i: int) -> dict[str, Any]:
    """A kubelet status report as the live view keeps it: a new resourceVersion."""
    beat = [{"type": "Ready", "lastHeartbeatTime": str(i)}]
    return trim_node({**obj, "metadata": {**obj["metadata"], "resourceVersion": str(i)},
                      "status": {**obj["status"], "conditions": beat}})


def test_node_status_reports_and_claim_labels_do_not_resplit_devices() -> None:
    store, view = _dra_view()
    keys = frozenset({"gpu.example.com/model"})
    first = node_groups._device_split(view, keys)
    for i in range(50):
        store.add(_reported(store.get("Node", f"n{i:03d}") or {}, i))
        claim = store.get("ResourceClaim", "held", "team-a") or {}
        store.add({**claim, "metadata": {**claim["metadata"], "labels": {"tick": str(i)}}})
        assert node_groups._device_split(view, keys) is first
    # What the split reads does resplit: a node's labels, a claim's devices, a slice, a node.
    changes = [
        lambda: store.add({**(n := store.get("Node", "n001") or {}),
                           "metadata": {**n["metadata"], "labels": {"zone": "z9"}}}),
        lambda: store.add(allocated("held", "n007", ["g0", "g1"])),
        lambda: store.add(slice_("n001", [gpu("g0")])),
        lambda: store.add(node("n999", "16", "64Gi")),
        lambda: store.remove("Node", "n999"),
    ]
    for change in changes:
        before = node_groups._device_split(view, keys)
        change()
        assert node_groups._device_split(view, keys) is not before


def test_a_status_report_leaves_the_index_versions_and_a_label_moves_them() -> None:
    store = StaticView([node("a", "4", "8Gi", labels={"kubernetes.io/hostname": "a"})],
                       (NODE_LABEL, node_groups.NODE_CLASS, NODE_CARDS))
    versions = (store.index_version(NODE_LABEL), store.index_version(node_groups.NODE_CLASS))
    cards = store.index_version(NODE_CARDS)
    kind_version = store.version("Node")
    store.add(_reported(store.get("Node", "a") or {}, 7))
    assert store.version("Node") != kind_version  # the object did change...
    assert (store.index_version(NODE_LABEL), store.index_version(node_groups.NODE_CLASS)) == versions
    assert store.index_version(NODE_CARDS) == cards  # ...in nothing a rule reads
    store.add(node("a", "4", "8Gi", labels={"kubernetes.io/hostname": "b"}))
    assert store.index_version(NODE_LABEL) != versions[0]
    assert store.index_version(node_groups.NODE_CLASS) == versions[1]  # a per-node label
    store.add(node("a", "8", "8Gi", labels={"kubernetes.io/hostname": "b"}))
    assert store.index_version(node_groups.NODE_CLASS) != versions[1]


def test_a_gpu_review_after_status_reports_gives_the_same_answer() -> None:
    store, _ = _dra_view()
    pod = claim_pod()
    before = run(pod, view=store)
    store.add(_reported(store.get("Node", "n007") or {}, 3))
    after = run(pod, view=store)
    assert [f.message for f in before.findings] == [f.message for f in after.findings]
