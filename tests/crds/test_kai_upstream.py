"""Envelope's -1 (unlimited) arithmetic against the KAI Scheduler's own queue quota
validation, on the cases both judge.

Upstream: kai-scheduler/KAI-Scheduler pull request #2167 ("fix(admission): align
queue quota validation across create and update", merged 2026-09-15),
``pkg/admission/webhook/queuehooks/queue_validator.go`` and ``queue_validator_test.go``
(contexts "ValidateCreate parent-child quota" and "ValidateUpdate children quota
sum"). The validator runs only with the queue controller's
``--enable-quota-validation`` (default false) and only ever *warns*; Envelope's
``kai-guarantee-sum`` refuses. So "agree" here means: the same resources are found
over their parent, for the same reason.

Every case below is one of upstream's test cases, with upstream's expected warnings
transcribed. Each is checked three ways:

1. :func:`kai_warnings` — the two helpers of #2167 (``quotaExceeds``, ``addQuota``)
   and the two functions that use them, ported line for line — must produce
   upstream's expected warnings (so the port is held to upstream's own test);
2. Envelope's arithmetic (:func:`app.crds.kai.total`, :func:`app.crds.kai.exceeds`) must find
   exactly the same (resource, per-child/total) excesses;
3. for the create path, Envelope's rule itself, judging the new child Queue as a
   CREATE, must refuse on exactly the resources upstream warns about.

The KAI Go code itself is not run: no snapshot of KAI-Scheduler after #2167 can be
built here (the mirror stops at 2026-08-07, d5bc503a). The port is 30 lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.crds.kai import UNLIMITED, exact, exceeds, total
from app.rules.base import Subject
from tests.conftest import RULES
from tests.helpers.quotas import department, entry, judge, node, nodepool

KAI = "scheduling.run.ai/v2"
RESOURCES = ("CPU", "GPU", "Memory")
ENVELOPE_NAME = {"CPU": "cpu", "GPU": "gpu", "Memory": "memory"}
PARENT = "parent-queue"

# --- the port of #2167's arithmetic (queue_validator.go) -------------------------------

UNLIMITED_F = -1.0  # constants.UnlimitedResourceQuantity
QUOTA_TOLERANCE = 1e-6  # quotaTolerance


def quota_exceeds(quota: float, parent: float) -> bool:
    """``quotaExceeds``: nothing exceeds an unlimited parent; an unlimited quota
    exceeds any finite parent; otherwise a float compare with a 1e-6 tolerance."""
    if parent == UNLIMITED_F:
        return False
    if quota == UNLIMITED_F:
        return True
    return quota - parent > QUOTA_TOLERANCE


def add_quota(acc: float, quota: float) -> float:
    """``addQuota``: -1 absorbs."""
    if acc == UNLIMITED_F or quota == UNLIMITED_F:
        return UNLIMITED_F
    return acc + quota


Quotas = dict[str, float]
"""Resource ("CPU", "GPU", "Memory") -> quota; absent is Go's zero value."""


def kai_warnings(parent: Quotas, children: dict[str, Quotas], new: str | None) -> set[tuple[str, str]]:
    """(scope, resource) of each warning: scope is a child's name or "total".

    ``new`` given: ``validateParentChildQuota`` (CREATE of ``new``; per-child checks for
    ``new`` only). ``new`` None: ``validateChildrenQuotaSum`` (UPDATE of the parent;
    per-child checks for every child)."""
    found: set[tuple[str, str]] = set()
    for r in RESOURCES:
        cap = parent.get(r, 0.0)
        per_child = [new] if new is not None else list(children)
        for name in per_child:
            if name is not None and quota_exceeds(children[name].get(r, 0.0), cap):
                found.add((name, r))
        acc = 0.0
        for quotas in children.values():
            acc = add_quota(acc, quotas.get(r, 0.0))
        if quota_exceeds(acc, cap):
            found.add(("total", r))
    return found


# --- Envelope's arithmetic on the same numbers ------------------------------------------

