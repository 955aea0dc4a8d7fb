"""Class 10 (issue 12): pod-fits-node on autoscaled clusters (app/crds/autoscaling.py).

A pod no current node takes but a node the autoscaler can create would is warned
about, never refused; one no such node could hold is still refused."""

from __future__ import annotations

from typing import Any

import pytest

from app.cluster.live import trim_karpenter_nodepool
from app.cluster.view import StaticView
from app.core.config import ConfigError, Policy, load_policy
from app.crds.autoscaling import KARPENTER_NODEPOOL, pool_shape
from tests.conftest import RULES, container, run, workload
from tests.helpers.namespace import node


def pod(cpu: str, memory: str = "1Gi", **spec: Any) -> dict[str, Any]:
    obj = workload("Deployment", [container(requests={"cpu": cpu, "memory": memory},
                                            limits={"memory": memory})])
    obj["spec"]["template"]["spec"].update(spec)
    return obj


def shapes(*items: dict[str, Any]) -> Policy:
    return Policy.model_validate({"nodes": {"autoscaledShapes": list(items)}})


BIG = {"name": "m5.4xlarge", "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}}
SMALL_NODES = StaticView([node("n1", "4", "16Gi")])
NAMED = Policy.model_validate({"nodes": {"nameInMessages": True}})


def findings(obj: dict[str, Any], policy: Policy | None = None,
             view: StaticView | None = None) -> tuple[list[str], list[str]]:
    result = run(obj, policy, view=view if view is not None else SMALL_NODES)
    return ([e.message for e in result.errors if e.rule == "pod-fits-node"],
            [w.message for w in result.warnings if w.rule == "pod-fits-node"])


# --- policy shapes: nodes.autoscaledShapes ---------------------------------------------

def test_fits_only_a_policy_shape_is_a_warning_in_enforce_mode() -> None:
    errors, warnings = findings(pod("8"), shapes(BIG))
    assert errors == []
    assert warnings == ["fits no current node; would fit a node that autoscaled shape m5.4xlarge "
                        "can create: it waits for the autoscaler"]


def test_too_big_for_every_shape_is_still_refused_with_numbers() -> None:
    errors, warnings = findings(pod("32"), shapes(BIG))
    assert warnings == []
    (text,) = errors
    assert "the closest (a node with 4 cpu, 16Gi memory) offers 4 cpu" in text
    assert "no autoscaled node takes it either (shape m5.4xlarge: cpu 32 requested, 16 allocatable)" in text


def test_without_shapes_the_verdict_is_unchanged() -> None:
    errors, _ = findings(pod("8"))
    assert len(errors) == 1 and "autoscaled" not in errors[0]


def test_shape_taints_and_labels_are_judged_like_a_node() -> None:
    tainted = {**BIG, "labels": {"pool": "gpu"},
               "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}
    errors, _ = findings(pod("8"), shapes(tainted))
    assert "untolerated taint nvidia.com/gpu:NoSchedule" in errors[0]
    tolerating = pod("8", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    assert findings(tolerating, shapes(tainted))[0] == []
    elsewhere = pod("8", nodeSelector={"pool": "cpu"},
                    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    errors, _ = findings(elsewhere, shapes(tainted))
    assert "node does not match the pod's nodeSelector" in errors[0]


def test_node_reserves_apply_to_shapes() -> None:
    policy = Policy.model_validate({"nodes": {"reserveCpu": "1", "autoscaledShapes": [BIG]}})
    assert findings(pod("15"), policy)[0] == []
    errors, _ = findings(pod("15.5"), policy)
    assert "cpu 15500m requested, 15 allocatable" in errors[0]


def test_scale_from_zero_shapes_judge_without_nodes() -> None:
    errors, warnings = findings(pod("8"), shapes(BIG), view=StaticView())
    assert errors == [] and len(warnings) == 1
    errors, _ = findings(pod("32"), shapes(BIG), view=StaticView())
    assert errors[0].startswith("no node exists and no node the autoscaler can create takes the pods")


def test_policy_shapes_are_validated_at_load(tmp_path: Any) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("nodes:\n  autoscaledShapes:\n  - name: x\n    allocatable: {cpu: lots}\n")
    with pytest.raises(ConfigError, match="autoscaledShapes"):
        load_policy(str(path), {}, RULES)
    path.write_text("nodes:\n  autoscaledShapes:\n  - name: x\n    allocatable: {cpu: '8'}\n"
                    "    taints: [{key: a, effect: Sometimes}]\n")
    with pytest.raises(ConfigError, match="effect"):
        load_policy(str(path), {}, RULES)


# --- Karpenter NodePools (karpenter.sh/v1) -----------------------------------------------

def karpenter(name: str = "default", *, limits: dict[str, str] | None = None,
              used: dict[str, str] | None = None, requirements: list[dict[str, Any]] | None = None,
              labels: dict[str, str] | None = None,
              taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
            "spec": {"template": {"metadata": {"labels": labels or {}},
                                  "spec": {"requirements": requirements or [],
                                           "taints": taints or [],
                                           "nodeClassRef": {"group": "karpenter.k8s.aws",
                                                            "kind": "EC2NodeClass", "name": "x"}}},
                     "limits": limits or {}},
            "status": {"resources": used or {}}}


def with_pools(*pools: dict[str, Any]) -> StaticView:
    return StaticView([node("n1", "4", "16Gi"), *pools])


def test_nodepool_limits_cap_what_a_new_node_can_hold() -> None:
    view = with_pools(karpenter(limits={"cpu": "100"}, used={"cpu": "90"}))
    errors, warnings = findings(pod("8"), view=view)
    assert errors == []
    assert warnings == ["fits no current node; would fit a node that a Karpenter NodePool "
                        "can create: it waits for the autoscaler"]
    errors, _ = findings(pod("12"), view=view)
    assert "a Karpenter NodePool: cpu 12 requested, more than its limits leave" in errors[0]
    # Names and the room left only where the policy allows it (app/k8s/disclosure.py).
    _, warnings = findings(pod("8"), NAMED, view=view)
    assert warnings == ['fits no current node; would fit a node that Karpenter NodePool "default" '
                        "can create: it waits for the autoscaler"]
    errors, _ = findings(pod("12"), NAMED, view=view)
    assert "NodePool default: cpu 12 requested, 10 left under its limits" in errors[0]


def test_nodepool_without_limits_never_refuses_on_size() -> None:
    """The instance types are the cloud provider's: without a limit any size may exist."""
    errors, warnings = findings(pod("500", "4Ti"), view=with_pools(karpenter()))
    assert errors == [] and len(warnings) == 1


def test_nodepool_at_its_node_limit_creates_nothing() -> None:
    view = with_pools(karpenter(limits={"nodes": "5"}, used={"nodes": "5"}))
    errors, _ = findings(pod("8"), view=view)
    assert "a Karpenter NodePool: pods 1 requested, more than its limits leave" in errors[0]
    assert "NodePool default: pods 1 requested, 0 left under its limits" in \
        findings(pod("8"), NAMED, view=view)[0][0]


def test_nodepool_taints_and_fixed_labels() -> None:
    gpu = karpenter("gpu", labels={"team": "ml"},
                    requirements=[{"key": "karpenter.k8s.aws/instance-family", "operator": "In",
                                   "values": ["p5"]}],
                    taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    view = with_pools(gpu)
    errors, _ = findings(pod("8"), view=view)
    assert "a Karpenter NodePool: untolerated taint nvidia.com/gpu:NoSchedule" in errors[0]
    tol = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    ok = pod("8", tolerations=tol, nodeSelector={"team": "ml", "karpenter.sh/nodepool": "gpu",
                                                   "karpenter.k8s.aws/instance-family": "p5"})
    assert findings(ok, view=view)[0] == []
    wrong_family = pod("8", tolerations=tol, nodeSelector={"karpenter.k8s.aws/instance-family": "g6"})
    assert "a Karpenter NodePool: node does not match" in findings(wrong_family, view=view)[0][0]
    custom = pod("8", tolerations=tol, nodeSelector={"team": "web"})
    assert findings(custom, view=view)[0] != []


@pytest.mark.parametrize("spec", [
    {"nodeSelector": {"topology.kubernetes.io/zone": "eu-west-1b"}},  # multi-value In
    {"nodeSelector": {"node.kubernetes.io/instance-type": "m7i.8xlarge"}},  # well known, open
    {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}]}}}},
])
def test_open_keys_may_be_placed_so_are_never_refused(spec: dict[str, Any]) -> None:
    pool = karpenter(requirements=[
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["eu-west-1a", "eu-west-1b"]},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}])
    errors, warnings = findings(pod("8", **spec), view=with_pools(pool))
    assert errors == []
    assert "if it gets the labels the pod selects" in warnings[0]


