"""Quota changes against KAI Queue status (app/rules/quotas/usage.py), through the engine."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from app.cluster.live import RESOURCES as LIVE_RESOURCES
from app.cluster.snapshot import merge
from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.core.engine import Evaluation, check_object
from app.crds.kai import status_resource
from app.rules.base import Subject
from app.rules.quotas.usage import read_usage
from tests.conftest import RULES

KRM = "kai.resources/v1alpha1"
KAI = "scheduling.run.ai/v2"
USAGE_RULES = {"kai-usage-limit", "kai-usage-guarantee", "kai-usage-children"}


def entry(name: str, gpu: tuple[float, float] = (0, -1), pool: str = "rtx",
          cpu: tuple[float, float] = (0, -1), memory: tuple[float, float] = (0, -1)) -> dict[str, Any]:
    return {"name": name, "nodepool": pool, "resources": {
        r: {"deserved": d, "limit": lim, "overQuotaWeight": 1}
        for r, (d, lim) in (("gpu", gpu), ("cpu", cpu), ("memory", memory))}}


def department(name: str, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "Department", "metadata": {"name": name},
            "spec": {"queues": list(entries)}}


def project(name: str, parent: str, *entries: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "Project", "metadata": {"name": name},
            "spec": {"parent": parent, "queues": list(entries)}}


def kai_queue(name: str, parent: str = "", gpu: tuple[float, float] = (0, -1),
              status: dict[str, Any] | None = None, owner: str = "") -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": name},
                           "spec": {"resources": {"gpu": {"quota": gpu[0], "limit": gpu[1],
                                                          "overQuotaWeight": 1}}}}
    if parent:
        obj["spec"]["parentQueue"] = parent
    if owner:
        obj["metadata"]["ownerReferences"] = [
            {"apiVersion": KRM, "kind": owner.split("/")[0], "name": owner.split("/")[1], "uid": "u"}]
    if status is not None:
        obj["status"] = status
    return obj


def used(gpu: str | None = None, cpu: str | None = None, memory: str | None = None,
         nonpreemptible: dict[str, str] | None = None) -> dict[str, Any]:
    allocated = {k: v for k, v in (("nvidia.com/gpu", gpu), ("cpu", cpu), ("memory", memory)) if v}
    out: dict[str, Any] = {"allocated": allocated, "requested": dict(allocated)}
    if nonpreemptible is not None:
        out["allocatedNonPreemptible"] = nonpreemptible
    return out


def judge(obj: dict[str, Any], old: dict[str, Any] | None, cluster: list[dict[str, Any]],
          policy: Policy | None = None) -> Evaluation:
    view = StaticView([*cluster, *([old] if old else [])])
    group, _, version = obj["apiVersion"].rpartition("/")
    subject = Subject(group, version, obj["kind"], "UPDATE" if old else "CREATE", "",
                      obj["metadata"]["name"], obj, old)
    result = check_object(RULES, subject, view, policy or Policy())
    assert not result.internal_errors, result.internal_errors
    for warning in result.warnings:
        assert len(warning.message) < 120, warning.message
    return result


def usage(result: Evaluation) -> list[tuple[str, str, str]]:
    return [(f.severity, f.rule, f.message) for f in result.findings if f.rule in USAGE_RULES]


def platform(gpu: tuple[float, float] = (4, 8)) -> dict[str, Any]:
    return department("platform", entry("platform-rtx", gpu))


def tenancy(department_status: dict[str, Any] | None = None,
            workspace: dict[str, Any] | None = None,
            benchmark: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Department platform (queue platform-rtx) with projects workspace and benchmark, and
    the KAI Queues KRM generates for them, with the given statuses."""
    return [
        {"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": "rtx"},
         "spec": {"labelKey": "pool", "labelValue": "rtx"}},
        project("workspace", "platform", entry("workspace-rtx", (3, 8))),
        project("benchmark", "platform", entry("benchmark-rtx", (1, 8))),
        kai_queue("platform-rtx", gpu=(4, 8), status=department_status, owner="Department/platform"),
        kai_queue("workspace-rtx", "platform-rtx", (3, 8), workspace, owner="Project/workspace"),
        kai_queue("benchmark-rtx", "platform-rtx", (1, 8), benchmark, owner="Project/benchmark"),
    ]


