"""app.crds.substrate: both WorkerPool shapes, and current-format (api.ate.dev) templates."""

from __future__ import annotations

from typing import Any

import pytest

from app.crds.actortypes import sandbox_class_of
from app.crds.substrate import (
    CurrentTemplate,
    as_crd_template,
    is_current_template,
    pool_sandbox_classes,
    pool_worker_image,
    read_current_template,
    read_pool_classes,
)


def old_pool(cls: Any = "microvm", **spec: Any) -> dict[str, Any]:
    """CRD-era shape (agent-substrate up to 86e138f6): sandboxClass + ateomImage."""
    body: dict[str, Any] = {"replicas": 1, "ateomImage": "registry.example/ateom@sha256:00", **spec}
    if cls is not None:
        body["sandboxClass"] = cls
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": "p", "namespace": "ns"}, "spec": body}


def new_pool(*classes: Any, **spec: Any) -> dict[str, Any]:
    """Current shape (post-#1298): sandboxClasses [{name, configRef}] + workerImage."""
    entries = [{"name": c} if isinstance(c, str) else c for c in classes]
    body = {"replicas": 1, "workerImage": "registry.example/ateom@sha256:11",
            "sandboxClasses": entries, **spec}
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": "p", "namespace": "ns"}, "spec": body}


# --------------------------------------------------------------------------- old shape


@pytest.mark.parametrize(("cls", "expected"), [
    ("microvm", {"microvm"}), ("gvisor", {"gvisor"}),
    (None, {"gvisor"}), ("", {"gvisor"}),  # absent/empty: the CRD default
])
def test_old_shape_reads_sandbox_class(cls: Any, expected: set[str]) -> None:
    got = read_pool_classes(old_pool(cls))
    assert got.classes == frozenset(expected)
    assert got.shape == ("sandboxClass" if cls else "neither")
    assert got.problems == ()


def test_old_shape_image() -> None:
    assert pool_worker_image(old_pool()) == "registry.example/ateom@sha256:00"


# --------------------------------------------------------------------------- new shape


def test_new_shape_reads_every_listed_class() -> None:
    vm = new_pool({"name": "microvm", "configRef": {"name": "microvm-default"}})
    assert pool_sandbox_classes(vm) == frozenset({"microvm"})
    assert read_pool_classes(vm).shape == "sandboxClasses"
    assert "microvm" in pool_sandbox_classes(vm) and "gvisor" not in pool_sandbox_classes(vm)
    # upstream allows one entry today; a later relaxation is read, not refused
    assert pool_sandbox_classes(new_pool("gvisor", "microvm")) == frozenset({"gvisor", "microvm"})


def test_new_shape_is_not_mistaken_for_gvisor() -> None:
    """The bug this module exists for: reading only spec.sandboxClass made every
    current pool a gVisor pool."""
    vm = new_pool("microvm")
    assert "gvisor" not in pool_sandbox_classes(vm)
    # a template without a class means gvisor, and such a template is not placed here
    classless = sandbox_class_of({"spec": {}})
    assert classless == "gvisor" and classless not in pool_sandbox_classes(vm)


def test_new_shape_image() -> None:
    assert pool_worker_image(new_pool("gvisor")) == "registry.example/ateom@sha256:11"


# --------------------------------------------------------------------------- both / neither


def test_both_fields_new_wins_and_disagreement_is_reported() -> None:
    agree = new_pool("microvm", sandboxClass="microvm")
    assert read_pool_classes(agree).classes == frozenset({"microvm"})
    assert read_pool_classes(agree).shape == "both"
    assert read_pool_classes(agree).problems == ()

    clash = read_pool_classes(new_pool("gvisor", sandboxClass="microvm"))
    assert clash.classes == frozenset({"gvisor"})
    assert len(clash.problems) == 1 and "spec.sandboxClass: microvm disagrees" in clash.problems[0]


def test_both_images_prefer_the_current_field() -> None:
    pool = new_pool("gvisor", ateomImage="old@sha256:22")
    assert pool_worker_image(pool) == "registry.example/ateom@sha256:11"