def envelope_excesses(parent: Quotas, children: dict[str, Quotas], new: str | None) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for r in RESOURCES:
        cap = exact(parent.get(r, 0))
        per_child = [new] if new is not None else list(children)
        for name in per_child:
            if name is not None and exceeds(exact(children[name].get(r, 0)), cap):
                found.add((name, r))
        if exceeds(total(exact(q.get(r, 0)) for q in children.values()), cap):
            found.add(("total", r))
    return found


# --- upstream's cases ------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    name: str
    """Upstream's ``It(...)`` text."""
    parent: Quotas
    children: dict[str, Quotas]
    """Existing children first; on the create path the last one is the new queue."""
    expected: set[tuple[str, str]]
    """Upstream's expected warnings as (scope, resource)."""
    create: bool = True
    messages: list[str] = field(default_factory=list)
    """Upstream's expected substrings, kept for the record of what was transcribed."""

    @property
    def new(self) -> str | None:
        return list(self.children)[-1] if self.create else None


FULL = {"CPU": 1000, "GPU": 4, "Memory": 8192}
WIDE = {"CPU": 1000, "GPU": 8, "Memory": 8192}
OPEN = {"CPU": -1, "GPU": -1, "Memory": -1}


def q(cpu: float = 0, gpu: float = 0, mem: float = 0) -> Quotas:
    return {r: v for r, v in (("CPU", cpu), ("GPU", gpu), ("Memory", mem)) if v != 0}