# --- kai-usage-limit ------------------------------------------------------------------

def test_department_limit_cut_below_allocated_warns_with_the_numbers() -> None:
    result = judge(platform((4, 5)), platform((4, 8)), tenancy(used(gpu="7")))
    [(severity, rule, message)] = usage(result)
    assert (severity, rule) == ("warning", "kai-usage-limit")
    assert message == ("platform-rtx: gpu limit 5 cards < 7 cards allocated; nothing "
                       "evicted, applies as jobs finish")
    assert not [f for f in result.errors if f.rule in USAGE_RULES]


def test_enforce_mode_gives_the_full_text() -> None:
    result = judge(platform((4, 5)), platform((4, 8)), tenancy(used(gpu="7")),
                   Policy(rules={"kai-usage-limit": Mode.ENFORCE}))
    assert [f.rule for f in result.errors] == ["kai-usage-limit"]
    [(_, _, message)] = usage(result)
    assert "(was 8 cards)" in message and "status.allocated of queue platform-rtx" in message
    assert "2 cards over" in message and "Nothing is evicted" in message


def test_a_cut_that_still_fits_says_nothing() -> None:
    assert usage(judge(platform((4, 7)), platform((4, 8)), tenancy(used(gpu="7")))) == []


def test_a_missing_status_is_not_evaluated_never_zero() -> None:
    """An unreconciled queue and an idle one both lack status.allocated (KAI's omitempty):
    a cut to 0 is not "fits", it is "not evaluated"."""
    result = judge(platform((0, 0)), platform((4, 8)), tenancy(None))
    messages = [m for _, r, m in usage(result) if r == "kai-usage-limit"]
    assert messages == ["platform-rtx: gpu limit cut to 0 cards (was 8 cards), usage not "
                        "evaluated: no status.allocated from KAI"]


def test_a_queue_not_in_the_view_holds_nothing() -> None:
    """KRM has not created the queue: KAI runs nothing in a queue that does not exist."""
    assert usage(judge(platform((4, 5)), platform((4, 8)), tenancy()[:3])) == []


def test_an_unchanged_limit_already_below_usage_is_not_repeated_on_update() -> None:
    before = department("platform", entry("platform-rtx", (4, 5), cpu=(0, -1)))
    after = department("platform", entry("platform-rtx", (4, 5), cpu=(0, 9000)))
    assert usage(judge(after, before, tenancy(used(gpu="7")))) == []
    # envelope check and an audit judge as CREATE: everything under the usage is said
    created = judge(after, None, tenancy(used(gpu="7")))
    assert [r for _, r, _ in usage(created)] == ["kai-usage-limit"]


def test_create_without_status_says_nothing() -> None:
    assert usage(judge(platform((4, 5)), None, tenancy(None))) == []


def test_units_cpu_cores_and_memory_bytes() -> None:
    old = department("platform", entry("platform-rtx", (4, 8), cpu=(0, 4000), memory=(0, 8000)))
    new = department("platform", entry("platform-rtx", (4, 8), cpu=(0, 1000), memory=(0, 2000)))
    result = judge(new, old, tenancy(used(cpu="1500m", memory="2Gi")))
    messages = sorted(m for _, _, m in usage(result))
    assert messages == [
        "platform-rtx: cpu limit 1000 mCPU < 1500 mCPU allocated; nothing evicted, applies "
        "as jobs finish",
        "platform-rtx: memory limit 2000 MB < 2147.483648 MB allocated; nothing "
        "evicted, applies as jobs finish"]


def test_unreadable_quantity_is_not_evaluated_and_never_an_error() -> None:
    status = {"allocated": {"nvidia.com/gpu": "lots", "cpu": {"x": 1}, "memory": None}}
    assert read_usage(status, "allocated") == {}
    result = judge(platform((4, 5)), platform((4, 8)), tenancy(status))
    assert [r for _, r, _ in usage(result)] == []
    assert read_usage({"allocated": ["x"]}, "allocated") is None
    assert read_usage("status", "allocated") is None


