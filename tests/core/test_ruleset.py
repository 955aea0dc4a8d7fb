"""The rule set's wiring: declarations, reads, stale views, no import cycles."""

from __future__ import annotations

import ast
import copy
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.cluster.live import RESOURCES, resources_for
from app.cluster.view import ScopedView, StaticView, UndeclaredRead
from app.core.config import Mode, Policy
from app.core.engine import InternalError, evaluate
from app.core.ruleset import RuleSet
from app.rules.base import Rule, Subject
from app.serve.admission import decide
from tests.conftest import RULES, container, workload
from tests.helpers.actors import pool, template
from tests.helpers.quotas import base

APP = Path(__file__).resolve().parents[2] / "app"


# --- no import cycle in app/ ------------------------------------------------------------

def _module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def import_graph() -> dict[str, set[str]]:
    """Every app module and the app modules it imports — at module level or inside a
    function (a late import hides a cycle, it does not remove it); imports only for
    type checkers are left out."""
    modules = {_module_name(p): p for p in APP.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if _type_checking_only(node, parents):
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("app"):
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_app_has_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# --- declarations -------------------------------------------------------------------------

def test_every_rule_is_declared_once_with_what_the_engine_needs() -> None:
    assert len(RULES) == 38
    for rule_id, rule in RULES.items():
        assert rule.id == rule_id and rule.summary and rule.kinds
        assert rule.fn.rule is rule  # type: ignore[attr-defined]
        assert rule.operations <= {"CREATE", "UPDATE", "DELETE"}
        assert rule.holds_back <= set(RULES), rule.holds_back


def test_a_rule_id_declared_twice_is_refused() -> None:
    rule = RULES["cpu-limits"]
    with pytest.raises(ValueError, match="declared twice"):
        RuleSet([rule, replace(rule, summary="again")])


def test_the_watch_list_is_what_the_rules_read() -> None:
    watched = {r.kind for r in resources_for(RULES.reads)}
    assert watched == set(RULES.reads)
    assert "Namespace" not in watched  # no rule reads it, so nothing watches it
    with pytest.raises(ValueError, match="no watch is defined for kind"):
        resources_for({"Gadget"})
    assert {r.kind for r in RESOURCES} >= set(RULES.reads)


# --- reads are declared -------------------------------------------------------------------

def _workloads() -> list[dict[str, Any]]:
    c = container(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"})
    return [workload(kind, [copy.deepcopy(c)], namespace="team-a")
            for kind in ("Pod", "Deployment", "StatefulSet", "ReplicaSet", "DaemonSet", "Job",
                         "CronJob", "ReplicationController")]


def _cluster() -> list[dict[str, Any]]:
    """A cluster with something of every kind a rule reads, in the namespace judged."""
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"},
             "spec": {"hard": {"limits.cpu": "10", "requests.memory": "1Gi"}}}
    limits = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "l", "namespace": "team-a"},
              "spec": {"limits": [{"type": "Container", "max": {"cpu": "4"}, "default": {"cpu": "500m"}}]}}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"gpu": "a100"}},
            "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "8"}}}
    exception = {"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException",
                 "metadata": {"name": "e", "namespace": "team-a"},
                 "spec": {"rules": ["pod-fits-node"], "match": {"names": ["web"]}}}
    return [quota, limits, node, *_workloads(), *base(), pool({"memory": "1Gi"}),
            template({"memory": "512Mi"}), exception]


def _samples(group: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in _cluster() if o["kind"] == kind
            and o["apiVersion"].rpartition("/")[0] == group]


class Recording(StaticView):
    def __init__(self, objects: Iterable[dict[str, Any]]) -> None:
        super().__init__(objects)
        self.kinds: set[str] = set()

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        self.kinds.add(kind)
        return super().list(kind, namespace)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.kinds.add(kind)
        return super().get(kind, name, namespace)

    def by_index(self, index: Any, value: str) -> list[dict[str, Any]]:
        self.kinds.add(index.kind)
        return super().by_index(index, value)

    def index_version(self, index: Any) -> int:
        self.kinds.add(index.kind)
        return super().index_version(index)


def _subjects(rule: Rule) -> list[Subject]:
    out = []
    for group, kind in sorted(rule.kinds):
        for obj in _samples(group, kind):
            meta = obj["metadata"]
            for operation in sorted(rule.operations):
                new = None if operation == "DELETE" else copy.deepcopy(obj)
                old = copy.deepcopy(obj) if operation != "CREATE" else None
                if old is not None:
                    old["spec"] = {**old.get("spec", {}), "changedByTest": True}
                out.append(Subject(group, obj["apiVersion"].rpartition("/")[2], kind, operation,
                                   meta.get("namespace", ""), meta["name"], new, old))
    return out


@pytest.mark.parametrize("rule_id", sorted(RULES))
def test_a_rule_reads_only_what_it_declares(rule_id: str) -> None:
    """Run the rule over objects of every kind it judges, in a cluster holding every kind
    any rule reads: whatever it reads must be declared (the scoped view raises
    otherwise), and a rule that declares reads must use them somewhere."""
    rule = RULES[rule_id]
    subjects = _subjects(rule)
    assert subjects, f"no sample object for {rule_id}"
    view = Recording(_cluster())
    for subject in subjects:
        try:
            rule.fn(subject, copy.deepcopy(subject.obj or {}), ScopedView(view, rule.reads, rule.id),
                    Policy())
        except UndeclaredRead as exc:
            pytest.fail(str(exc))
    assert view.kinds <= rule.reads


