"""DRA devices in pod-fits-node (issue 27 item 3): app/k8s/dra.py's arithmetic (the CEL
subset, pools, allocations, Hall's condition) and the rule on a DRA-only GPU cluster,
where every GPU pod was refused ("offers 0 nvidia.com/gpu") although kube-scheduler
binds it."""

from __future__ import annotations

from typing import Any

import pytest

from app.cluster.view import StaticView
from app.k8s.dra import (
    DeviceClass,
    DeviceRequest,
    device_shortfalls,
    extended_resource_classes,
    node_device_states,
)
from app.k8s.dracel import cel_match, cel_references
from tests.conftest import container, run, workload
from tests.helpers.namespace import node

DRIVER = "gpu.example.com"
DRIVER_ONLY = f'device.driver == "{DRIVER}"'


def device_class(name: str = "gpu", extended: str | None = "nvidia.com/gpu",
                 selectors: list[str] | None = None, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in
                                          (selectors if selectors is not None else [DRIVER_ONLY])]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def gpu(name: str, model: str = "H100", memory: int = 80) -> dict[str, Any]:
    return {"name": name, "attributes": {"model": {"string": model}, "memoryGiB": {"int": memory},
                                         "mig": {"bool": False}}}


def slice_(node_name: str, devices: list[dict[str, Any]], *, pool: str | None = None, generation: int = 1,
           count: int = 1, name: str | None = None, driver: str = DRIVER,
           **where: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "devices": devices,
                            "pool": {"name": pool or node_name, "generation": generation,
                                     "resourceSliceCount": count}}
    spec.update(where if where else {"nodeName": node_name})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node_name}-{driver}-{generation}"}, "spec": spec}


def allocated(name: str, node_name: str, devices: list[str], ns: str = "team-a",
              driver: str = DRIVER) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns}, "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "r", "driver": driver, "pool": node_name, "device": d} for d in devices]}}}}