@pytest.mark.parametrize("pool", [
    {"spec": {}}, {"spec": None}, {}, {"spec": {"sandboxClasses": None}},
])
def test_neither_field_is_a_crd_era_gvisor_pool(pool: dict[str, Any]) -> None:
    got = read_pool_classes(pool)
    assert got.classes == frozenset({"gvisor"}) and got.shape == "neither" and got.problems == ()
    assert pool_worker_image(pool) is None


# --------------------------------------------------------------------------- malformed


@pytest.mark.parametrize(("pool", "classes", "problem"), [
    (new_pool(), set(), "names no sandbox class"),
    ({"spec": {"sandboxClasses": "microvm"}}, set(), "expected a list of {name, configRef}, got str"),
    ({"spec": {"sandboxClasses": {"name": "microvm"}}}, set(), "got dict"),
    (new_pool(42), set(), "spec.sandboxClasses[0]: expected {name, configRef}, got int"),
    (new_pool({"name": 7}), set(), "spec.sandboxClasses[0].name: expected a sandbox class name"),
    (new_pool({"name": ""}), set(), "spec.sandboxClasses[0].name"),
    (new_pool({"configRef": {"name": "x"}}), set(), "spec.sandboxClasses[0].name"),
    (new_pool("microvm", "microvm"), {"microvm"}, "spec.sandboxClasses[1].name: microvm is listed twice"),
    (new_pool({"name": "microvm", "configRef": "vm"}), {"microvm"}, "spec.sandboxClasses[0].configRef"),
    (new_pool(None, "microvm"), {"microvm"}, "spec.sandboxClasses[0]: expected {name, configRef}, got null"),
    (old_pool(["microvm"]), set(), "spec.sandboxClass: expected a sandbox class name, got list"),
    (old_pool(1), set(), "got int"),
])
def test_malformed_pools_never_crash(pool: dict[str, Any], classes: set[str], problem: str) -> None:
    got = read_pool_classes(pool)
    assert got.classes == frozenset(classes)
    assert any(problem in p for p in got.problems), got.problems


def test_unreadable_new_field_falls_back_to_a_readable_old_one() -> None:
    got = read_pool_classes({"spec": {"sandboxClasses": "oops", "sandboxClass": "microvm"}})
    assert got.classes == frozenset({"microvm"}) and got.shape == "both" and got.problems


@pytest.mark.parametrize("pool", [None, "pool", 3, [], {"spec": "x"}, {"spec": []}])
def test_not_a_mapping_is_a_default_pool(pool: Any) -> None:
    assert pool_sandbox_classes(pool) == frozenset({"gvisor"})
    assert pool_worker_image(pool) is None


@pytest.mark.parametrize("image", [None, "", 5, ["x"]])
def test_bad_images_are_absent(image: Any) -> None:
    assert pool_worker_image({"spec": {"workerImage": image}}) is None


# --------------------------------------------------------------------------- current templates