def test_kai_queue_limit_cut_reads_its_own_status() -> None:
    """On a spec UPDATE the API server keeps the stored status: the old object's is current."""
    old = kai_queue("inference", gpu=(4, 8), status=used(gpu="6"))
    new = kai_queue("inference", gpu=(4, 2), status=used(gpu="6"))
    [(_, rule, message)] = usage(judge(new, old, []))
    assert rule == "kai-usage-limit"
    assert message.startswith("inference: gpu limit 2 cards < 6 cards allocated; nothing evicted")


def test_krm_generated_queues_are_not_judged() -> None:
    old = kai_queue("workspace-rtx", gpu=(3, 8), status=used(gpu="6"), owner="Project/workspace")
    new = kai_queue("workspace-rtx", gpu=(3, 1), status=used(gpu="6"), owner="Project/workspace")
    owner = project("workspace", "platform", entry("workspace-rtx", (3, 8)))
    assert usage(judge(new, old, [platform(), owner])) == []
    # The ownerReference is a claim: with no such Project the Queue is judged like any other.
    assert [rule for _, rule, _ in usage(judge(new, old, []))] == ["kai-usage-limit"]


@pytest.mark.parametrize(("key", "resource"), [
    ("nvidia.com/gpu", "gpu"), ("amd.com/gpu", "gpu"),
    ("gpu.nvidia.com", "gpu"), ("GPU.example.com", "gpu"), ("gpu", "gpu"),  # DRA classes
    ("mig.nvidia.com", None), ("nvidia.com/gpu.memory", None), ("run.ai/gpu.memory", None),
    ("nvidia.com/mig-1g.5gb", None), ("ephemeral-storage", None), ("pods", None),
    ("hugepages-2Mi", None), ("cpu", "cpu"), ("memory", "memory")])
def test_status_keys_are_read_as_kai_counts_them(key: str, resource: str | None) -> None:
    """KAI keys a DRA GPU by its DeviceClass name when the name holds ``gpu``
    (KAI-Scheduler pkg/common/resources/dra.go, IsGPUDeviceClass)."""
    assert status_resource(key) == resource


def test_dra_gpus_keyed_by_device_class_count_against_the_limit() -> None:
    """Issue 37 class 4: six DRA GPUs in use, written under the DeviceClass name; a limit
    cut to 4 warns; with device-plugin cards beside them, the two add up."""
    status = {"allocated": {"gpu.nvidia.com": "6", "cpu": "2"},
              "requested": {"gpu.nvidia.com": "6", "cpu": "2"}}
    old = kai_queue("inference", gpu=(4, 8), status=status)
    new = kai_queue("inference", gpu=(4, 4), status=status)
    [(_, rule, message)] = usage(judge(new, old, []))
    assert rule == "kai-usage-limit"
    assert message.startswith("inference: gpu limit 4 cards < 6 cards allocated;"), message
    both = {"allocated": {"gpu.nvidia.com": "6", "nvidia.com/gpu": "1500m"}}
    assert read_usage(both, "allocated") == {"gpu": Decimal("7.5"), "cpu": 0, "memory": 0}
    # a DeviceClass KAI does not count as a GPU is no card
    assert read_usage({"allocated": {"mig.nvidia.com": "6"}}, "allocated") == \
        {"gpu": 0, "cpu": 0, "memory": 0}
    assert usage(judge(kai_queue("inference", gpu=(4, 7.5), status=both),
                       kai_queue("inference", gpu=(4, 8), status=both), [])) == []


# --- kai-usage-guarantee --------------------------------------------------------------

def test_project_guarantee_cut_below_non_preemptible() -> None:
    old = project("workspace", "platform", entry("workspace-rtx", (3, 8)))
    new = project("workspace", "platform", entry("workspace-rtx", (1, 8)))
    status = used(gpu="3", nonpreemptible={"nvidia.com/gpu": "2500m"})
    result = judge(new, old, [platform(), *tenancy(workspace=status)])
    assert usage(result) == [(
        "warning", "kai-usage-guarantee",
        "workspace-rtx: gpu deserved 1 card < 2.5 cards non-preemptible; nothing "
        "evicted, applies as jobs finish")]


