"""UPDATEs of objects that predate Envelope (issue 28, class 2) and children a controller
compares with their parent (class 1): what the engine patches, for every workload kind
and the everyday operations."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch
import pytest

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.core.engine import check_object, evaluate
from app.k8s.podspec import POD_SPEC_PATHS, held_on_update, job_template_mutable
from app.rules.base import Subject
from tests.conftest import RULES, container, kind_of, resources_of, run, subject, workload

TEMPLATE_KINDS = [kind for _, kind in POD_SPEC_PATHS if kind != "Pod"]
ENV = [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=1Gi"}]


def stored(kind: str, **kw: Any) -> dict[str, Any]:
    """A workload as it was stored before Envelope: a CPU limit, a memory request
    without a limit (init container), a cpu pair in its string envelope."""
    obj = workload(kind, [container(limits={"cpu": "2", "memory": "1Gi"},
                                    requests={"cpu": "500m", "memory": "1Gi"}, env=list(ENV))],
                   init=[container("setup", requests={"memory": "256Mi"})], **kw)
    if kind == "Job":
        obj["status"] = {"startTime": "2026-12-01T00:00:00Z", "active": 1}
    return obj


def template(obj: dict[str, Any]) -> dict[str, Any]:
    group, _, _ = obj["apiVersion"].rpartition("/")
    node: dict[str, Any] = obj
    for key in POD_SPEC_PATHS[(group, obj["kind"])][:-1]:
        node = node.setdefault(key, {})
    return node


def label(obj: dict[str, Any]) -> None:
    obj["metadata"].setdefault("labels", {})["team"] = "a"


def annotate(obj: dict[str, Any]) -> None:
    obj["metadata"].setdefault("annotations", {})["note"] = "hello"


def scale(obj: dict[str, Any]) -> None:
    if obj["kind"] in ("Job", "CronJob"):
        spec = obj["spec"] if obj["kind"] == "Job" else obj["spec"]["jobTemplate"]["spec"]
        spec["parallelism"] = 3
    else:
        obj["spec"]["replicas"] = 5


def rollout_restart(obj: dict[str, Any]) -> None:
    """What ``kubectl rollout restart`` writes: an annotation on the pod template."""
    template(obj).setdefault("metadata", {}).setdefault("annotations", {})[
        "kubectl.kubernetes.io/restartedAt"] = "2026-12-02T05:00:00Z"


def image_bump(obj: dict[str, Any]) -> None:
    template(obj)["spec"]["containers"][0]["image"] = "registry.example/app:2"


OPERATIONS: dict[str, Callable[[dict[str, Any]], None]] = {
    "label": label, "annotate": annotate, "scale": scale, "rollout-restart": rollout_restart,
    "image-bump": image_bump}


def updated(old: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    new = copy.deepcopy(old)
    change(new)
    return new


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
@pytest.mark.parametrize("kind", TEMPLATE_KINDS)
def test_an_update_that_leaves_the_resources_as_stored_gets_no_patch(kind: str, operation: str) -> None:
    old = stored(kind)
    if kind == "Job" and operation in ("rollout-restart", "image-bump"):
        pytest.skip("a started Job's template is immutable: the API server refuses these anyway")
    new = updated(old, OPERATIONS[operation])
    result = run(new, operation="UPDATE", old=old)
    assert result.patch == []
    assert result.errors == []
    # the mutating rules did not run; validations did, ratcheted (warnings only)
    for rid in ("cpu-limits", "memory-limit", "env-envelope-cpu"):
        assert result.results[rid] == "skip", rid


@pytest.mark.parametrize("kind", TEMPLATE_KINDS)
def test_a_create_of_the_same_object_is_still_mutated(kind: str) -> None:
    """The rule that skips UPDATEs must not be the rule that never mutates."""
    result = run(stored(kind))
    rules = {c.rule for c in result.changes}
    assert rules == {"cpu-limits", "memory-limit", "env-envelope-cpu"}


@pytest.mark.parametrize("kind", [k for k in TEMPLATE_KINDS if k != "Job"])
def test_an_update_that_changes_the_resources_is_mutated(kind: str) -> None:
    old = stored(kind)
    new = copy.deepcopy(old)
    resources_of_new = template(new)["spec"]["containers"][0]["resources"]
    resources_of_new["limits"]["cpu"] = "3"
    result = run(new, operation="UPDATE", old=old)
    after = jsonpatch.apply_patch(new, result.patch)
    assert "cpu" not in resources_of(after)["limits"]
    # the whole part is judged once it changed: the init container's memory limit too
    assert resources_of(after, field="initContainers")["limits"] == {"memory": "256Mi"}


def test_a_pod_update_that_leaves_the_resources_alone_is_not_mutated() -> None:
    old = stored("Pod")
    new = updated(old, label)
    assert run(new, operation="UPDATE", old=old).patch == []


def test_the_namespace_guards_do_not_refuse_an_unrelated_update() -> None:
    """quota-needs-cpu-limits in enforce mode refuses a Deployment with CPU limits in a
    namespace whose quota needs them; a label of one stored before Envelope passes."""
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "cpu", "namespace": "team-a"},
             "spec": {"hard": {"limits.cpu": "10"}}}
    view = StaticView([quota])
    policy = Policy(rules={"quota-needs-cpu-limits": Mode.ENFORCE})
    old = stored("Deployment")
    refused = check_object(RULES, subject(copy.deepcopy(old)), view, policy)
    assert [f.rule for f in refused.errors] == ["quota-needs-cpu-limits"]
    new = updated(old, label)
    result = check_object(RULES, subject(new, "UPDATE", old), view, policy)
    assert result.errors == [] and result.patch == []


# --- Jobs -------------------------------------------------------------------------------

def job(suspend: bool | None, status: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    obj = stored("Job", **kw)
    obj["status"] = status or {}
    if suspend is not None:
        obj["spec"]["suspend"] = suspend
    return obj


def resume_with_node_selector(obj: dict[str, Any]) -> None:
    """What Kueue writes to admit a Job: one UPDATE that resumes it and places it."""
    obj["spec"]["suspend"] = False
    spec = obj["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"cloud.google.com/gke-accelerator": "nvidia-h100"}
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]


@pytest.mark.parametrize("change", [label, annotate, scale, resume_with_node_selector,
                                    lambda o: o["spec"].update(suspend=True)])
def test_job_updates_of_a_job_created_before_envelope_pass_unchanged(
        change: Callable[[dict[str, Any]], None]) -> None:
    old = job(True, {})
    new = updated(old, change)
    result = run(new, operation="UPDATE", old=old)
    assert result.patch == [] and result.errors == []


@pytest.mark.parametrize(("suspend", "status", "mutable"), [
    (None, {"startTime": "t", "active": 1}, False),
    (False, {}, False),
    (True, {}, True),
    (True, {"startTime": "t"}, False),  # started, then suspended: no Suspended condition yet
    (True, {"startTime": "t", "conditions": [{"type": "Suspended", "status": "True"}]}, True),
    (True, {"startTime": "t", "active": 2,
            "conditions": [{"type": "Suspended", "status": "True"}]}, False),
])
def test_job_template_mutable_follows_should_allow_mutable_pod_template(
        suspend: bool | None, status: dict[str, Any], mutable: bool) -> None:
    assert job_template_mutable(job(suspend, status)) is mutable


def test_a_running_job_whose_resources_change_gets_no_patch_and_says_why() -> None:
    """The API server refuses the user's change anyway; Envelope adds nothing to it."""
    old = job(False, {"startTime": "t", "active": 1})
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
    result = run(new, operation="UPDATE", old=old)
    assert result.patch == []
    assert any("not applied: a Job's pod template is immutable" in w.message
               for w in result.warnings if w.rule == "cpu-limits")


