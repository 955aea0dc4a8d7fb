"""Quota trees for the planner's tests: a hypothesis strategy that draws a tenancy that
passes the quota rules (pools with nodes, departments, projects, a KAI Queue tree,
namespace ResourceQuotas), from a small universe of names so that two draws overlap —
a base and a target then differ by updates, creates, deletes and projects that change
department — and an independent replay of a plan through the engine."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.core.ruleset import RuleSet
from app.quotaview.plan import Plan, key_of
from app.quotaview.plancommands import command_of
from app.rules.base import Subject

KRM = "kai.resources/v1alpha1"
KAI = "scheduling.run.ai/v2"
POOLS = {"a": 16, "b": 8}
"""Pool name -> cards (two nodes each, half the cards on each)."""
DEPARTMENTS = ("d0", "d1", "d2")
PROJECTS = ("p0", "p1", "p2", "p3", "p4", "p5")
CHILD_QUEUES = ("q0", "q1", "q2")


def node(name: str, pool: str, cards: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"envelope.test/pool": pool}},
            "status": {"capacity": {"nvidia.com/gpu": str(cards)},
                       "allocatable": {"nvidia.com/gpu": str(cards)}}}


def nodes(prefix: str = "") -> list[dict[str, Any]]:
    return [node(f"{prefix}n-{pool}-{i}", f"{prefix}{pool}", cards // 2)
            for pool, cards in POOLS.items() for i in (1, 2)]


def nodepool(name: str, label: str) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": name},
            "spec": {"labelKey": "envelope.test/pool", "labelValue": label}}


def block(deserved: int, limit: int, weight: int = 1, field: str = "deserved") -> dict[str, Any]:
    return {field: deserved, "limit": limit, "overQuotaWeight": weight}


def entry(owner: str, pool: str, gpu: int, gpu_limit: int, cpu: int, weight: int) -> dict[str, Any]:
    return {"name": f"{owner}-{pool}", "nodepool": pool,
            "resources": {"gpu": block(gpu, gpu_limit, weight), "cpu": block(cpu, -1, weight),
                          "memory": block(0, -1, weight)}}


def krm(kind: str, name: str, queues: list[dict[str, Any]], parent: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"queues": queues}
    if parent:
        spec = {"parent": parent, **spec}
    return {"apiVersion": KRM, "kind": kind, "metadata": {"name": name}, "spec": spec}


def kai_queue(name: str, parent: str, gpu: int, limit: int, priority: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": priority, "resources": {
        "gpu": block(gpu, limit, field="quota"), "cpu": block(0, -1, field="quota"),
        "memory": block(0, -1, field="quota")}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def resource_quota(namespace: str, cpu: int, memory: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "compute", "namespace": namespace},
            "spec": {"hard": {"requests.cpu": str(cpu), "requests.memory": f"{memory}Gi"}}}


@st.composite
def tenancies(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A tenancy that passes the quota rules: on each pool departments share at most the
    pool's cards, projects at most their department's guarantee (gpu and cpu), a child
    queue at most its parent's quota."""
    out: list[dict[str, Any]] = [nodepool(p, p) for p in POOLS]
    departments = draw(st.lists(st.sampled_from(DEPARTMENTS), min_size=1, unique=True))
    pools_of: dict[str, list[str]] = {}
    guarantee: dict[tuple[str, str], tuple[int, int]] = {}
    for d in departments:
        pools_of[d] = draw(st.lists(st.sampled_from(sorted(POOLS)), min_size=1, unique=True))
    for d in departments:
        queues = []
        for pool in pools_of[d]:
            sharing = sum(1 for other in departments if pool in pools_of[other])
            gpu = draw(st.integers(0, POOLS[pool] // sharing))  # the bound can be reached: full pools
            cpu = draw(st.sampled_from((0, 4000, 8000, 16000)))
            guarantee[(d, pool)] = (gpu, cpu)
            limit = draw(st.sampled_from((-1, gpu, gpu + 4)))
            queues.append(entry(d, pool, gpu, limit, cpu, draw(st.integers(1, 3))))
        out.append(krm("Department", d, queues))
    projects = draw(st.lists(st.sampled_from(PROJECTS), unique=True))
    parents = {p: draw(st.sampled_from(departments)) for p in projects}
    for p in projects:
        d = parents[p]
        siblings = sum(1 for q in projects if parents[q] == d)
        queues = []
        for pool in draw(st.lists(st.sampled_from(pools_of[d]), min_size=1, unique=True)):
            gpu_cap, cpu_cap = guarantee[(d, pool)]
            gpu = draw(st.integers(0, gpu_cap // siblings))
            cpu = draw(st.sampled_from(sorted({0, cpu_cap // siblings})))
            queues.append(entry(p, pool, gpu, draw(st.sampled_from((-1, gpu + 2))), cpu, 1))
        out.append(krm("Project", p, queues, d))
    root = draw(st.integers(0, 8))
    out.append(kai_queue("qroot", "", root, -1, 100))
    children = draw(st.lists(st.sampled_from(CHILD_QUEUES), unique=True))
    for q in children:
        out.append(kai_queue(q, "qroot", draw(st.integers(0, root // max(1, len(children)))), -1,
                             draw(st.integers(0, 200))))
    for p in draw(st.lists(st.sampled_from(PROJECTS), unique=True, max_size=3)):
        out.append(resource_quota(f"kai-{p}", draw(st.integers(1, 64)), draw(st.integers(1, 256))))
    return out


def replay(planned: Plan, base: list[dict[str, Any]], target: list[dict[str, Any]],
           rules: RuleSet, policy: Policy) -> int:
    """Apply the plan's steps one by one to the base, judging each with the engine as the
    webhook would (the state so far as the view, the written object and its stored copy),
    each patch applied to the stored spec with jsonpatch (its tests must hold). Asserts
    every prefix is admitted and the end is the target; returns the number of steps."""
    context = [o for o in base if o.get("kind") == "Node"]
    state = {k: o for o in base if (k := key_of(o)) is not None}
    for i, step in enumerate(planned.steps):
        stored = state.get(step.key)
        assert (stored is None) == (step.op == "create"), (i, step)
        view = StaticView([*context, *state.values()], rules.indexes)
        group, _, version = step.api_version.rpartition("/")
        operation = {"create": "CREATE", "update": "UPDATE", "delete": "DELETE"}[step.op]
        written = None
        if step.op == "update":
            assert stored is not None
            ops = list(command_of(step).patch)
            spec = jsonpatch.apply_patch({"spec": copy.deepcopy(stored.get("spec"))}, ops)["spec"]
            written = {**stored, "spec": spec}
            assert written == step.after, (i, step)
        elif step.op == "create":
            written = step.after
        result = check_object(rules, Subject(group, version, step.kind, operation, step.namespace,
                                             step.name, written, stored), view, policy)
        assert not result.errors and not result.internal_errors, \
            (i, step.op, step.kind, step.name, [f.message for f in result.errors])
        if written is None:
            del state[step.key]
        else:
            state[step.key] = written
    goal = {k: o for o in target if (k := key_of(o)) is not None}
    assert set(state) == set(goal)
    for k, obj in goal.items():
        assert state[k].get("spec") == obj.get("spec"), k
    return len(planned.steps)
