"""pod-fits-node judges node classes, not nodes (issue 27 item 5): the grouped evaluation
gives the verdict and the message that judging every node on its own gives, and the
class index stays right as Nodes come, change and go."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.cluster.view import ScopedView, StaticView
from app.core.config import Policy
from app.k8s.defaulting import effective_pod_requests
from app.k8s.scheduling import CORDONED, PodPlacement, fit_node, place_pod
from app.rules.base import Subject
from app.rules.namespace.node_groups import (
    MAX_NODE_GROUPS,
    NODE_CLASS,
    _node_of,
    _reserved,
    node_class,
    node_groups,
)
from app.rules.namespace.pod_fits import pod_fits_node
from tests.conftest import container, run, workload

HOST = "kubernetes.io/hostname"
SUBJECT = Subject("apps", "v1", "Deployment", namespace="team-a", name="w")
NAMED = Policy.model_validate({"nodes": {"nameInMessages": True}})


def node(name: str, cpu: str, memory: str, *, labels: dict[str, str] | None = None,
         taints: list[dict[str, str]] | None = None, unschedulable: bool = False,
         gpu: str | None = None) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpu is not None:
        alloc["nvidia.com/gpu"] = gpu
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {HOST: name, **(labels or {})}},
            "spec": spec, "status": {"allocatable": alloc}}


def per_node(view: StaticView, spec: dict[str, Any], requests: dict[str, Any], rc: int, rm: int) -> Any:
    """The reference: every Node judged on its own with ``fit_node``, the closest chosen
    here (fewest short resources, then the smallest missing share, ties to the first
    name), not by ``place_pod``."""
    nodes = [_reserved(n, rc, rm) for n in map(_node_of, view.list("Node")) if n is not None]
    verdicts = [fit_node(spec, n, requests) for n in nodes]
    if any(v.fits for v in verdicts):
        return PodPlacement(True)
    short = [v for v in verdicts if not v.blocked and v.shortfalls]
    closest = min(short, key=lambda v: (v.distance(), v.node.name)) if short else None
    return PodPlacement(False, closest=closest, count=len(verdicts),
                        reasons=tuple(sorted({r for v in verdicts for r in v.blocked})),
                        cordoned_only=any(v.blocked == (CORDONED,) and not v.shortfalls for v in verdicts))


def grouped(view: StaticView, spec: dict[str, Any], requests: dict[str, Any], rc: int, rm: int) -> Any:
    return place_pod(spec, node_groups(view, spec, rc, rm), requests, MAX_NODE_GROUPS)


def same(a: Any, b: Any) -> None:
    assert (a.fits, a.complete, a.count, a.reasons, a.cordoned_only) == \
        (b.fits, b.complete, b.count, b.reasons, b.cordoned_only)
    assert (a.closest is None) == (b.closest is None)
    if a.closest is not None:
        assert a.closest.node.name == b.closest.node.name
        assert dict(a.closest.node.allocatable) == dict(b.closest.node.allocatable)
        assert (a.closest.blocked, a.closest.shortfalls) == (b.closest.blocked, b.closest.shortfalls)


# --- a generated cluster and pod -----------------------------------------------------

names = st.sampled_from([*(f"n{i}" for i in range(10)), "7", "30"])  # numeric: Gt/Lt on hostname
taint = st.sampled_from([{"key": "gpu", "effect": "NoSchedule"},
                         {"key": "spot", "value": "true", "effect": "NoExecute"},
                         {"key": "soft", "effect": "PreferNoSchedule"}])
node_st = st.builds(
    lambda name, cpu, gib, zone, host, taints, cordon, gpu: (name, {
        **node(name, cpu, f"{gib}Gi", labels={"zone": zone} if zone else {}, taints=taints,
               unschedulable=cordon, gpu=gpu)} | ({} if host else {"metadata": {
                   "name": name, "labels": {"zone": zone} if zone else {}}})),
    names, st.sampled_from(["2", "4", "8"]), st.sampled_from([4, 16, 32]),
    st.sampled_from(["", "a", "b"]), st.booleans(), st.lists(taint, max_size=2, unique_by=str),
    st.booleans(), st.sampled_from([None, "0", "4"]))
expr = st.one_of(
    st.builds(lambda op, vs: {"key": "zone", "operator": op, "values": vs},
              st.sampled_from(["In", "NotIn"]), st.lists(st.sampled_from(["a", "b", "c"]), min_size=1,
                                                          max_size=2)),
    st.builds(lambda op: {"key": "zone", "operator": op}, st.sampled_from(["Exists", "DoesNotExist"])),
    st.builds(lambda op, vs: {"key": HOST, "operator": op, "values": vs},
              st.sampled_from(["In", "NotIn"]), st.lists(names, min_size=1, max_size=3)),
    st.builds(lambda op: {"key": HOST, "operator": op}, st.sampled_from(["Exists", "DoesNotExist"])),
    st.builds(lambda op, v: {"key": HOST, "operator": op, "values": [v]},
              st.sampled_from(["Gt", "Lt"]), st.sampled_from(["5", "n3"])),
)
field = st.builds(lambda op, v: {"key": "metadata.name", "operator": op, "values": [v]},
                  st.sampled_from(["In", "NotIn"]), names)
term = st.builds(lambda exprs, fields: {k: v for k, v in (("matchExpressions", exprs),
                                                          ("matchFields", fields)) if v},
                 st.lists(expr, max_size=2), st.lists(field, max_size=1))


@st.composite
def pods(draw: Any) -> dict[str, Any]:
    limits: dict[str, str] = {"memory": f"{draw(st.sampled_from([1, 8, 20, 40]))}Gi"}
    if draw(st.booleans()):
        limits["nvidia.com/gpu"] = draw(st.sampled_from(["1", "8"]))
    requests = {"cpu": draw(st.sampled_from(["500m", "3", "7", "16"])), "memory": limits["memory"]}
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x",
                                            "resources": {"requests": requests, "limits": limits}}]}
    tolerations = draw(st.lists(st.sampled_from([
        {"key": "gpu", "operator": "Exists"}, {"key": "spot", "operator": "Equal", "value": "true"},
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}, {"operator": "Exists"}]),
        max_size=2))
    if tolerations:
        spec["tolerations"] = tolerations
    selector = draw(st.one_of(st.none(), st.just({"zone": "a"}), names.map(lambda n: {HOST: n})))
    if selector:
        spec["nodeSelector"] = selector
    terms = draw(st.lists(term, max_size=2))
    if terms:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    return spec


@settings(max_examples=400, deadline=None)
@given(nodes=st.lists(node_st, max_size=12, unique_by=lambda t: t[0]), spec=pods(),
       reserve=st.sampled_from([(0, 0), (500, 2**30)]))
def test_judging_classes_gives_what_judging_every_node_gives(
        nodes: list[tuple[str, dict[str, Any]]], spec: dict[str, Any], reserve: tuple[int, int]) -> None:
    view = StaticView([n for _, n in nodes])
    requests = effective_pod_requests(spec, is_pod=False)
    same(grouped(view, spec, requests, *reserve), per_node(view, spec, requests, *reserve))


@settings(max_examples=150, deadline=None)
@given(nodes=st.lists(node_st, min_size=1, max_size=12, unique_by=lambda t: t[0]), spec=pods(),
       named=st.booleans())
def test_the_rule_says_what_judging_every_node_says(
        nodes: list[tuple[str, dict[str, Any]]], spec: dict[str, Any], named: bool) -> None:
    """The finding itself, word for word: the rule on the cluster as it is (nodes merged
    into classes) and on the same nodes made one class each (a label only that node has,
    which no pod selects on), where judging by class is judging node by node."""
    policy = NAMED if named else Policy()
    obj = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w", "namespace": "team-a"},
           "spec": {"template": {"spec": spec}}}
    view = StaticView([n for _, n in nodes])
    scoped = ScopedView(view, pod_fits_node.rule.reads, "pod-fits-node")
    mine = pod_fits_node(SUBJECT, copy.deepcopy(obj), scoped, policy)
    # Same nodes, each made a class of its own by a label no other node has.
    alone = StaticView([{**n, "metadata": {**n["metadata"], "labels": {
        **n["metadata"].get("labels", {}), f"own/{name}": "1"}}} for name, n in nodes])
    scoped_alone = ScopedView(alone, pod_fits_node.rule.reads, "pod-fits-node")
    theirs = pod_fits_node(SUBJECT, copy.deepcopy(obj), scoped_alone, policy)
    assert len(alone.index_counts(NODE_CLASS)) == len([n for _, n in nodes if _node_of(n)])
    assert [(f.path, f.message, f.severity) for f in mine] == \
        [(f.path, f.message, f.severity) for f in theirs]


# --- fixed cases ------------------------------------------------------------------------

def big() -> dict[str, Any]:
    return workload("Deployment", [container(requests={"cpu": "1", "memory": "64Gi"},
                                             limits={"memory": "64Gi"})])


def test_five_thousand_nodes_of_three_shapes_are_three_classes() -> None:
    nodes = [node(f"n{i}", "16", ["32Gi", "48Gi", "24Gi"][i % 3], labels={"zone": "a"})
             for i in range(5000)]
    view = StaticView(nodes)
    assert sorted(view.index_counts(NODE_CLASS).values()) == [1666, 1667, 1667]
    [error] = run(big(), view=view).errors
    assert "the closest (a node with 16 cpu, 48Gi memory) offers 48Gi memory" in error.message
    [error] = run(big(), view=view, policy=NAMED).errors
    assert "the closest (n1) offers 48Gi memory" in error.message  # ties to the first name


def test_a_pod_pinned_to_one_host_is_judged_on_that_host() -> None:
    nodes = [node(f"n{i}", "16", "32Gi") for i in range(50)] + [node("big", "16", "128Gi")]
    pinned = big()
    pinned["spec"]["template"]["spec"]["nodeSelector"] = {HOST: "n7"}
    [error] = run(pinned, view=StaticView(nodes), policy=NAMED).errors
    assert "the closest (n7) offers 32Gi memory" in error.message
    pinned["spec"]["template"]["spec"]["nodeSelector"] = {HOST: "big"}
    assert run(pinned, view=StaticView(nodes)).errors == []
    by_field = big()
    by_field["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["big"]}]}]}}}
    [error] = run(by_field, view=StaticView(nodes), policy=NAMED).errors
    assert "the closest (n0) offers 32Gi memory" in error.message


def test_the_class_index_follows_adds_changes_and_removals() -> None:
    view = StaticView(indexes=[NODE_CLASS])
    for i in range(6):
        view.add(node(f"n{i}", "8", "16Gi"))
    assert list(view.index_counts(NODE_CLASS).values()) == [6]
    view.add(node("n2", "8", "16Gi", unschedulable=True))  # cordoned: a class of its own
    view.add(node("n3", "8", "64Gi"))
    view.remove("Node", "n4")
    assert sorted(view.index_counts(NODE_CLASS).values()) == [1, 1, 3]
    view.add(node("n2", "8", "16Gi"))
    view.replace("Node", [node("m1", "8", "16Gi"), node("m2", "4", "16Gi")])
    rebuilt = StaticView([node("m1", "8", "16Gi"), node("m2", "4", "16Gi")])
    assert view.index_counts(NODE_CLASS) == rebuilt.index_counts(NODE_CLASS)
    view.remove("Node", "m2")
    view.remove("Node", "m1")
    assert view.index_counts(NODE_CLASS) == {}


def test_a_node_whose_quantities_do_not_parse_is_in_no_class() -> None:
    assert node_class(node("bad", "lots", "16Gi")) == []
    view = StaticView([node("bad", "lots", "16Gi"), node("ok", "8", "16Gi")])
    [error] = run(big(), view=view).errors
    assert "a node with 8 cpu, 16Gi memory" in error.message


def test_more_classes_than_the_limit_are_not_refused_on_a_guess() -> None:
    """The bound on a review: at most MAX_NODE_GROUPS classes are judged. A pod the first
    of them takes is allowed; one none of them takes is allowed with a warning that the
    rule did not decide, never refused."""
    nodes = [node(f"n{i}", str(1 + i), "16Gi") for i in range(MAX_NODE_GROUPS + 200)]
    view = StaticView(nodes)
    assert len(view.index_counts(NODE_CLASS)) == MAX_NODE_GROUPS + 200
    result = run(big(), view=view)
    assert result.errors == []
    [warned] = [w for w in result.warnings if w.rule == "pod-fits-node"]
    assert f"more than {MAX_NODE_GROUPS} classes" in warned.message
    small = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                              limits={"memory": "1Gi"})])
    assert [w for w in run(small, view=view).warnings if w.rule == "pod-fits-node"] == []


def test_gt_on_a_per_node_label_judges_every_node() -> None:
    """``Gt``/``Lt`` compare the hostname as a number: a class cannot decide for its
    members, so each is judged on its own."""
    nodes = [node(str(i), "16", "32Gi") for i in range(1, 9)]
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1"}}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": HOST, "operator": "Gt", "values": ["6"]}]}]}}}}
    view = StaticView(nodes)
    requests = effective_pod_requests(spec, is_pod=False)
    assert len(list(node_groups(view, spec, 0, 0))) == 8
    placed = grouped(view, spec, requests, 0, 0)
    assert placed.fits
    same(placed, per_node(view, spec, requests, 0, 0))


def test_malformed_nodes_are_judged_as_every_node_would_be() -> None:
    """Hand-written files (envelope check) may hold nodes with odd metadata: the class
    path reads them as node_from_object does, never crashes."""
    odd = [{"apiVersion": "v1", "kind": "Node", "metadata": "x",
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}}},
           {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": "nope"},
            "status": {"allocatable": {"cpu": "8", "memory": "16Gi"}}},
           node("n2", "8", "16Gi")]
    view = StaticView(odd)
    for spec in ({"containers": [{"name": "c", "resources": {"requests": {"cpu": "64"}}}],
                  "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                      "nodeSelectorTerms": [{"matchExpressions": [
                          {"key": HOST, "operator": "Gt", "values": ["1"]}]}]}}}},
                 {"containers": [{"name": "c", "resources": {"requests": {"cpu": "64"}}}],
                  "nodeSelector": {HOST: "n2"}}):
        requests = effective_pod_requests(spec, is_pod=False)
        same(grouped(view, spec, requests, 0, 0), per_node(view, spec, requests, 0, 0))
