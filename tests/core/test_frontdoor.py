"""The front door (app/core/frontdoor.py): an object judged as the webhook pair would
judge its write — the subject, the namespace ``kubectl apply`` places it in, LimitRanger's
defaults on a Pod, the conversion of current-format ActorTemplates."""

from __future__ import annotations

import copy
from typing import Any

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.core.frontdoor import (
    ACTOR_LIMITS,
    ANY_NAMESPACE,
    FrontDoor,
    admitted,
    placed,
    pools_anywhere,
    subject_of,
)
from app.k8s.kinds import by_ref
from app.rules.base import Subject
from tests.conftest import RULES, container, workload


def door(*objects: dict[str, Any], policy: Policy | None = None, **kw: Any) -> FrontDoor:
    return FrontDoor(RULES, StaticView(objects, RULES.indexes), policy or Policy(),
                     objects=objects, **kw)


def unnamespaced(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    del out["metadata"]["namespace"]
    return out


def quota(namespace: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "memory", "namespace": namespace},
            "spec": {"hard": {"requests.memory": memory}}}


def limit_range(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "d", "namespace": namespace},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": "2", "memory": "1Gi"}}]}}


def current_template(limits: Any, name: str = "agent", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"atespace": "team-a", "name": name, **meta},
            "spec": {"sandboxConfig": {"sandboxClass": "SANDBOX_CLASS_MICROVM"},
                     "resources": {"limits": limits},
                     "containers": [{"name": "main", "image": "registry.example/a@sha256:00"}]}}


def pool(namespace: str, memory: str, name: str = "vm") -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "workerImage": "registry.example/w@sha256:00",
                     "sandboxClasses": [{"name": "microvm"}],
                     "template": {"resources": {"limits": {"memory": memory}}}}}


def said(findings: list[Any]) -> list[str]:
    return [f"{f.severity} {f.rule}: {f.message}" for f in findings]


# --- the subject -------------------------------------------------------------------------

def test_the_subject_is_the_written_object_as_the_api_server_names_it() -> None:
    deploy = workload("Deployment", [container()], name="web", namespace="team-a")
    assert subject_of(deploy) == Subject("apps", "v1", "Deployment", "CREATE", "team-a", "web", deploy)
    pod = workload("Pod", [container()], name="p", namespace="ns")
    s = subject_of(pod)
    assert (s.group, s.version, s.api_version) == ("", "v1", "v1")
    # A DELETE carries no object: its identity is the stored one's.
    gone = subject_of(None, "DELETE", deploy)
    assert (gone.kind, gone.namespace, gone.name, gone.obj, gone.old) == (
        "Deployment", "team-a", "web", None, deploy)
    # Unreadable metadata is no identity, never a crash.
    odd = subject_of({"apiVersion": "v1", "kind": "Pod", "metadata": ["x"]})
    assert (odd.namespace, odd.name) == ("", "")


def test_the_door_judges_a_dry_run_create() -> None:
    judged = door().judge(workload("Deployment", [container(limits={"cpu": "1"})]))
    assert judged.subject.operation == "CREATE" and judged.subject.dry_run
    assert not judged.converted


# --- the namespace kubectl places an object in ---------------------------------------------

def test_placed_fills_only_a_missing_namespace_of_a_namespaced_kind() -> None:
    deploy = unnamespaced(workload("Deployment", [container()]))
    assert placed(deploy, "ns")["metadata"]["namespace"] == "ns"
    assert "namespace" not in deploy["metadata"]  # the input is not changed
    written = workload("Deployment", [container()], namespace="team-a")
    assert placed(written, "ns") is written
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}}
    assert by_ref("", "Node") is not None and placed(node, "ns") is node
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert placed(unknown, "ns") is unknown


def test_an_object_without_a_namespace_is_judged_in_the_one_it_lands_in() -> None:
    # 4 replicas x 512Mi against a 1Gi quota of "default": only where the Deployment is
    # placed in "default" does the quota apply to it.
    deploy = unnamespaced(workload("Deployment", [container(requests={"memory": "512Mi"},
                                                            limits={"memory": "512Mi"})]))
    deploy["spec"]["replicas"] = 4
    cluster = [quota("default", "1Gi")]
    rule = "namespace-memory-composition"
    in_default = door(*cluster).judge(deploy)
    assert in_default.namespace == "default"
    assert rule in in_default.evaluation.rule_ids
    as_written = door(*cluster, namespace=None).judge(deploy)
    assert as_written.namespace == ""
    assert rule not in as_written.evaluation.rule_ids
    elsewhere = door(*cluster, namespace="team-b").judge(deploy)
    assert rule not in elsewhere.evaluation.rule_ids


# --- LimitRanger before the webhooks ------------------------------------------------------

