"""Actor rules against both WorkerPool shapes: CRD era (``spec.sandboxClass``) and
current (``spec.sandboxClasses: [{name, configRef}]``, agent-substrate after #1298)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.rules.actors import POOLS_BY_CLASS
from tests.helpers.actors import NS, by_rule, pool, run, template


def current(limits: dict[str, Any] | None = None, cls: str = "microvm", name: str = "workers",
            namespace: str = NS, labels: dict[str, str] | None = None,
            requests: dict[str, Any] | None = None) -> dict[str, Any]:
    """The same pool as ``pool(...)`` in the current shape."""
    obj = pool(limits, None, name, namespace, labels, requests)
    spec = obj["spec"]
    del spec["ateomImage"]
    spec["workerImage"] = "registry.example/ateom@sha256:00"
    spec["sandboxClasses"] = [{"name": cls, "configRef": {"name": f"{cls}-default"}}]
    return obj


SHAPES = [pytest.param(pool, id="crd-era"), pytest.param(current, id="current")]


@pytest.mark.parametrize("shape", SHAPES)
def test_microvm_actor_is_measured_against_the_microvm_pool_only(shape: Any) -> None:
    cluster = [shape({"cpu": "2", "memory": "1Gi"}, name="vm"),
               shape({"cpu": "8", "memory": "64Gi"}, cls="gvisor", name="sandbox")]
    too_big = run(template({"cpu": "1", "memory": "4Gi"}), cluster)
    assert by_rule(too_big, "actor-placement") == [
        "error: needs 4Gi memory; the largest microvm WorkerPool in team-a offers 1Gi"]
    assert by_rule(run(template({"cpu": "1", "memory": "512Mi"}), cluster), "actor-placement") == []
    assert by_rule(run(template({"memory": "16Gi"}, cls="gvisor"), cluster), "actor-placement") == []


def test_current_gvisor_pools_are_no_home_for_a_microvm_actor() -> None:
    """Reading only spec.sandboxClass made this current pool a gVisor pool - and a
    current micro-VM pool one too; now each is what its sandboxClasses says."""
    result = run(template({"memory": "512Mi"}), [current({"memory": "64Gi"}, cls="gvisor")])
    assert by_rule(result, "actor-placement") == [
        "warning: no microvm WorkerPool in team-a yet; actors cannot be placed until one exists"]


def test_both_shapes_in_one_namespace() -> None:
    cluster = [pool({"memory": "1Gi"}, name="old-vm"), current({"memory": "2Gi"}, name="new-vm")]
    result = run(template({"memory": "4Gi"}), cluster)
    assert by_rule(result, "actor-placement") == [
        "error: needs 4Gi memory; the largest microvm WorkerPool in team-a offers 2Gi"]


def test_the_index_files_a_current_pool_under_its_classes() -> None:
    view = StaticView([current(cls="microvm"), pool(cls="gvisor", name="old")])
    assert [p["metadata"]["name"] for p in view.by_index(POOLS_BY_CLASS, f"{NS}/microvm")] == ["workers"]
    assert [p["metadata"]["name"] for p in view.by_index(POOLS_BY_CLASS, f"{NS}/gvisor")] == ["old"]


def test_moving_a_pool_to_the_current_shape_loses_no_template() -> None:
    """Upgrading a pool's manifest to sandboxClasses (same class, same size) is no shrink."""
    placed = template({"memory": "1Gi"})
    before, after = pool({"memory": "2Gi"}), current({"memory": "2Gi"})
    result = run(after, [placed, before], operation="UPDATE", old=before)
    assert by_rule(result, "actor-pool-shrink") == []


def test_changing_the_class_in_the_current_shape_is_a_shrink() -> None:
    placed = template({"memory": "1Gi"})
    before, after = current({"memory": "2Gi"}), current({"memory": "2Gi"}, cls="gvisor")
    result = run(after, [placed, before], operation="UPDATE", old=before)
    assert by_rule(result, "actor-pool-shrink") == [  # a warning in its default mode
        "warning: ActorTemplate agent cannot use a gvisor WorkerPool (was microvm); "
        "no other WorkerPool fits it"]


@pytest.mark.parametrize(("cls", "refused"), [("microvm", True), ("gvisor", False)])
def test_gpus_only_on_a_current_gvisor_pool(cls: str, refused: bool) -> None:
    gpu = {"nvidia.com/gpu": "1"}
    result = run(current(gpu, cls=cls, requests=gpu))
    messages = by_rule(result, "actor-pool-resources")
    assert messages == (["error: nvidia.com/gpu is only supported with sandboxClass gvisor, not microvm"]
                        if refused else [])


@pytest.mark.parametrize(("classes", "message"), [
    ([], "error: spec.sandboxClasses: names no sandbox class (upstream requires exactly one entry)"),
    ("microvm", "error: spec.sandboxClasses: expected a list of {name, configRef}, got str"),
    ([{"name": 5}], "error: spec.sandboxClasses[0].name: expected a sandbox class name, got 5"),
])
def test_a_malformed_class_list_in_a_file_is_reported_not_crashed_on(classes: Any, message: str) -> None:
    obj = current({"memory": "1Gi"})
    obj["spec"]["sandboxClasses"] = copy.deepcopy(classes)
    result = run(obj)
    assert not result.internal_errors
    assert message in by_rule(result, "actor-pool-resources")
    # and a template next to it is judged without the pool, not with a guessed class
    placed = run(template({"memory": "512Mi"}), [obj])
    assert by_rule(placed, "actor-placement") == [
        "warning: no microvm WorkerPool in team-a yet; actors cannot be placed until one exists"]


def test_a_class_change_in_the_current_shape_is_rejudged_on_update() -> None:
    gpu = {"nvidia.com/gpu": "1"}
    before = current(gpu, cls="gvisor", requests=gpu)
    after = current(gpu, cls="microvm", requests=gpu)
    result = run(after, [before], operation="UPDATE", old=before)
    assert by_rule(result, "actor-pool-resources") == [
        "error: nvidia.com/gpu is only supported with sandboxClass gvisor, not microvm"]