def test_an_undeclared_read_is_an_internal_error() -> None:
    def peeks(subject: Subject, obj: dict[str, Any], view: Any, policy: Policy) -> list[Any]:
        view.list("Node")
        return []

    rule = replace(RULES["quantities"], fn=peeks)
    rules = RuleSet([rule])
    obj = workload("Deployment", [container()])
    result = evaluate(rules, Subject("apps", "v1", "Deployment", obj=obj), StaticView(), Policy(),
                      "validate")
    assert result.internal_errors == [InternalError(
        "quantities", "UndeclaredRead: rule quantities read Node but declares reads of nothing")]


# --- a stale view of each kind a rule reads --------------------------------------------

class LostWatch(StaticView):
    """The cluster with one kind's watch lost for two minutes."""

    def __init__(self, objects: Iterable[dict[str, Any]], lost: str) -> None:
        super().__init__(objects)
        self.lost = lost

    def problems(self, kinds: Iterable[str] | None = None) -> list[str]:
        return [f"{self.lost} watch lost 120s ago"] if kinds is None or self.lost in kinds else []


READS = sorted((rule.id, kind) for rule in RULES.values() for kind in rule.reads)


@pytest.mark.parametrize(("rule_id", "kind"), READS)
def test_a_lost_watch_of_what_a_rule_reads_is_answered_per_the_failure_mode(
        rule_id: str, kind: str) -> None:
    """As docs/cluster-view.md says: a rule in enforce mode that reads a stale kind is not
    run; that is an internal error, denied under failureMode deny (with the reason) and
    let through with a warning under allow. In warn mode it is a warning, never a denial."""
    rule = RULES[rule_id]
    alone = RuleSet([rule], RULES.copiers, updates=RULES.updates)
    subject = _subjects(rule)[0]
    view = LostWatch(_cluster(), kind)
    reason = f"{rule_id}: cluster view not current ({kind} watch lost 120s ago)"
    for failure_mode in ("deny", "allow"):
        policy = Policy(rules={rule_id: Mode.ENFORCE}, failureMode=failure_mode)
        result = evaluate(alone, subject, view, policy, rule.phase)
        assert [str(e) for e in result.internal_errors] == [reason]
        assert [e.rule for e in result.internal_errors] == [rule_id]
        decision = decide(result, failure_mode)
        if failure_mode == "deny":
            assert not decision.allowed and decision.code == 500 and reason in decision.message
        else:
            assert decision.allowed and any(w.startswith("envelope: skipped a rule after an internal "
                                                         "error") for w in decision.warnings or [])
    policy = Policy(rules={rule_id: Mode.WARN}, failureMode="deny")
    result = evaluate(alone, subject, view, policy, rule.phase)
    assert not result.internal_errors and decide(result, "deny").allowed
    assert any(f.rule == rule_id and f.message.startswith("not evaluated: cluster view not current")
               for f in result.warnings)


def test_every_rule_that_reads_the_view_has_a_stale_view_case() -> None:
    readers = {rule.id for rule in RULES.values() if rule.reads}
    assert readers == {rule_id for rule_id, _ in READS}
    assert {r for r in readers if r.startswith("kai-")} == {
        "kai-structure", "kai-guarantee-sum", "kai-pool-capacity", "kai-queue-name-unique",
        "kai-namespace-unique", "kai-tree-warnings", "kai-shrink", "kai-delete-in-use",
        "kai-usage-limit", "kai-usage-guarantee", "kai-usage-children"}
    assert {r for r in readers if r.startswith("actor-")} == {
        "actor-placement", "actor-microvm-cpu-share", "actor-microvm-memory-headroom",
        "actor-pool-shrink"}


# --- the engine owns modes and updates ----------------------------------------------------

def test_rules_never_read_a_mode() -> None:
    for path in (APP / "rules").rglob("*.py"):
        text = path.read_text()
        assert ".mode(" not in text and "modes(" not in text, path


def test_a_guard_holds_back_the_rules_that_strip_cpu_limits() -> None:
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"},
             "spec": {"hard": {"limits.cpu": "10"}}}
    obj = workload("Deployment", [container(limits={"cpu": "2", "memory": "1Gi"})], namespace="team-a")
    subject = Subject("apps", "v1", "Deployment", "CREATE", "team-a", obj["metadata"]["name"], obj)
    kept = evaluate(RULES, subject, StaticView([quota]), Policy(), "mutate")
    assert kept.patch == [] and [f.rule for f in kept.warnings] == ["quota-needs-cpu-limits"]
    off = Policy(rules={"quota-needs-cpu-limits": Mode.OFF})
    stripped = evaluate(RULES, subject, StaticView([quota]), off, "mutate")
    assert any(op["path"].endswith("/limits/cpu") for op in stripped.patch)