# --- kai-usage-children ---------------------------------------------------------------

def test_department_cut_below_what_projects_hold_when_its_own_status_lags() -> None:
    cluster = tenancy(None, used(gpu="5"), used(gpu="2"))
    result = judge(platform((4, 6)), platform((4, 8)), cluster,
                   Policy(rules={"kai-usage-children": Mode.ENFORCE}))
    [(_, _, message)] = [u for u in usage(result) if u[1] == "kai-usage-children"]
    assert message == ("platform-rtx (pool rtx): gpu limit 6 cards is below the 7 cards its projects "
                       "have allocated now (workspace-rtx 5 cards, benchmark-rtx 2 cards) - 1 card "
                       "over. Nothing is evicted; the new limit applies as workloads finish")


def test_children_not_repeated_when_the_parent_status_says_it() -> None:
    cluster = tenancy(used(gpu="7"), used(gpu="5"), used(gpu="2"))
    rules = [r for _, r, _ in usage(judge(platform((4, 6)), platform((4, 8)), cluster))]
    assert rules == ["kai-usage-limit"]


def test_a_child_without_status_makes_the_sum_a_lower_bound() -> None:
    cluster = tenancy(None, used(gpu="7"), None)
    result = judge(platform((4, 6)), platform((4, 8)), cluster,
                   Policy(rules={"kai-usage-children": Mode.ENFORCE}))
    [message] = [m for _, r, m in usage(result) if r == "kai-usage-children"]
    assert "1 child not evaluated (no status: benchmark-rtx), so they hold at least this" in message
    # the known children fit: no claim either way
    assert [r for _, r, _ in usage(judge(platform((4, 7.5)), platform((4, 8)), cluster))
            if r == "kai-usage-children"] == []


def test_parent_queue_cut_below_children() -> None:
    children = [kai_queue("a", "inference", (1, 4), used(gpu="3")),
                kai_queue("b", "inference", (1, 4), used(gpu="2"))]
    old = kai_queue("inference", gpu=(2, 8))
    new = kai_queue("inference", gpu=(2, 4))
    found = usage(judge(new, old, children))
    # its own status is absent: its children's statuses judge it (no "not evaluated")
    [(_, rule, message)] = found
    assert rule == "kai-usage-children"
    assert message == ("inference: gpu limit 4 cards < 5 cards held by child queues; nothing "
                       "evicted, applies as jobs finish")


def test_guarantee_of_parent_below_children_non_preemptible() -> None:
    children = [kai_queue("a", "inference", (1, 4), used(nonpreemptible={"nvidia.com/gpu": "2"})),
                kai_queue("b", "inference", (1, 4), used(nonpreemptible={"nvidia.com/gpu": "2"}))]
    found = usage(judge(kai_queue("inference", gpu=(3, 8)), kai_queue("inference", gpu=(4, 8)),
                        children))
    [message] = [m for _, r, m in found if r == "kai-usage-children"]
    assert "gpu quota 3 cards < 4 cards held non-preemptible by child queues" in message


# --- exact decimals -------------------------------------------------------------------

@pytest.mark.parametrize(("limit", "warned"), [(0.3, False), (0.29, True)])
def test_point_one_plus_point_two_is_point_three(limit: float, warned: bool) -> None:
    children = [kai_queue("a", "inference", (0, 1), used(gpu="0.1")),
                kai_queue("b", "inference", (0, 1), used(gpu="0.2"))]
    found = usage(judge(kai_queue("inference", gpu=(0, limit)), kai_queue("inference", gpu=(0, 1)),
                        children))
    assert [r for _, r, _ in found if r != "kai-usage-limit"] == (["kai-usage-children"] if warned else [])
    own = usage(judge(kai_queue("inference", gpu=(0, limit), status=used(gpu="300m")),
                      kai_queue("inference", gpu=(0, 1), status=used(gpu="300m")), []))
    assert bool(own) is warned
    assert sum((Decimal("0.1"), Decimal("0.2"))) == read_usage(used(gpu="0.3"), "allocated")["gpu"]  # type: ignore[index]