def test_a_suspended_job_resized_before_it_starts_gets_container_resources_only() -> None:
    """MutablePodResourcesForSuspendedJobs (1.36): container resources may change, env
    and pod-level resources may not. cpu-limits strips the containers; env-envelope-cpu
    and a pod-level CPU limit are left with a warning."""
    old = job(True, {}, pod_resources={"limits": {"cpu": "4", "memory": "2Gi"}})
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
    result = run(new, operation="UPDATE", old=old)
    after = jsonpatch.apply_patch(new, result.patch)
    held = held_on_update(subject(new, "UPDATE", old), new, old)
    assert held is not None
    for op in result.patch:
        parts = tuple(int(p) if p.isdigit() else p for p in op["path"].split("/")[1:])
        assert held.allows(parts), op
    assert any(op["path"].startswith("/spec/template/spec/initContainers/0/resources")
               for op in result.patch)
    spec = after["spec"]["template"]["spec"]
    assert spec["containers"][0]["env"] == ENV
    # cpu-limits touched the pod level too, so it was not applied at all
    assert spec["resources"] == {"limits": {"cpu": "4", "memory": "2Gi"}}
    assert {w.rule for w in result.warnings if w.message.startswith("not applied: a suspended Job")} \
        == {"cpu-limits", "env-envelope-cpu"}