def template(name: str, requests: list[dict[str, Any]], ns: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": requests}}}}


def gpu_pod(kind: str, gpus: str) -> dict[str, Any]:
    return workload(kind, [container(requests={"cpu": "1", "memory": "1Gi"},
                                     limits={"memory": "1Gi", "nvidia.com/gpu": gpus})])


def claim_pod(kind: str, template_name: str) -> dict[str, Any]:
    obj = workload(kind, [container(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "1Gi"})])
    spec = obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template_name}]
    spec["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return obj


def fits_errors(obj: dict[str, Any], view: StaticView) -> list[str]:
    return [f.message for f in run(obj, view=view).errors if f.rule == "pod-fits-node"]


# ----------------------------------------------------------------------- CEL subset


@pytest.mark.parametrize(("expression", "expected"), [
    (DRIVER_ONLY, True),
    ('device.driver != "gpu.example.com"', False),
    ('device.attributes["gpu.example.com"].model == "H100"', True),
    ("device.attributes['gpu.example.com']['model'] == 'A100'", False),
    ('device.attributes["gpu.example.com"].memoryGiB == 80 && device.driver == "gpu.example.com"', True),
    ('device.attributes["gpu.example.com"].mig == true || device.attributes["gpu.example.com"].model == "x"',
     False),
    ('!(device.attributes["gpu.example.com"].mig)', True),
    ('device.attributes["gpu.example.com"].missing == "x"', None),  # no such key: CEL error
    ('device.attributes["gpu.example.com"].missing == "x" && device.driver == "other"', False),
    ('device.attributes["gpu.example.com"].missing == "x" || device.driver == "gpu.example.com"', True),
    ('device.attributes["gpu.example.com"].memoryGiB == "80"', None),  # int vs string: no overload
    ('device.attributes["gpu.example.com"].memoryGiB >= 40', None),  # outside the subset
    ('device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0', None),
    ('"model" in device.attributes["gpu.example.com"]', None),
    ("true", True),
])
def test_the_cel_subset_is_decided_exactly_and_the_rest_is_not(expression: str,
                                                               expected: bool | None) -> None:
    attrs = {"gpu.example.com/model": "H100", "gpu.example.com/memoryGiB": 80, "gpu.example.com/mig": False}
    assert cel_match(expression, DRIVER, attrs) is expected


def test_cel_references_name_what_a_device_must_carry() -> None:
    found = cel_references('device.attributes["d.io"].a == "1" && device.driver == "x"')
    assert found == {"d.io/a", "driver"}
    assert cel_references("device.attributes.size() > 0") is None


# ------------------------------------------------------------------ device classes


def test_mapped_names_prefer_the_newest_class_then_the_lower_name_and_the_implicit_name_always() -> None:
    gpu_name, jan, feb = "nvidia.com/gpu", "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"
    classes = {"old": DeviceClass("old", extended_resource_name=gpu_name, created=jan),
               "new-b": DeviceClass("new-b", extended_resource_name=gpu_name, created=feb),
               "new-a": DeviceClass("new-a", extended_resource_name=gpu_name, created=feb)}
    mapped = extended_resource_classes(classes)
    assert mapped["nvidia.com/gpu"] == "new-a"
    assert mapped["deviceclass.resource.kubernetes.io/old"] == "old"


# ----------------------------------------------------------------- devices per node


def states(slices: list[dict[str, Any]], claims: list[dict[str, Any]] = (),  # type: ignore[assignment]
           nodes: tuple[str, ...] = ("n1",), keys: frozenset[str] = frozenset({"driver"})) -> Any:
    return node_device_states(slices, claims, [(n, lambda sel: False) for n in nodes], keys)


REQ = DeviceRequest("nvidia.com/gpu", "gpu", (DRIVER_ONLY,), 2, resource="nvidia.com/gpu")


def test_allocated_devices_are_taken_and_only_the_newest_generation_counts() -> None:
    slices = [slice_("n1", [gpu("g0"), gpu("g1"), gpu("g2")], generation=1),
              slice_("n1", [gpu("g0"), gpu("g1"), gpu("g2"), gpu("g3")], generation=2)]
    got = states(slices, [allocated("c", "n1", ["g0", "g1"])])["n1"]
    assert sum(n for _, n in got.free) == 2 and sum(n for _, n in got.used) == 2
    assert device_shortfalls([REQ], got) == []
    [short] = device_shortfalls([DeviceRequest("x", "gpu", (DRIVER_ONLY,), 3)], got)
    assert (short.requested, short.free, short.total) == (3, 2, 4)


def test_an_incomplete_pool_is_a_passing_state_and_an_invalid_one_gives_nothing() -> None:
    """kube-scheduler allocates nothing from an incomplete pool while the driver publishes
    it; Envelope counts its devices and does not decide All there (never a refusal for a
    driver mid-update). Duplicate device names make a pool invalid: nothing from it."""
    every = DeviceRequest("all", "gpu", (DRIVER_ONLY,), all_=True)
    slices = [slice_("n1", [gpu("g0"), gpu("g1")], count=2)]  # the second slice is missing
    got = states(slices)["n1"]
    assert got.unsettled_pool and sum(n for _, n in got.free) == 2
    assert device_shortfalls([REQ], got) == [] and device_shortfalls([every], got) == []
    complete = states([*slices, slice_("n1", [gpu("g2")], count=2, name="second")])["n1"]
    assert not complete.unsettled_pool and device_shortfalls([every], complete) == []
    invalid = states([slice_("n1", [gpu("g0"), gpu("g0")])])["n1"]
    assert invalid.invalid_pool and not invalid.free
    assert device_shortfalls([REQ], invalid) and device_shortfalls([every], invalid)


def test_all_mode_needs_every_matching_device_free_and_at_least_one() -> None:
    got = states([slice_("n1", [gpu("g0"), gpu("g1")])], [allocated("c", "n1", ["g0"])])["n1"]
    every = DeviceRequest("all", "gpu", (DRIVER_ONLY,), all_=True)
    assert device_shortfalls([every], got)
    assert device_shortfalls([every], states([])["n1"] if states([]) else None)
    # Two All requests of one pod want the same devices: the second finds them taken
    # (the DRA oracle's case 71).
    free = states([slice_("n1", [gpu("g0")])])["n1"]
    assert device_shortfalls([every], free) == []
    assert device_shortfalls([every, DeviceRequest("all 2", "gpu", (DRIVER_ONLY,), all_=True)], free)


def test_shared_and_selected_slices_reach_the_nodes_they_select() -> None:
    everywhere = slice_("net", [gpu("g0")], pool="net", allNodes=True)
    picked = node_device_states([everywhere, slice_("rack", [gpu("r0")], pool="rack", nodeSelector={
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}]})],
        [], [("n1", lambda sel: True), ("n2", lambda sel: False)], frozenset({"driver"}))
    assert sum(n for _, n in picked["n1"].free) == 2 and sum(n for _, n in picked["n2"].free) == 1