# --- where the status comes from ------------------------------------------------------

def test_live_view_keeps_the_queue_usage() -> None:
    [resource] = [r for r in LIVE_RESOURCES if r.kind == "Queue"]
    obj = kai_queue("q", status={**used(gpu="2"), "childQueues": ["x"], "conditions": []})
    obj["metadata"]["managedFields"] = [{"manager": "x"}]
    trimmed = resource.trim(copy.deepcopy(obj))
    assert trimmed is not None
    assert trimmed["status"] == {"allocated": {"nvidia.com/gpu": "2"},
                                 "requested": {"nvidia.com/gpu": "2"}}
    assert "managedFields" not in trimmed["metadata"]


def test_check_kubeconfig_keeps_the_cluster_status_under_a_file() -> None:
    cluster = [kai_queue("q", gpu=(1, 8), status=used(gpu="6"))]
    file = kai_queue("q", gpu=(1, 2))
    [merged] = merge(cluster, [file])
    assert merged["spec"] == file["spec"] and merged["status"] == used(gpu="6")
    assert "status" not in file  # the file's own object is not changed
    mine = kai_queue("q", gpu=(1, 2), status=used(gpu="1"))
    assert merge(cluster, [mine])[0]["status"] == used(gpu="1")


def test_check_kubeconfig_file_queue_is_judged_on_cluster_usage() -> None:
    cluster = [kai_queue("q", gpu=(1, 8), status=used(gpu="6"))]
    file = kai_queue("q", gpu=(1, 2))
    view = StaticView(merge(cluster, [file]))
    subject = Subject("scheduling.run.ai", "v2", "Queue", "CREATE", "", "q", file, None)
    result = check_object(RULES, subject, view, Policy())
    assert [f.rule for f in result.findings if f.rule in USAGE_RULES] == ["kai-usage-limit"]


def test_a_list_beside_another_is_empty_not_unknown() -> None:
    """KAI rewrites the three lists together and omits empty ones: a busy queue of
    preemptible jobs only has allocated and requested, no allocatedNonPreemptible."""
    status = {"allocated": {"nvidia.com/gpu": "3"}}
    assert read_usage(status, "allocatedNonPreemptible") == {"gpu": 0, "cpu": 0, "memory": 0}
    assert read_usage({}, "allocatedNonPreemptible") is None
    old = kai_queue("q", gpu=(4, 8), status=status)
    new = kai_queue("q", gpu=(1, 8), status=status)
    assert usage(judge(new, old, [])) == []


@pytest.mark.parametrize("quantity", ["1e2000000000", "9" * 3000 + ".5", "1E-2000000000", "-5",
                                      "+.", 1e308, 2**70])
def test_extreme_quantities_never_crash_and_stay_exact(quantity: Any) -> None:
    status = {"allocated": {"cpu": quantity, "memory": quantity, "nvidia.com/gpu": quantity}}
    result = judge(platform((4, 5)), platform((4, 8)), tenancy(status))
    assert not result.internal_errors  # judge() asserts it too
    if quantity == "1E-2000000000":  # below one nano: the API server's 1n
        assert read_usage(status, "allocated") == {"gpu": Decimal("1E-9"),
                                                   "cpu": Decimal("1E-6"),
                                                   "memory": Decimal("1E-15")}
    exact_ = read_usage({"allocated": {"cpu": "123456789012345678901234567890.123m"}}, "allocated")
    assert exact_ is not None and exact_["cpu"] == Decimal("123456789012345678901234567890.123")


def test_a_huge_quantity_is_shown_briefly() -> None:
    status = {"allocated": {"nvidia.com/gpu": "1e2000000000"}}
    [(_, _, message)] = usage(judge(platform((4, 5)), platform((4, 8)), tenancy(status)))
    assert message == ("platform-rtx: gpu limit 5 cards < 1.000000E+2000000000 cards allocated; "
                       "nothing evicted, applies as jobs finish")
