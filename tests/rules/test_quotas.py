"""KAI quota trees: every rule, on CREATE, UPDATE and DELETE, through the engine."""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.core.engine import Evaluation, check_object
from app.crds.kai import DepartmentSpec, parse
from app.rules.base import Subject
from tests.conftest import RULES
from tests.helpers.quotas import KRM, base, department, entry, judge, node, nodepool, project, queue

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tenancy"


# --- builders -------------------------------------------------------------------------


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def edited(obj: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    change(out["spec"])
    return out


def set_gpu(index: int, deserved: float | None = None, limit: float | None = None,
            key: str = "deserved") -> Callable[[dict[str, Any]], None]:
    def change(spec: dict[str, Any]) -> None:
        gpu = (spec["queues"][index] if index >= 0 else spec)["resources"]["gpu"]
        if deserved is not None:
            gpu[key] = deserved
        if limit is not None:
            gpu["limit"] = limit
    return change


def hits(result: Evaluation) -> set[tuple[str, str]]:
    return {(f.severity, f.rule) for f in result.findings}


# --- the table ------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    obj: Callable[[], dict[str, Any] | None]
    expect: set[tuple[str, str]]
    operation: str = "CREATE"
    old: Callable[[], dict[str, Any] | None] = lambda: None
    cluster: Callable[[], list[dict[str, Any]]] = base
    says: list[str] = field(default_factory=list)
    """Substrings every expected finding's messages must contain, in order of appearance."""


def _b(kind: str, name: str) -> Callable[[], dict[str, Any]]:
    return lambda: named(base(), kind, name)


def _bx(kind: str, name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[], dict[str, Any]]:
    return lambda: edited(named(base(), kind, name), change)


E, W = "error", "warning"

CASES = [
    # kai-schema: types, with the path; never an exception
    Case("schema-string-quota", lambda: project("p", "platform", entry("q0", gpu=(0, 1)),
                                                 entry("q1", "default", gpu=("32Gi", -1))),
         {(E, "kai-schema")}, says=["spec.queues[1].resources.gpu.deserved: expected a number, got '32Gi'"]),
    Case("schema-bool", lambda: project("p", "platform", entry("q", gpu=(True, 4))),
         {(E, "kai-schema")}, says=["expected a number, got true"]),
    Case("schema-missing-name", lambda: department("d", {"nodepool": "rtx"}),
         {(E, "kai-schema")}, says=["spec.queues[0].name: required field is missing"]),
    Case("schema-spec-not-object", lambda: {**department("d"), "spec": ["x"]},
         {(E, "kai-schema")}, says=["spec: expected an object, got a list"]),
    Case("schema-queue-quota", lambda: queue("q", gpu=("2", -1)),
         {(E, "kai-schema")}, says=["spec.resources.gpu.quota: expected a number, got '2'"]),
    Case("schema-unknown-fields", lambda: project("p", "", {**entry("q", "default"), "resources": {
        "gpu": {"deserved": 0, "limit": -1, "deservd": 2}}}, unknownField=True),
         {(W, "kai-schema")}, says=["spec.unknownField: unknown field; kubectl apply refuses it",
                                    "spec.queues[0].resources.gpu.deservd: unknown field"]),
    Case("schema-nodepool-shard-config", lambda: {**nodepool("a100"), "spec": {
        "labelKey": "pool", "labelValue": "a100", "schedulingShardConfig": {"args": {"v": "4"}}}}, set()),
    Case("schema-no-spec", lambda: {"apiVersion": KRM, "kind": "Department", "metadata": {"name": "d"}},
         set()),
    Case("schema-update-untouched", lambda: {**named(base(), "Project", "workspace"),
                                             "metadata": {"name": "workspace", "labels": {"a": "b"}}},
         set(), "UPDATE", old=lambda: edited(named(base(), "Project", "workspace"),
                                             set_gpu(0, "bad"))),  # type: ignore[arg-type]
    # kai-structure: what KRM refuses
    Case("structure-unknown-pool", lambda: project("p", "", entry("q", "a100")),
         {(E, "kai-structure")}, says=["q (pool a100): node pool a100 does not exist"]),
    Case("structure-default-pool-implicit", lambda: project("p", "", entry("q", "default")), set()),
    Case("structure-empty-pool", lambda: project("p", "", entry("q", "")),
         {(E, "kai-structure")}, says=["nodepool is empty"]),
    Case("structure-two-queues-one-pool", lambda: project("p", "", entry("q1"), entry("q2")),
         {(E, "kai-structure")}, says=["a second queue on pool rtx in this Project"]),
    Case("structure-unknown-parent", lambda: project("p", "ghost", entry("q", "default")),
         {(E, "kai-structure")}, says=["parent department ghost does not exist"]),
    Case("structure-default-pool-without-queue",
         lambda: project("p", "", entry("q", "default"), defaultNodePools=["default", "rtx"]),
         {(E, "kai-structure")}, says=["default node pool rtx has no queue in spec.queues"]),
    Case("structure-label-pair-taken", lambda: nodepool("rtx-2", "pool", "rtx"),
         {(E, "kai-structure")}, says=["label pool=rtx already selects the nodes of pool rtx"]),
    Case("structure-label-pair-update-same-pool", _b("NodePool", "rtx"), set(), "UPDATE",
         old=lambda: {**nodepool("rtx"), "spec": {"labelKey": "pool", "labelValue": "rtx",
                                                   "preferredNetworkTopologyName": "x"}}),
    Case("structure-queue-without-resources", lambda: queue("q", gpu=None),
         {(E, "kai-structure")}, says=["spec.resources is required"]),
    Case("structure-queue-unknown-parent", lambda: queue("q", "ghost"),
         {(W, "kai-structure")}, says=["parent queue ghost not found"]),
    Case("structure-queue-own-parent", lambda: queue("q", "q"),
         {(E, "kai-structure")}, says=["cannot be its own parent"]),
    # kai-values (rule 4)
    Case("values-negative-deserved", lambda: project("p", "", entry("q", "default", gpu=(-2, -1))),
         {(E, "kai-values")}, says=["q (pool default): gpu deserved -2 cards is negative"]),
    Case("values-negative-limit", lambda: project("p", "", entry("q", "default", cpu=(0, -0.5))),
         {(E, "kai-values")}, says=["cpu limit -0.5 mCPU is negative"]),
    Case("values-minus-one-is-unlimited", lambda: project("p", "", entry("q", "default", gpu=(-1, -1))),
         set()),
    Case("values-negative-weight", lambda: project("p", "", entry("q", "default", weight=-1)),
         {(E, "kai-values")}, says=["overQuotaWeight -1 is negative"]),
    Case("values-fractional-priority", lambda: project("p", "", entry("q", "default", priority=1.5)),
         {(E, "kai-values")}, says=["priority 1.5 must be a whole number"]),
    Case("values-priority-int32", lambda: department("d", entry("q", "default", priority=2**31)),
         {(E, "kai-values")}, says=["does not fit in 32 bits"]),
    Case("values-queue-negative-quota", lambda: queue("q", gpu=(-3, -1)),
         {(E, "kai-values")}, says=["q: gpu quota -3 cards is negative"]),
    Case("values-update-keeps-old-mistake",
         lambda: project("p", "", entry("q", "default", gpu=(-2, -1)), namespace="n2"),
         set(), "UPDATE", old=lambda: project("p", "", entry("q", "default", gpu=(-2, -1)))),
    Case("values-update-changes-mistake",
         lambda: project("p", "", entry("q", "default", gpu=(-3, -1))),
         {(E, "kai-values")}, "UPDATE", old=lambda: project("p", "", entry("q", "default", gpu=(-2, -1)))),
    # kai-deserved-limit (rule 2)
    Case("limit-below-deserved", lambda: project("p", "", entry("q", "default", gpu=(4, 2))),
         {(E, "kai-deserved-limit")},
         says=["q (pool default): gpu deserved 4 cards is above its limit 2 cards"]),
    Case("limit-left-out-is-zero", lambda: project("p", "", {"name": "q", "nodepool": "default",
                                                             "resources": {"cpu": {"deserved": 500}}}),
         {(E, "kai-deserved-limit")},
         says=["cpu deserved 500 mCPU is above its limit 0 mCPU (a limit left out is 0)"]),
    Case("limit-unlimited-deserved-under-finite",
         lambda: project("p", "", entry("q", "default", memory=(-1, 64000))),
         {(E, "kai-deserved-limit")}, says=["memory deserved unlimited is above its limit 64000 MB"]),
    Case("limit-unlimited-limit", lambda: project("p", "", entry("q", "default", gpu=(100, -1))), set()),
    Case("limit-queue", lambda: queue("q", gpu=(5, 4)), {(E, "kai-deserved-limit")},
         says=["q: gpu quota 5 cards is above its limit 4 cards"]),
    # kai-guarantee-sum (rule 1)
    Case("sum-project-create-over",
         lambda: project("extra", "platform", entry("extra-rtx", gpu=(1, 4))),
         {(E, "kai-guarantee-sum")},
         says=["platform-rtx (pool rtx): projects are guaranteed 5 cards in total but the department "
               "has 4 cards - 1 card cannot be met", "first lower another project's gpu deserved"]),
    Case("sum-project-create-fits",
         lambda: project("extra", "platform", entry("extra-rtx", gpu=(0, 4), cpu=(0, -1))), set()),
    Case("sum-project-grows", _bx("Project", "workspace", set_gpu(0, 3.5)),
         {(E, "kai-guarantee-sum")}, "UPDATE", old=_b("Project", "workspace"),
         says=["projects are guaranteed 4.5 cards in total but the department has 4 cards - 0.5 cards"]),
    Case("sum-project-shrinks-while-over", _bx("Project", "workspace", set_gpu(0, 3.5)), set(), "UPDATE",
         old=_bx("Project", "workspace", set_gpu(0, 4))),
    Case("sum-project-unlimited-under-finite", _bx("Project", "workspace", set_gpu(0, -1, -1)),
         {(E, "kai-guarantee-sum"), (W, "kai-tree-warnings")}, "UPDATE", old=_b("Project", "workspace"),
         says=["projects are guaranteed unlimited in total", "an unlimited guarantee cannot fit in 4 cards"]),
    Case("sum-project-fractions-fit",
         lambda: project("extra", "platform", entry("extra-rtx", gpu=(0.2, 1))),
         set(), cluster=lambda: [*base()[:5],
                                 project("a", "platform", entry("a-rtx", gpu=(0.1, 1))),
                                 project("b", "platform", entry("b-rtx", gpu=(3.7, 4)))]),
    Case("sum-project-under-unlimited-department",
         lambda: project("extra", "platform", entry("extra-rtx", gpu=(50, -1))),
         set(), cluster=lambda: [*base()[:3], department("platform", entry("platform-rtx", gpu=(-1, -1)))]),
    Case("sum-project-moves-department",
         lambda: project("workspace", "research", entry("workspace-rtx", gpu=(3, 4))), set(), "UPDATE",
         old=_b("Project", "workspace")),
    Case("sum-project-moves-into-full-department",
         lambda: project("workspace", "research", entry("workspace-rtx", gpu=(3, 4))),
         {(E, "kai-guarantee-sum")}, "UPDATE", old=_b("Project", "workspace"),
         cluster=lambda: [*base(), project("r1", "research", entry("r1-rtx", gpu=(2, 4)))],
         says=["research-rtx (pool rtx): projects are guaranteed 5 cards"]),
    Case("sum-queue-child-over", lambda: queue("extra", "inference", gpu=(1, 4)),
         {(E, "kai-guarantee-sum")},
         says=["inference: child queues are guaranteed 5 cards in total but the parent queue has 4 cards"]),
    Case("sum-queue-child-grows", _bx("Queue", "batch", set_gpu(-1, 2, key="quota")),
         {(E, "kai-guarantee-sum")}, "UPDATE", old=_b("Queue", "batch")),
    Case("sum-queue-krm-owned-skipped", lambda: queue("extra", "inference", gpu=(9, 9), owner="x"), set(),
         cluster=lambda: [*base(), project("x", "")]),
    # an ownerReference is a claim: a Queue naming an owner that does not exist, or another
    # object under that name (a different uid), is judged like any other
    Case("sum-queue-forged-owner-judged", lambda: queue("extra", "inference", gpu=(9, 9), owner="nobody"),
         {(E, "kai-guarantee-sum"), (W, "kai-tree-warnings")}),
    Case("sum-queue-owner-uid-differs-judged",
         lambda: queue("extra", "inference", gpu=(9, 9), owner="x"),
         {(E, "kai-guarantee-sum"), (W, "kai-tree-warnings")},
         cluster=lambda: [*base(), {**project("x", ""), "metadata": {"name": "x", "uid": "not-u"}}]),
    Case("sum-queue-owner-uid-matches-skipped",
         lambda: queue("extra", "inference", gpu=(9, 9), owner="x"), set(),
         cluster=lambda: [*base(), {**project("x", ""), "metadata": {"name": "x", "uid": "u"}}]),
    # kai-structure: a parentQueue chain that loops (KAI walks it without a cycle check)
    Case("structure-queue-loop-create", lambda: queue("a", "b"), {(E, "kai-structure")},
         cluster=lambda: [*base(), queue("b", "a")],
         says=["queue a: parentQueue b closes a loop (a -> b -> a); KAI Scheduler walks parentQueue"]),
    Case("structure-queue-loop-update", _bx("Queue", "inference", lambda s: s.update(parentQueue="online")),
         {(E, "kai-structure"), (E, "kai-guarantee-sum"), (W, "kai-tree-warnings")}, "UPDATE",
         old=_b("Queue", "inference"),
         says=["queue inference: parentQueue online closes a loop (inference -> online -> inference)"]),
    Case("structure-queue-loop-above", lambda: queue("z", "x"), {(W, "kai-structure")},
         cluster=lambda: [*base(), queue("x", "y"), queue("y", "x")],
         says=["queue z: its parent queues loop (x -> y -> x)"]),
    Case("structure-queue-loop-kept", lambda: queue("x", "y", priority=5), {(W, "kai-structure")}, "UPDATE",
         old=lambda: queue("x", "y"), cluster=lambda: [*base(), queue("x", "y"), queue("y", "x")],
         says=["queue x: it is in a loop of parent queues (x -> y -> x)"]),
    # kai-shrink (rule 8): a parent's UPDATE
    Case("shrink-department-below-projects", _bx("Department", "platform", set_gpu(0, 3)),
         {(E, "kai-shrink")}, "UPDATE", old=_b("Department", "platform"),
         says=["platform-rtx (pool rtx): projects already hold 4 cards of guarantees but the department "
               "would have 3 cards - 1 card cannot be met", "(workspace 3 cards, benchmark 1 card)"]),
    Case("shrink-department-still-fits", _bx("Department", "platform", set_gpu(0, 4, 6)), set(), "UPDATE",
         old=_b("Department", "platform")),
    Case("shrink-department-grows-while-over", _bx("Department", "platform", set_gpu(0, 3.5)), set(),
         "UPDATE", old=_bx("Department", "platform", set_gpu(0, 3))),
    Case("shrink-department-drops-queue", lambda: department("platform"),
         {(E, "kai-shrink")}, "UPDATE", old=_b("Department", "platform"),
         says=["projects benchmark, workspace still have queues on pool rtx"]),
    Case("shrink-not-on-create", lambda: department("platform", entry("platform-rtx", gpu=(1, 8))),
         set(), cluster=lambda: [o for o in base() if o["metadata"]["name"] != "platform"]),
    Case("shrink-queue-below-children", _bx("Queue", "inference", set_gpu(-1, 2, key="quota")),
         # the queue has no status: its usage is not evaluated (tests/rules/test_quotas_usage.py)
         {(E, "kai-shrink"), (W, "kai-usage-guarantee")}, "UPDATE", old=_b("Queue", "inference"),
         says=["inference: child queues already hold 4 cards of quota but the queue would have 2 cards"]),
    # kai-pool-capacity (rule 3)
    Case("capacity-department-create-over", lambda: department("vision", entry("vision-rtx", gpu=(1, 8))),
         {(E, "kai-pool-capacity")},
         says=["vision-rtx (pool rtx): departments are guaranteed 9 cards in total (this one 1 card) but "
               "the pool's 2 nodes have 8 cards - 1 card cannot be met"]),
    Case("capacity-department-grows", _bx("Department", "research", set_gpu(0, 4.5)),
         {(E, "kai-pool-capacity")}, "UPDATE", old=_b("Department", "research")),
    Case("capacity-department-shrinks-while-over", _bx("Department", "research", set_gpu(0, 5)), set(),
         "UPDATE", old=_bx("Department", "research", set_gpu(0, 6))),
    Case("capacity-counts-capacity-and-label",
         lambda: department("vision", entry("vision-rtx", gpu=(8, 8))), set(),
         cluster=lambda: [*base()[:5], node("rtx-3", 4, pool="rtx", source="capacity"),
                          node("rtx-4", 4, pool="rtx", source="label")]),
    Case("capacity-pool-without-nodes", lambda: department("d", entry("d-a100", "a100", gpu=(2, 8))),
         {(W, "kai-pool-capacity")}, cluster=lambda: [*base(), nodepool("a100")],
         says=["the pool has no GPU nodes in view"]),
    Case("capacity-default-pool", lambda: department("d", entry("d-default", "default", gpu=(9, -1))),
         {(E, "kai-pool-capacity")}, cluster=lambda: [*base(), node("cpu-1", 0), node("gpu-1", 8)],
         says=["departments are guaranteed 9 cards in total (this one 9 cards) but the pool's 2 nodes "
               "have 8 cards"]),
    Case("capacity-new-pool-takes-default-nodes", lambda: nodepool("a100"),
         {(E, "kai-pool-capacity")},
         cluster=lambda: [*base(), node("a-1", 8, pool="a100"), node("g-1", 8),
                          department("d", entry("d-default", "default", gpu=(12, -1)))],
         says=["node pool a100 takes 1 node (8 cards) out of pool default, where departments are "
               "guaranteed 12 cards but 8 cards would remain - 4 cards cannot be met"]),
    # kai-queue-name-unique (rule 5)
    Case("names-project-vs-project", lambda: project("p", "", entry("workspace-rtx", "default")),
         {(E, "kai-queue-name-unique")},
         says=["queue name workspace-rtx is already used by project workspace"]),
    Case("names-project-vs-department", lambda: project("p", "", entry("research-rtx", "default")),
         {(E, "kai-queue-name-unique")}, says=["already used by department research"]),
    Case("names-twice-in-one-object", lambda: department("d", entry("q", "default"), entry("q", "rtx")),
         {(E, "kai-queue-name-unique")}, says=["is used twice in this Department"]),
    Case("names-derived-name", lambda: project("workspace-rtx", "", entry("", "default")),
         {(E, "kai-queue-name-unique")},
         says=["queue name workspace-rtx is already used by project workspace"]),
    Case("names-unmanaged-kai-queue", lambda: project("p", "", entry("online", "default")),
         {(E, "kai-queue-name-unique")}, says=["already used by a KAI Queue that KRM does not manage"]),
    Case("names-own-generated-queue", lambda: project("p", "", entry("p-q", "default")), set(),
         cluster=lambda: [*base(), queue("p-q", owner="p")]),
    Case("names-update-keeps-clash",
         lambda: project("p", "", entry("workspace-rtx", "default"), namespace="x"),
         set(), "UPDATE", old=lambda: project("p", "", entry("workspace-rtx", "default"))),
    Case("names-kai-queue-create", lambda: queue("workspace-rtx"), {(E, "kai-queue-name-unique")},
         says=["queue name workspace-rtx is already used by project workspace"]),
    # kai-namespace-unique (rule 6)
    Case("namespace-explicit-clash",
         lambda: project("p", "", entry("q", "default"), namespace="kai-workspace"),
         {(E, "kai-namespace-unique")},
         says=["namespace kai-workspace is already claimed by project workspace"]),
    Case("namespace-implicit-clash", lambda: project("b", "", entry("q", "default")),
         {(E, "kai-namespace-unique")},
         cluster=lambda: [project("a", "", entry("a", "default"), namespace="kai-b")],
         says=["namespace kai-b (the default for a project named b) is already claimed by project a"]),
    Case("namespace-update-unchanged", lambda: project("p", "", entry("q2", "default"), namespace="shared"),
         set(), "UPDATE", old=lambda: project("p", "", entry("q", "default"), namespace="shared"),
         cluster=lambda: [project("o", "", entry("o", "default"), namespace="shared")]),
    # kai-tree-warnings (rule 7): warn by default
    Case("tree-project-on-pool-without-department-queue",
         lambda: project("p", "platform", entry("p-default", "default")),
         {(W, "kai-tree-warnings")}, says=["department platform has no queue on this pool"]),
    Case("tree-child-limit-above-department", lambda: project("p", "platform", entry("p-rtx", gpu=(0, 12))),
         {(W, "kai-tree-warnings")}, says=["p-rtx (pool rtx): gpu limit 12 cards is above department queue "
                                           "platform-rtx's 8 cards; the lower limit wins"]),
    Case("tree-department-limit-above-pool", _bx("Department", "research", set_gpu(0, None, 10)),
         {(W, "kai-tree-warnings")}, "UPDATE", old=_b("Department", "research"),
         says=["research-rtx (pool rtx): gpu limit 10 cards is above the pool's 8 cards"]),
    Case("tree-department-limit-below-children", _bx("Department", "platform", set_gpu(0, None, 4)),
         set(), "UPDATE", old=_b("Department", "platform")),
    Case("tree-department-limit-under-children", _bx("Department", "platform", set_gpu(0, None, 3)),
         {(W, "kai-tree-warnings"), (E, "kai-deserved-limit")}, "UPDATE", old=_b("Department", "platform"),
         says=["gpu deserved 4 cards is above its limit 3 cards",
               "the gpu limit of 2 project queues is above the department's 3 cards"]),
    Case("tree-queue-child-limit-above-parent", lambda: queue("extra", "inference", gpu=(0, 10)),
         {(W, "kai-tree-warnings")}, says=["extra: gpu limit 10 cards is above parent queue inference's"]),
    Case("tree-update-keeps-old-warning",
         lambda: project("p", "platform", entry("p-default", "default"), namespace="n"), set(), "UPDATE",
         old=lambda: project("p", "platform", entry("p-default", "default"))),
    # kai-delete-in-use: DELETE, warn by default
    Case("delete-department-with-projects", lambda: None, {(W, "kai-delete-in-use")}, "DELETE",
         old=_b("Department", "platform"),
         says=["department platform is still the parent of 2 projects (benchmark, workspace)"]),
    Case("delete-department-empty", lambda: None, set(), "DELETE", old=_b("Department", "research")),
    Case("delete-nodepool-in-use", lambda: None, {(W, "kai-delete-in-use")}, "DELETE",
         old=_b("NodePool", "rtx"),
         says=["node pool rtx still has queues of 2 departments and 2 projects"]),
    Case("delete-queue-with-children", lambda: None, {(W, "kai-delete-in-use")}, "DELETE",
         old=_b("Queue", "inference"), says=["queue inference still has 2 child queues (batch, online)"]),
    Case("delete-project", lambda: None, set(), "DELETE", old=_b("Project", "workspace")),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_rules(case: Case) -> None:
    result = judge(case.obj(), case.operation, case.old(), case.cluster())
    assert hits(result) == case.expect, [f.message for f in result.findings]
    text = "\n".join(f.message for f in result.findings)
    for fragment in case.says:
        assert fragment in text, text


def test_every_rule_is_covered_by_the_table() -> None:
    kai = {rid for rid in RULES if rid.startswith("kai-") and not rid.startswith("kai-usage-")}
    assert kai == {rule for case in CASES for _, rule in case.expect} - {"kai-usage-guarantee"}
    # the kai-usage-* rules (KAI Queue status) have their table in tests/rules/test_quotas_usage.py


def test_rule_defaults() -> None:
    warn = {"kai-tree-warnings", "kai-delete-in-use", "kai-usage-limit", "kai-usage-guarantee",
            "kai-usage-children"}
    for rid, rule in RULES.items():
        if rid.startswith("kai-"):
            assert rule.default_mode is (Mode.WARN if rid in warn else Mode.ENFORCE), rid
    assert RULES["kai-delete-in-use"].operations == frozenset({"DELETE"})
    assert RULES["kai-shrink"].operations == frozenset({"UPDATE"})


# --- modes ----------------------------------------------------------------------------

def test_warn_mode_turns_errors_into_short_warnings() -> None:
    obj = project("extra", "platform", entry("extra-rtx", gpu=(1, 4)))
    result = judge(obj, policy=Policy(rules={"kai-guarantee-sum": Mode.WARN}))
    assert hits(result) == {(W, "kai-guarantee-sum")}
    assert result.findings[0].message == ("platform-rtx (pool rtx): projects are guaranteed 5 cards in "
                                          "total but the department has 4 cards - 1 card cannot be met")


def test_enforce_mode_makes_warnings_deny() -> None:
    result = judge(None, "DELETE", named(base(), "Department", "platform"),
                   policy=Policy(rules={"kai-delete-in-use": Mode.ENFORCE}))
    assert hits(result) == {(E, "kai-delete-in-use")}


def test_off_mode() -> None:
    obj = project("extra", "platform", entry("extra-rtx", gpu=(1, 4)))
    assert hits(judge(obj, policy=Policy(rules={"kai-guarantee-sum": Mode.OFF}))) == set()


# --- what is not ours -----------------------------------------------------------------

def test_other_groups_are_not_judged() -> None:
    volcano = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue", "metadata": {"name": "q"},
               "spec": {"weight": "heavy"}}
    openshift = {"apiVersion": "project.openshift.io/v1", "kind": "Project", "metadata": {"name": "p"}}
    assert judge(volcano).findings == [] and judge(openshift).findings == []


def test_other_groups_in_the_view_are_ignored() -> None:
    stranger = {"apiVersion": "project.openshift.io/v1", "kind": "Project", "metadata": {"name": "x"},
                "spec": {"parent": "platform", "queues": [entry("x-rtx", gpu=(9, 9))]}}
    obj = project("extra", "platform", entry("extra-rtx", gpu=(0, 4)))
    assert judge(obj, cluster=[*base(), stranger]).findings == []


def test_schema_never_raises_on_garbage() -> None:
    for spec in (None, 5, "x", [], {"queues": "x"}, {"queues": [5, None]},
                 {"queues": [{"name": 5, "nodepool": ["a"], "resources": {"gpu": "x"}}]},
                 {"queues": [], "parent": {"a": 1}, "defaultNodePools": "rtx"}):
        obj = {"apiVersion": KRM, "kind": "Project", "metadata": {"name": "p"}, "spec": spec}
        result = judge(obj)
        assert all(f.rule == "kai-schema" for f in result.findings)


# --- cost does not grow with the cluster ---------------------------------------------

class CountingView(StaticView):
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        super().__init__(objects)
        self.listed: list[str] = []

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        self.listed.append(kind)
        return super().list(kind, namespace)


@pytest.mark.parametrize("obj", [
    edited(named(base(), "Project", "workspace"), set_gpu(0, 2)),
    edited(named(base(), "Department", "research"), set_gpu(0, 3)),
    edited(named(base(), "Queue", "batch"), set_gpu(-1, 0, key="quota")),
], ids=["project", "department", "queue"])
def test_admission_never_lists_tenants(obj: dict[str, Any]) -> None:
    view = CountingView(base())
    old = named(base(), obj["kind"], obj["metadata"]["name"])
    group, _, version = obj["apiVersion"].rpartition("/")
    subject = Subject(group, version, obj["kind"], "UPDATE", "", obj["metadata"]["name"], obj, old)
    check_object(RULES, subject, view, Policy())
    assert set(view.listed) <= {"NodePool"}, view.listed


def test_default_pool_capacity_follows_node_changes() -> None:
    cluster = [*base(), node("g-1", 8)]
    obj = department("d", entry("d-default", "default", gpu=(10, -1)))
    assert hits(judge(obj, cluster=cluster)) == {(E, "kai-pool-capacity")}
    assert hits(judge(obj, cluster=[*cluster, node("g-2", 8)])) == set()
    assert hits(judge(obj, cluster=[*cluster[:-1], node("g-1", 16)])) == set()


# --- models ---------------------------------------------------------------------------

def test_typed_model_reads_exact_numbers() -> None:
    spec, errors = parse(DepartmentSpec, {"queues": [entry("q", gpu=(0.1, 0.3), cpu=(1500, -1),
                                                           memory=None)]})
    assert errors == () and spec is not None
    gpu = spec.queues[0].amounts("gpu")
    assert str(gpu.guarantee) == "0.1" and str(gpu.limit) == "0.3" and gpu.limit_set
    assert spec.queues[0].amounts("memory").limit_set is False


# --- offline: envelope check over the demo tenancy ------------------------------------

def test_envelope_check_finds_the_one_mistake(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "-f", str(EXAMPLES)]) == 1
    out = capsys.readouterr().out
    assert "81 objects: 3 errors, 0 warnings" in out
    assert out.count("error   kai-pool-capacity") == 3  # and once in the "why and how to fix" line
    assert ("research-h100 (pool h100): departments are guaranteed 104 cards in total (this one "
            "56 cards) but the pool's 12 nodes have 96 cards - 8 cards cannot be met") in out


def test_demo_tenancy_is_what_the_generator_writes() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_tenancy", EXAMPLES.parent / "make_tenancy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_tenancy"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    for name, text in module.demo().items():
        assert (EXAMPLES / name).read_text() == text, name


def test_demo_without_the_mistake_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for source in EXAMPLES.rglob("*.yaml"):
        target = tmp_path / source.relative_to(EXAMPLES)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text().replace("deserved: 56,", "deserved: 48,"))
    assert main(["check", "-f", str(tmp_path)]) == 0
    assert "81 objects: 0 errors, 0 warnings" in capsys.readouterr().out
