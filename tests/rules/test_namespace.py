"""The namespace rules together (app/rules/namespace/) over a static view: a stale view,
updates judged on what they change, huge quantities; and the pod amount they share."""

from __future__ import annotations

from typing import Any

from app.cluster.view import StaticView
from app.k8s.quantity import parse_quantity
from app.rules.envelope import pod_amount
from tests.conftest import container, run, workload
from tests.helpers.namespace import limitrange, node, quota


def deployment(name: str, replicas: int, memory: str, ns: str = "team-a") -> dict[str, Any]:
    obj = workload("Deployment", [container(requests={"memory": memory}, limits={"memory": memory})],
                   name=name, namespace=ns)
    obj["spec"]["replicas"] = replicas
    return obj


def test_pod_amount_follows_kubernetes_rules() -> None:
    spec = {"containers": [{"resources": {"requests": {"memory": "1Gi"}}},
                           {"resources": {"limits": {"memory": "2Gi"}}}],
            "initContainers": [{"resources": {"requests": {"memory": "4Gi"}}},
                               {"restartPolicy": "Always", "resources": {"requests": {"memory": "512Mi"}}},
                               {"resources": {"requests": {"memory": "3Gi"}}}],
            "overhead": {"memory": "100Mi"}}
    assert pod_amount(spec, "memory") == parse_quantity("4196Mi")
    spec["resources"] = {"requests": {"memory": "10Gi"}}
    assert pod_amount(spec, "memory") == parse_quantity("10Gi") + parse_quantity("100Mi")
    assert pod_amount({"containers": [{"resources": {"limits": {"memory": "1Gi"}}}]}, "memory",
                      "limits") == parse_quantity("1Gi")


def test_stale_view_is_answered_per_failure_mode() -> None:
    class Stale(StaticView):
        def problems(self, kinds: Any = None) -> list[str]:
            return ["Node watch lost 90s ago"]

    obj = workload("Deployment", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})])
    result = run(obj, view=Stale())
    assert any("pod-fits-node: cluster view not current (Node watch lost 90s ago)" in str(e)
               for e in result.internal_errors)


def test_updates_are_not_blocked_for_what_they_did_not_change() -> None:
    """A cluster that shrank, or an object older than the policy: `kubectl rollout
    restart` (an annotation) warns but passes; changing the envelope is judged."""
    view = StaticView([node("n1", "16", "32Gi")])
    old = deployment("web", 2, "64Gi")
    old["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "48Gi"
    restarted = deployment("web", 2, "64Gi")
    restarted["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = "48Gi"
    restarted["spec"]["template"]["metadata"] = {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}}
    result = run(restarted, operation="UPDATE", old=old, view=view)
    assert result.errors == []
    warned = {w.rule for w in result.warnings if w.message.startswith("already so before this update")}
    assert warned == {"pod-fits-node", "memory-request-equals-limit"}
    # growing the envelope further is a change this write makes: refused
    grown = deployment("web", 2, "128Gi")
    assert {e.rule for e in run(grown, operation="UPDATE", old=old, view=view).errors} == {"pod-fits-node"}
    # the same object as a CREATE is refused as before
    assert {e.rule for e in run(restarted, view=view).errors} == {"pod-fits-node",
                                                                  "memory-request-equals-limit"}


def test_huge_quantities_are_judged_quickly_not_crashed() -> None:
    """Class 7: the API server takes 1e999999999; the node rule and the guards must
    judge it (it fits nowhere), never hang on integer conversion or overflow."""
    import time

    view = StaticView([node("n1", "16", "32Gi"), quota({"limits.cpu": "1e999999999"}),
                       limitrange({"type": "Pod", "max": {"cpu": "1e999999999"}})])
    obj = workload("Deployment", [container(requests={"memory": "1e999999999", "cpu": "1e999999999"},
                                            limits={"memory": "1e999999999", "cpu": "1e999999999"})])
    start = time.monotonic()
    result = run(obj, view=view)
    assert time.monotonic() - start < 5
    assert result.internal_errors == []
    assert any(e.rule == "pod-fits-node" for e in result.errors)