def test_hall_condition_refuses_only_what_no_allocation_meets() -> None:
    """Two requests that each fit alone but not together are refused; an undecided
    selector lets every device count for it (never a refusal it cannot prove)."""
    got = states([slice_("n1", [gpu("g0", "H100"), gpu("g1", "H100"), gpu("g2", "A100")])],
                 keys=frozenset({"driver", f"{DRIVER}/model"}))["n1"]
    h100 = DeviceRequest("h", "gpu", (DRIVER_ONLY, f'device.attributes["{DRIVER}"].model == "H100"'), 2)
    any_ = DeviceRequest("any", "gpu", (DRIVER_ONLY,), 1)
    a100 = DeviceRequest("a", "gpu", (f'device.attributes["{DRIVER}"].model == "A100"',), 2)
    assert device_shortfalls([h100, any_], got) == []
    [short] = device_shortfalls([h100, any_, DeviceRequest("one more", "gpu", (DRIVER_ONLY,), 1)], got)
    assert short.requested == 4 and short.free == 3
    assert device_shortfalls([a100], got)[0].free == 1
    undecided = DeviceRequest("u", "gpu", ('device.attributes["gpu.example.com"].memoryGiB > 10',), 3)
    assert device_shortfalls([undecided], got) == []


# --------------------------------------------------------------------- the rule


DRA_CLUSTER = [node("n1", "16", "64Gi"), node("n2", "16", "64Gi"), device_class(),
               slice_("n1", [gpu(f"g{i}") for i in range(4)]),
               slice_("n2", [gpu(f"g{i}") for i in range(2)])]


def test_a_gpu_pod_on_a_dra_only_cluster_is_judged_by_the_devices() -> None:
    """The issue's reproduction: no node has nvidia.com/gpu allocatable; a DeviceClass
    maps it; 4 devices on n1. kube-scheduler binds a pod asking 2 (and 4); 5 fits none."""
    view = StaticView(DRA_CLUSTER)
    for kind in ("Pod", "Deployment"):
        assert fits_errors(gpu_pod(kind, "2"), view) == []
        assert fits_errors(gpu_pod(kind, "4"), view) == []
        [message] = fits_errors(gpu_pod(kind, "5"), view)
        assert "needs 5 nvidia.com/gpu" in message and "offers 4 nvidia.com/gpu" in message
    # Two devices of n1 held by another claim: 4 fit nowhere now, 2 still do.
    held = StaticView([*DRA_CLUSTER, allocated("other", "n1", ["g0", "g1"])])
    assert fits_errors(gpu_pod("Pod", "4", ), held)
    assert fits_errors(gpu_pod("Pod", "2"), held) == []


def test_without_a_mapping_class_the_device_plugin_view_is_kept() -> None:
    view = StaticView([c for c in DRA_CLUSTER if c["kind"] != "DeviceClass"] +
                      [device_class(extended=None)])
    [message] = fits_errors(gpu_pod("Pod", "1"), view)
    assert "offers 0 nvidia.com/gpu" in message


def test_a_node_with_device_plugin_gpus_is_judged_by_its_allocatable() -> None:
    plugin = node("p1", "16", "64Gi")
    plugin["status"]["allocatable"]["nvidia.com/gpu"] = "1"
    view = StaticView([plugin, device_class(), slice_("p1", [gpu(f"g{i}") for i in range(8)])])
    # fit.go: allocatable > 0 -> NodeResourcesFit counts it; the DRA devices are not used.
    assert fits_errors(gpu_pod("Pod", "2"), view)
    assert fits_errors(gpu_pod("Pod", "1"), view) == []


def test_claims_from_templates_count_devices_with_their_selectors() -> None:
    h100 = [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 3, "selectors": [
        {"cel": {"expression": f'device.attributes["{DRIVER}"].model == "H100"'}}]}}]
    view = StaticView([*DRA_CLUSTER, template("three", h100),
                       template("five", [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": 5}}]),
                       template("firstav", [{"name": "r", "firstAvailable": [
                           {"name": "a", "deviceClassName": "gpu", "count": 9}]}]),
                       template("unknown-class", [{"name": "r", "exactly": {"deviceClassName": "nope",
                                                                           "count": 9}}])])
    assert fits_errors(claim_pod("Deployment", "three"), view) == []
    [message] = fits_errors(claim_pod("Deployment", "five"), view)
    assert "claim template five, request r" in message and "needs 5" in message
    # Not decided: prioritized lists, classes the view does not hold, templates it does not hold.
    for name in ("firstav", "unknown-class", "missing"):
        assert fits_errors(claim_pod("Deployment", name), view) == []


def test_dra_nodes_of_one_class_are_split_by_their_devices() -> None:
    """1,000 alike nodes, one with 8 devices: the class is split, the pod fits it."""
    nodes = [node(f"n{i:04d}", "16", "64Gi") for i in range(1000)]
    view = StaticView([*nodes, device_class(), slice_("n0777", [gpu(f"g{i}") for i in range(8)])])
    assert fits_errors(gpu_pod("Deployment", "8"), view) == []
    [message] = fits_errors(gpu_pod("Deployment", "9"), view)
    assert "offers 8 nvidia.com/gpu" in message