def test_a_suspended_job_with_container_limits_only_is_stripped_on_resize() -> None:
    old = job(True, {})
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
    result = run(new, operation="UPDATE", old=old)
    after = jsonpatch.apply_patch(new, result.patch)
    assert "cpu" not in resources_of(after)["limits"]
    assert after["spec"]["template"]["spec"]["containers"][0]["env"] == ENV


def test_a_job_create_is_mutated_in_full() -> None:
    result = run(job(True, {}))
    assert {c.rule for c in result.changes} == {"cpu-limits", "memory-limit", "env-envelope-cpu"}


# --- children a controller compares (class 1) --------------------------------------------

def owned(kind: str = "Deployment", api: str = "apps/v1", controller: bool = True) -> dict[str, Any]:
    rs = stored("ReplicaSet")
    rs["metadata"]["ownerReferences"] = [{"apiVersion": api, "kind": kind, "name": "web",
                                          "uid": "1234", "controller": controller}]
    return rs


def test_a_replicaset_of_a_deployment_is_left_as_its_controller_wrote_it() -> None:
    rs = owned()
    rs["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "2Gi"
    result = run(rs)
    assert result.patch == [] and result.errors == [] and result.warnings == []
    assert result.skipped["cpu-limits"] == "owned by Deployment web: judged there"
    assert set(result.results.values()) == {"skip"}


@pytest.mark.parametrize(("kind", "api", "controller"), [
    ("Deployment", "apps/v1", False),   # an owner, not the controller
    ("Rollout", "argoproj.io/v1alpha1", True),  # another controller: not compared by ours
    ("Deployment", "example.com/v1", True),
])
def test_other_replicasets_are_judged(kind: str, api: str, controller: bool) -> None:
    result = run(owned(kind, api, controller))
    assert {c.rule for c in result.changes} >= {"cpu-limits"}


def test_the_pods_of_an_owned_replicaset_are_still_judged() -> None:
    """What a forged ownerReference cannot escape: the Pods are judged at CREATE."""
    pod = stored("Pod")
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                           "name": "web-1", "uid": "1", "controller": True}]
    assert "cpu-limits" in {c.rule for c in run(pod).changes}


def test_a_job_of_a_cronjob_is_judged() -> None:
    """The CronJob controller does not compare a Job's template with its own."""
    j = stored("Job")
    j.pop("status")
    j["metadata"]["ownerReferences"] = [{"apiVersion": "batch/v1", "kind": "CronJob",
                                         "name": "nightly", "uid": "1", "controller": True}]
    assert "cpu-limits" in {c.rule for c in run(j).changes}


def test_warn_mode_on_a_held_job_changes_nothing() -> None:
    old = job(False, {"startTime": "t", "active": 1})
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "3"
    policy = Policy(rules={"cpu-limits": Mode.WARN})
    group, kind = kind_of("Job")
    out = evaluate(RULES, Subject(group, "v1", kind, "UPDATE", "team-a", "web", new, old),
                   StaticView(), policy, "mutate")
    assert all(op["path"].find("/resources/limits/cpu") < 0 for op in out.patch)
