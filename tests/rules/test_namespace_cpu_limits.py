"""The CPU-limit guards (app/rules/namespace/cpu_limits.py) over a static view: keep the
limits (warn) or refuse (enforce) where the namespace needs them."""

from __future__ import annotations

import jsonpatch
import pytest

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from tests.conftest import container, resources_of, run, workload
from tests.helpers.namespace import limitrange, quota

CPU7 = [container(limits={"cpu": "7", "memory": "29Gi"}, requests={"cpu": "7", "memory": "29Gi"})]


@pytest.mark.parametrize(("guard", "rule", "named"), [
    (quota({"limits.cpu": "20", "limits.memory": "64Gi"}), "quota-needs-cpu-limits",
     'ResourceQuota "compute" (no scope) sets limits.cpu=20'),
    (limitrange({"type": "Pod", "max": {"cpu": "8"}}), "limitrange-needs-cpu-limits",
     'LimitRange "defaults" type Pod max cpu 8: the pod has no CPU limit'),
    (limitrange({"maxLimitRequestRatio": {"cpu": "2"}}), "limitrange-needs-cpu-limits",
     "type Container maxLimitRequestRatio cpu 2"),
    # A default CPU limit below the request: LimitRanger's default makes the Pod invalid.
    (limitrange({"default": {"cpu": "2"}}), "limitrange-needs-cpu-limits",
     'LimitRange "defaults" default CPU limit 2 is below container app\'s CPU request 7'),
])
def test_namespace_that_needs_cpu_limits_keeps_them_and_warns(guard: dict, rule: str,
                                                              named: str) -> None:
    obj = workload("Deployment", CPU7)
    result = run(obj, view=StaticView([guard]))
    assert result.patch == []
    assert result.errors == []
    assert any(w.rule == rule and named in w.message and "CPU limits kept" in w.message
               for w in result.warnings)
    # enforce: refuse instead
    enforce = Policy(rules={rule: Mode.ENFORCE})
    denied = run(obj, enforce, view=StaticView([guard]))
    assert [e.rule for e in denied.errors] == [rule]
    # off: strip as usual
    stripped = run(obj, Policy(rules={rule: Mode.OFF}), view=StaticView([guard]))
    assert stripped.patch


def test_guards_look_only_at_the_objects_namespace_and_relevant_keys() -> None:
    obj = workload("Deployment", CPU7)
    view = StaticView([quota({"limits.cpu": "20"}, ns="other"), quota({"requests.cpu": "20"}),
                       limitrange({"default": {"cpu": "8"}}),
                       # max alone: LimitRange defaulting makes it the default limit (8 >= 7)
                       limitrange({"max": {"cpu": "8"}}, name="max-only"),
                       quota({"limits.cpu": "20"}, name="terminating") | {"spec": {
                           "hard": {"limits.cpu": "20"}, "scopes": ["Terminating"]}}])
    assert run(obj, view=view).patch


def test_opted_out_workload_is_not_refused_by_an_enforcing_guard() -> None:
    """Class 5: the guard's own message says to opt out; opting out must then pass."""
    obj = workload("Deployment", CPU7)
    obj["spec"]["template"]["metadata"] = {"annotations": {"envelope.io/keep-cpu-limit": "true"}}
    enforce = Policy(rules={"quota-needs-cpu-limits": Mode.ENFORCE})
    result = run(obj, enforce, view=StaticView([quota({"limits.cpu": "20"})]))
    assert result.errors == [] and result.patch == []


def test_limitrange_default_below_request_warns_on_the_workload() -> None:
    obj = workload("Deployment", [container(requests={"cpu": "7"}, limits={"memory": "29Gi"})])
    view = StaticView([limitrange({"default": {"cpu": "2"}})])
    result = run(obj, view=view)
    [warning] = [w for w in result.warnings if w.rule == "limitrange-default-below-request"]
    assert 'LimitRange "defaults" default cpu limit 2 < request 7' in warning.message
    assert len(warning.message) < 120
    pod = workload("Pod", [container(limits={"cpu": "7", "memory": "29Gi"})])
    assert not [w for w in run(pod, view=view).warnings
                if w.rule == "limitrange-default-below-request"]


def test_patch_still_applies_cleanly_with_guards_present() -> None:
    obj = workload("Deployment", CPU7)
    result = run(obj, view=StaticView([limitrange({"default": {"cpu": "8"}})]))
    after = jsonpatch.apply_patch(obj, result.patch)
    assert "cpu" not in resources_of(after)["limits"]


def test_pods_are_judged_past_limitranger_templates_before_it() -> None:
    """A Pod arrives with LimitRanger's default (= max) CPU limit; stripping it leaves
    no limit and LimitRanger's validation refuses: kept. A template's Pods get the
    default back after the strip: stripped."""
    view = StaticView([limitrange({"max": {"cpu": "8"}})])
    pod = workload("Pod", [container(requests={"cpu": "1", "memory": "1Gi"},
                                     limits={"cpu": "8", "memory": "1Gi"})])
    result = run(pod, view=view)
    assert result.patch == [] and any(w.rule == "limitrange-needs-cpu-limits" for w in result.warnings)
    deploy = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                               limits={"cpu": "8", "memory": "1Gi"})])
    assert run(deploy, view=view).patch