def test_open_key_does_not_excuse_a_fixed_label_mismatch() -> None:
    pool = karpenter(labels={"team": "ml"}, requirements=[
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}])
    obj = pod("8", nodeSelector={"topology.kubernetes.io/zone": "a", "team": "web"})
    errors, _ = findings(obj, view=with_pools(pool))
    assert "a Karpenter NodePool: node does not match" in errors[0]


def test_does_not_exist_closes_a_key() -> None:
    pool = karpenter(requirements=[{"key": "kubernetes.io/arch", "operator": "DoesNotExist"}])
    errors, _ = findings(pod("8", nodeSelector={"kubernetes.io/arch": "arm64"}), view=with_pools(pool))
    assert errors != []


def test_kai_nodepools_are_not_karpenter_pools() -> None:
    kai = {"apiVersion": "kai.resources/v1alpha1", "kind": "NodePool", "metadata": {"name": "default"},
           "spec": {"labelKey": "pool", "labelValue": "a"}}
    errors, warnings = findings(pod("8"), view=with_pools(kai))
    assert len(errors) == 1 and warnings == [] and "autoscaled" not in errors[0]


def test_live_view_key_and_trim() -> None:
    """In the live view Karpenter NodePools live under their own key (KAI owns "NodePool")."""
    raw = karpenter(limits={"cpu": "100"}, used={"cpu": "90"}, labels={"team": "ml"})
    raw["metadata"]["managedFields"] = [{"manager": "karpenter"}]
    trimmed = trim_karpenter_nodepool(raw)
    assert "managedFields" not in trimmed["metadata"]
    assert trimmed["status"] == {"resources": {"cpu": "90"}}
    view = StaticView([node("n1", "4", "16Gi")])
    view.add(trimmed, KARPENTER_NODEPOOL)
    errors, warnings = findings(pod("8", nodeSelector={"team": "ml"}), view=view)
    assert errors == [] and len(warnings) == 1
    assert pool_shape(trimmed) == pool_shape(raw)