CASES = [
    Case("should warn when siblings' combined GPU quota exceeds the parent",
         FULL, {"child-1": q(gpu=3), "child-2": q(gpu=2)}, {("total", "GPU")},
         messages=["total children GPU quota (5.00) exceeds parent queue parent-queue "
                   "GPU quota (4.00)"]),
    Case("should warn when siblings' combined Memory quota exceeds the parent",
         WIDE, {"child-1": q(mem=6000), "child-2": q(mem=4000)}, {("total", "Memory")},
         messages=["total children Memory quota (10000) exceeds parent queue parent-queue "
                   "Memory quota (8192)"]),
    Case("should not warn when siblings' combined quota stays within the parent",
         WIDE, {"child-1": q(200, 3, 2000), "child-2": q(200, 3, 2000)}, set()),
    Case("should not warn when the parent quota is unlimited",
         OPEN, {"child-1": q(500, 8, 4000), "child-2": q(500, 8, 4000)}, set()),
    Case("should treat an unlimited sibling as making the total unlimited",
         FULL, {"child-1": q(gpu=-1), "child-2": q(gpu=1)}, {("total", "GPU")},
         messages=["total children GPU quota (unlimited) exceeds parent queue parent-queue "
                   "GPU quota (4.00)"]),
    Case("should not warn when fractional GPU quotas sum exactly to the parent",
         {"CPU": 1000, "GPU": 0.3, "Memory": 8192}, {"child-1": q(gpu=0.1), "child-2": q(gpu=0.2)},
         set()),
    Case("should warn when an unlimited child is created under a finite parent",
         FULL, {"child-1": q(100, -1, 100)}, {("child-1", "GPU"), ("total", "GPU")},
         messages=["child queue GPU quota (unlimited) exceeds parent queue parent-queue "
                   "GPU quota (4.00)",
                   "total children GPU quota (unlimited) exceeds parent queue parent-queue "
                   "GPU quota (4.00)"]),
    Case("admits an oversubscribing child (warns but does not reject)",
         FULL, {"child-1": q(800, 3, 6000), "child-2": q(800, 3, 6000)},
         {("total", "CPU"), ("total", "GPU"), ("total", "Memory")},
         messages=["total children CPU quota (1600) exceeds parent queue parent-queue CPU quota (1000)",
                   "total children GPU quota (6.00) exceeds parent queue parent-queue GPU quota (4.00)",
                   "total children Memory quota (12000) exceeds parent queue parent-queue "
                   "Memory quota (8192)"]),
    Case("should treat unlimited quotas as unlimited when summing children",
         {"CPU": -1, "GPU": 4, "Memory": -1},
         {"child-1": q(500, -1, 4000), "child-2": q(500, 2, 4000), "child-3": q(500, 1, 4000)},
         {("child-1", "GPU"), ("total", "GPU")}, create=False,
         messages=["child queue child-1 GPU quota (unlimited) exceeds parent GPU quota (4.00)",
                   "total children GPU quota (unlimited) exceeds parent GPU quota (4.00)"]),
    Case("should warn per child for GPU and Memory like it does for CPU",
         FULL, {"child-1": q(2000, 5, 9000)},
         {(s, r) for s in ("child-1", "total") for r in RESOURCES}, create=False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_port_reproduces_upstreams_expected_warnings(case: Case) -> None:
    assert kai_warnings(case.parent, case.children, case.new) == case.expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_envelope_arithmetic_finds_the_same_excesses(case: Case) -> None:
    assert envelope_excesses(case.parent, case.children, case.new) == case.expected


# --- through Envelope's rule: the new child Queue judged as a CREATE ------------------

def kai_queue(name: str, quotas: Quotas, parent: str = "") -> dict[str, Any]:
    resources = {ENVELOPE_NAME[r]: {"quota": q, "limit": -1, "overQuotaWeight": 1} for r, q in quotas.items()}
    for r in RESOURCES:  # a quota left out is Go's zero value; say so explicitly
        resources.setdefault(ENVELOPE_NAME[r], {"quota": 0, "limit": -1, "overQuotaWeight": 1})
    spec: dict[str, Any] = {"resources": resources}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def refused_resources(case: Case) -> set[str]:
    existing = list(case.children)[:-1]
    objects = [kai_queue(PARENT, case.parent)]
    objects += [kai_queue(n, case.children[n], PARENT) for n in existing]
    new = kai_queue(list(case.children)[-1], case.children[list(case.children)[-1]], PARENT)
    subject = Subject("scheduling.run.ai", "v2", "Queue", "CREATE", "", new["metadata"]["name"], new, None)
    result = check_object(RULES, subject, StaticView(objects), Policy())
    assert not result.internal_errors, result.internal_errors
    return {f.path.split(".")[-2] for f in result.findings
            if f.rule == "kai-guarantee-sum" and f.severity == "error"}


@pytest.mark.parametrize("case", [c for c in CASES if c.create], ids=lambda c: c.name)
def test_envelope_refuses_the_create_on_the_resources_kai_warns_about(case: Case) -> None:
    warned = {ENVELOPE_NAME[r] for _scope, r in case.expected}
    assert refused_resources(case) == warned


def test_the_rule_message_reads_unlimited_like_upstreams() -> None:
    case = next(c for c in CASES if c.name.startswith("should treat an unlimited sibling"))
    existing = kai_queue("child-1", case.children["child-1"], PARENT)
    new = kai_queue("child-2", case.children["child-2"], PARENT)
    subject = Subject("scheduling.run.ai", "v2", "Queue", "CREATE", "", "child-2", new, None)
    result = check_object(RULES, subject, StaticView([kai_queue(PARENT, case.parent), existing]), Policy())
    [finding] = [f for f in result.findings if f.rule == "kai-guarantee-sum"]
    assert ("child queues are guaranteed unlimited in total but the parent queue has 4 cards"
            in finding.message)


# --- where the two differ, on purpose ---------------------------------------------------

GRID = [-1, 0, 0.1, 0.2, 0.3, 1, 2.5, 4, 8]


@pytest.mark.parametrize("parent", GRID)
@pytest.mark.parametrize("a", GRID)
@pytest.mark.parametrize("b", GRID)
def test_sum_and_compare_agree_on_every_valid_value(parent: float, a: float, b: float) -> None:
    """-1 and values >= 0 (the only valid ones): the two implementations agree on
    whether two siblings exceed their parent, fractions included."""
    kai = quota_exceeds(add_quota(add_quota(0.0, a), b), parent)
    env = exceeds(total([exact(a), exact(b)]), exact(parent))
    assert kai == env


def test_difference_sub_micro_excess() -> None:
    """KAI compares floats with a 1e-6 tolerance; Envelope compares the decimals as
    written. 0.3000001 cards under 0.3: KAI is silent, Envelope finds 0.0000001 too many."""
    assert not quota_exceeds(0.3000001, 0.3)
    assert exceeds(exact(0.3000001), exact(0.3))
    assert total([exact(0.3000001)]) - exact(0.3) == Decimal("1E-7")


def test_difference_invalid_negative() -> None:
    """-2 is neither unlimited nor a quota. KAI sums it as a number (so it can hide a
    sibling's excess); Envelope counts it as 0 in sums and rule kai-values refuses it."""
    kai_total = add_quota(add_quota(0.0, -2), 5)
    assert not quota_exceeds(kai_total, 4)  # 3 <= 4: the -2 hid one card of excess
    assert exceeds(total([exact(-2), exact(5)]), exact(4))
    assert total([exact(-2), UNLIMITED]) == UNLIMITED


def test_difference_already_over_parent_and_unrelated_write() -> None:
    """KAI's create path re-checks every resource; Envelope refuses only a write that
    adds to an excess. Siblings already over on CPU, a new child with GPU only: KAI
    warns on CPU, Envelope lets the write through (refusing it would not fix the CPU)."""
    case = Case("already over", FULL, {"child-1": q(cpu=1500), "child-2": q(gpu=1)}, {("total", "CPU")})
    assert kai_warnings(case.parent, case.children, case.new) == {("total", "CPU")}
    assert envelope_excesses(case.parent, case.children, case.new) == {("total", "CPU")}
    assert refused_resources(case) == set()


# --- KAI Resource Management v0.1.1: new fields that do not change the arithmetic --------
# kai-scheduler/kai-resource-management-api CHANGELOG.md ([v0.1.1] - 2026-08-24: KRMConfig)
# and kai/v1alpha1/nodepool_types.go (phase MissingPrerequisites, node status
# MissingNrtHealthyPrerequisite, kai/gpu-network-acceleration-* annotations).

NETWORK_ANNOTATIONS = {
    "kai/gpu-network-acceleration-detection": "Auto",
    "kai/gpu-network-acceleration-label-key": "nvidia.com/gpu.clique",
    "kai/gpu-network-acceleration-detected": "true",
}


def _krm_nodepool_v011(name: str) -> dict[str, Any]:
    pool = nodepool(name)
    pool["metadata"]["annotations"] = dict(NETWORK_ANNOTATIONS)
    pool["status"] = {"phase": "MissingPrerequisites",
                      "message": "1 node lacks healthy NodeResourceTopology data",
                      "nodes": [{"name": f"{name}-1", "status": "MissingNrtHealthyPrerequisite"},
                                {"name": f"{name}-2", "status": "Ready"}],
                      "conditions": [{"type": "MissingNrtHealthyPrerequisite", "status": "True",
                                      "reason": "MissingNrtHealthyPrerequisiteReason"}]}
    return pool


def _findings(obj: dict[str, Any], cluster: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {(f.severity, f.rule, f.message) for f in judge(obj, cluster=cluster).findings}


@pytest.mark.parametrize("deserved", [8, 9])
def test_nodepool_phase_and_annotations_leave_pool_capacity_alone(deserved: int) -> None:
    """A MissingPrerequisites pool still owns its nodes' cards: KRM's phase says some
    nodes miss a prerequisite of an enabled scheduling capability (NUMA-aware
    placement), not that they left the pool. Same findings with and without."""
    nodes = [node("rtx-1", 4, pool="rtx"), node("rtx-2", 4, pool="rtx")]
    dept = department("platform", entry("platform-rtx", gpu=(deserved, -1)))
    plain = _findings(dept, [nodepool("rtx"), *nodes])
    v011 = _findings(dept, [_krm_nodepool_v011("rtx"), *nodes])
    assert plain == v011
    assert any(rule == "kai-pool-capacity" for _s, rule, _m in plain) == (deserved > 8)


def test_nodepool_v011_fields_are_not_judged() -> None:
    result = judge(_krm_nodepool_v011("a100"), cluster=[])
    assert [f for f in result.findings if f.severity == "error"] == []
    assert not any("annotation" in f.message or "phase" in f.message for f in result.findings)


def test_krmconfig_is_not_a_kind_envelope_judges() -> None:
    """KRMConfig configures the KRM installation (images, resources, feature flags);
    it holds no quota, so no rule reads it and it never fails a check."""
    config = {"apiVersion": "kai.resources/v1alpha1", "kind": "KRMConfig",
              "metadata": {"name": "krm-config"},
              "spec": {"global": {"affinity": {}}}}
    assert judge(config, cluster=[]).findings == []