def test_admitted_writes_limitrangers_defaults_into_a_pod_only() -> None:
    view = StaticView([limit_range("ns")], RULES.indexes)
    pod = workload("Pod", [container()], namespace="ns")
    got = admitted(pod, view)
    assert got["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}
    assert "resources" not in pod["spec"]["containers"][0]
    deploy = workload("Deployment", [container()], namespace="ns")
    assert admitted(deploy, view) is deploy
    other = workload("Pod", [container()], namespace="other")
    assert admitted(other, view) is other


def test_admit_judges_the_pod_limitranger_leaves() -> None:
    pod = workload("Pod", [container(requests={"memory": "1Gi"})], namespace="ns")
    with_defaults = door(limit_range("ns"), pod, admit=True).judge(pod)
    # The CPU limit LimitRanger writes is the one cpu-limits removes.
    assert "cpu-limits" in {c.rule for c in with_defaults.evaluation.changes}
    as_written = door(limit_range("ns"), pod).judge(pod)
    assert "cpu-limits" not in {c.rule for c in as_written.evaluation.changes}


# --- the engine is the engine -------------------------------------------------------------

def test_the_door_answers_what_the_engine_answers() -> None:
    deploy = workload("Deployment", [container(requests={"memory": "1Gi"},
                                               limits={"cpu": "4", "memory": "2Gi"})])
    view = StaticView([deploy], RULES.indexes)
    judged = FrontDoor(RULES, view, Policy()).judge(deploy)
    direct = check_object(RULES, subject_of(deploy), view, Policy())
    assert judged.evaluation == direct
    assert {"op": "remove", "path": "/spec/template/spec/containers/0/resources/limits/cpu"} \
        in judged.evaluation.patch


def test_an_update_and_a_delete_go_through_the_same_door() -> None:
    old = workload("Deployment", [container(limits={"cpu": "4"})])
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"a": "b"}
    judged = door(old).judge(new, operation="UPDATE", old=old)
    # A label left the pod template as stored: nothing to patch.
    assert judged.subject.operation == "UPDATE" and judged.evaluation.patch == []
    gone = door(old).judge(None, operation="DELETE", old=old)
    assert (gone.subject.operation, gone.name, gone.subject.old) == ("DELETE", "web", old)


def test_a_listed_kind_names_the_subject() -> None:
    # The audit lists a kind at its first version and judges each item as that kind.
    kind = by_ref("apps", "Deployment")
    assert kind is not None
    obj = workload("Deployment", [container()])
    obj["apiVersion"] = "apps/v1beta2"
    judged = door(namespace=None).judge(obj, kind=kind)
    assert (judged.subject.group, judged.subject.version, judged.subject.kind) == (
        "apps", kind.version, "Deployment")


# --- current-format ActorTemplates ---------------------------------------------------------

def test_a_current_template_is_judged_in_its_crd_form_against_every_namespaces_pools() -> None:
    t = current_template([{"name": "memory", "quantity": "4Gi"}], labels={"team": "a"})
    judged = door(t, pool("ns-a", "1Gi"), pool("ns-b", "2Gi")).judge(t)
    assert judged.converted
    assert (judged.kind, judged.api_version, judged.namespace, judged.name) == (
        "ActorTemplate", "api.ate.dev/v1alpha1", "team-a", "agent")
    s = judged.subject
    assert (s.api_version, s.kind, s.namespace, s.dry_run) == ("ate.dev/v1alpha1", "ActorTemplate",
                                                              ANY_NAMESPACE, True)
    assert s.obj is not None and s.obj["metadata"]["labels"] == {"team": "a"}
    assert said(judged.evaluation.findings) == [
        "error actor-placement: needs 4Gi memory; the largest microvm WorkerPool in any "
        "namespace offers 2Gi"]
    assert judged.evaluation.patch == []


def test_what_the_conversion_cannot_read_is_actor_limits_and_follows_its_mode() -> None:
    bad = current_template("1Gi")
    judged = door(bad, pool("ns", "2Gi")).judge(bad)
    assert said(judged.evaluation.findings)[0] == (
        f"error {ACTOR_LIMITS}: spec.resources.limits: expected a list of {{name, quantity}}, got str")
    off = Policy.model_validate({"rules": {ACTOR_LIMITS: "off"}})
    quiet = door(bad, pool("ns", "2Gi"), policy=off).judge(bad)
    assert ACTOR_LIMITS not in quiet.evaluation.rule_ids


def test_a_version_takes_its_templates_selector() -> None:
    parent = current_template([{"name": "memory", "quantity": "512Mi"}])
    parent["spec"]["workerSelector"] = {"matchLabels": {"tier": "gpu"}}
    version = {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplateVersion",
               "metadata": {"atespace": "team-a", "name": "agent-v1"}, "actorTemplate": {"name": "agent"},
               "spec": {"sandboxConfig": {"sandboxClass": "SANDBOX_CLASS_MICROVM"},
                        "resources": {"limits": [{"name": "memory", "quantity": "512Mi"}]}}}
    judged = door(parent, version, pool("ns", "2Gi")).judge(version)
    assert judged.kind == "ActorTemplateVersion"
    assert said(judged.evaluation.findings) == [
        "error actor-placement: workerSelector tier=gpu matches none of the 1 microvm WorkerPools "
        "in any namespace"]


def test_pools_anywhere_names_each_pool_by_its_namespace() -> None:
    view = pools_anywhere([pool("a", "1Gi"), pool("b", "2Gi"), pool("a", "4Gi"),
                           workload("Deployment", [container()])], RULES)
    found = {(p["metadata"]["namespace"], p["metadata"]["name"],
              p["spec"]["template"]["resources"]["limits"]["memory"])
             for p in view.list("WorkerPool", ANY_NAMESPACE)}
    # A later pool of the same namespace and name replaces the earlier one.
    assert found == {(ANY_NAMESPACE, "a/vm", "4Gi"), (ANY_NAMESPACE, "b/vm", "2Gi")}


def test_an_update_without_namespaces_is_judged_in_the_placed_namespace() -> None:
    old = unnamespaced(workload("Deployment", [container(limits={"cpu": "4"})]))
    new = copy.deepcopy(old)
    new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "8"
    judged = door().judge(new, operation="UPDATE", old=old)
    assert judged.subject.namespace == "default"
    assert judged.subject.old is not None and judged.subject.old["metadata"]["namespace"] == "default"
    assert "namespace" not in old["metadata"]
    gone = door().judge(None, operation="DELETE", old=old)
    assert gone.namespace == "default"