def current(limits: Any = None, cls: Any = "SANDBOX_CLASS_MICROVM", spec: bool = True,
            **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.example/agent@sha256:00"}],
        "snapshotsConfig": {"storageLocation": "gs://snapshots/agent/"},
        **extra,
    }
    if cls is not None:
        body["sandboxConfig"] = {"sandboxClass": cls, "configName": "microvm-default"}
    if limits is not None:
        body["resources"] = {"limits": limits}
    meta = {"name": "agent", "atespace": "team-a"}
    doc: dict[str, Any] = {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplate", "metadata": meta}
    if spec:
        doc["spec"] = body
    else:
        doc.update(body)
    return doc


def test_recognises_only_api_ate_dev_templates() -> None:
    assert is_current_template(current())
    assert is_current_template({"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplateVersion"})
    assert not is_current_template({"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate"})
    assert not is_current_template({"apiVersion": "api.ate.dev/v1alpha1", "kind": "Actor"})
    assert not is_current_template("ActorTemplate")


@pytest.mark.parametrize("spec", [True, False])
def test_reads_class_limits_and_selector(spec: bool) -> None:
    doc = current([{"name": "cpu", "quantity": "1"}, {"name": "memory", "quantity": "512Mi"}],
                  spec=spec, workerSelector={"matchLabels": {"tier": "vm"}})
    t = read_current_template(doc)
    assert t == CurrentTemplate(kind="ActorTemplate", name="agent", atespace="team-a",
                                sandbox_class="microvm", limits={"cpu": "1", "memory": "512Mi"},
                                worker_selector={"matchLabels": {"tier": "vm"}},
                                config_name="microvm-default")


@pytest.mark.parametrize(("cls", "expected"), [
    ("SANDBOX_CLASS_GVISOR", "gvisor"), ("SANDBOX_CLASS_MICROVM", "microvm"),
    ("microvm", "microvm"), ("SANDBOX_CLASS_UNSPECIFIED", "gvisor"), (None, "gvisor"),
    ("SANDBOX_CLASS_MACOS", "macos"),
])
def test_class_enum_spellings(cls: Any, expected: str) -> None:
    assert read_current_template(current(cls=cls)).sandbox_class == expected


def test_crd_rendering_is_what_the_crd_rules_read() -> None:
    t = read_current_template(current([{"name": "memory", "quantity": "255Mi"}],
                                      workerSelector={"matchLabels": {"a": "b"}}))
    assert as_crd_template(t, "team-a") == {
        "apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
        "metadata": {"name": "agent", "namespace": "team-a"},
        "spec": {"sandboxClass": "microvm", "resources": {"limits": {"memory": "255Mi"}},
                 "workerSelector": {"matchLabels": {"a": "b"}}}}


def test_requests_are_carried_so_the_limits_only_rule_sees_them() -> None:
    doc = current([{"name": "memory", "quantity": "1Gi"}])
    doc["spec"]["resources"]["requests"] = [{"name": "memory", "quantity": "1Gi"}]
    crd = as_crd_template(read_current_template(doc), "ns")
    assert crd["spec"]["resources"]["requests"] == {"memory": "1Gi"}


def test_a_version_takes_its_templates_selector() -> None:
    template = current(workerSelector={"matchLabels": {"workload": "agent"}})
    version = {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplateVersion",
               "metadata": {"name": "agent-v1"}, "actorTemplate": {"name": "agent"},
               "spec": {"resources": {"limits": [{"name": "memory", "quantity": "1Gi"}]}}}
    t = read_current_template(version, selector_from=template)
    assert t.kind == "ActorTemplateVersion" and t.limits == {"memory": "1Gi"}
    assert t.worker_selector == {"matchLabels": {"workload": "agent"}}


@pytest.mark.parametrize(("doc", "problem"), [
    (current("512Mi"), "spec.resources.limits: expected a list of {name, quantity}, got str"),
    (current([{"quantity": "1"}]), "spec.resources.limits[0]: expected {name, quantity}"),
    (current(["cpu"]), "spec.resources.limits[0]"),
    (current([{"name": "cpu", "quantity": "1"}, {"name": "cpu", "quantity": "2"}]),
     "spec.resources.limits[1].name: cpu is listed twice"),
    (current(cls=3), "spec.sandboxConfig.sandboxClass: expected a class"),
    (current(cls=None, sandboxConfig="microvm"),
     "spec.sandboxConfig: expected {sandboxClass, configName}, got str"),
    (current(resources=[1]), "spec.resources: expected {limits}, got list"),
    (current(workerSelector="tier=vm"), "spec.workerSelector: expected a label selector, got str"),
    ("ActorTemplate", "expected a mapping, got str"),
])
def test_malformed_templates_never_crash(doc: Any, problem: str) -> None:
    t = read_current_template(doc)
    assert any(problem in p for p in t.problems), t.problems
    as_crd_template(t, "ns")  # still renders


def test_map_form_limits_are_read() -> None:
    t = read_current_template(current({"memory": "1Gi"}))
    assert t.limits == {"memory": "1Gi"} and t.problems == ()
