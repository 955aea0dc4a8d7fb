"""The quota planner's order (issue #40): every prefix of a plan is admitted by the rules
the webhook runs, judged here independently of the planner (tests.helpers.quotaplan
.replay: the engine over the state so far, each patch applied with jsonpatch)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cluster.static import load
from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.core.engine import check_object
from app.quotaview.plan import Step, plan
from app.quotaview.plancommands import command_of, patch_ops
from app.rules.base import Subject
from tests.conftest import RULES
from tests.helpers.quotaplan import entry, krm, nodepool, nodes, replay, tenancies

ROOT = Path(__file__).resolve().parents[2]
POLICY = Policy()
STRICT = Policy(rules={"kai-delete-in-use": Mode.ENFORCE})
"""The default policy, with deleting a parent that still has children refused."""


def demo(research_h100: int | None = None) -> list[dict[str, Any]]:
    """examples/tenancy; ``research_h100`` rewrites research's h100 guarantee (56 as
    written, 8 cards no project uses, over the pool)."""
    objects = [m.obj for m in load([str(ROOT / "examples/tenancy")]).manifests]
    if research_h100 is not None:
        research = next(o for o in objects if o["kind"] == "Department"
                        and o["metadata"]["name"] == "research")
        research["spec"]["queues"][0]["resources"]["gpu"]["deserved"] = research_h100
    return objects


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def gpu(obj: dict[str, Any], i: int = 0) -> dict[str, Any]:
    block: dict[str, Any] = obj["spec"]["queues"][i]["resources"]["gpu"]
    return block


def order(steps: list[Step]) -> list[tuple[str, str, str]]:
    return [(s.op, s.kind, s.name) for s in steps]


def test_the_one_card_move_gives_before_it_takes() -> None:
    """research-train 8 -> 9 and research-eval 8 -> 7 in a department with no card spare:
    the order in the file (the grower first) is refused, the plan's is admitted."""
    base = demo(48)
    target = copy.deepcopy(base)
    gpu(named(target, "Project", "research-train"))["deserved"] = 9
    gpu(named(target, "Project", "research-eval"))["deserved"] = 7
    planned = plan(base, target, RULES, POLICY)
    assert planned.ok
    assert order(planned.steps) == [("update", "Project", "research-eval"),
                                    ("update", "Project", "research-train")]
    assert replay(planned, base, target, RULES, POLICY) == 2
    # The file's order: the grower first is refused by the same rules.
    view = StaticView(base, RULES.indexes)
    old = named(base, "Project", "research-train")
    grower = named(target, "Project", "research-train")
    refused = check_object(RULES, Subject("kai.resources", "v1alpha1", "Project", "UPDATE", "",
                                          "research-train", grower, old), view, POLICY)
    assert [f.rule for f in refused.errors] == ["kai-guarantee-sum"]
    assert "49 cards in total but the department has 48 cards" in refused.errors[0].message
    first = command_of(planned.steps[0])
    assert first.patch == (
        {"op": "test", "path": "/spec/queues/0/name", "value": "research-eval-h100"},
        {"op": "test", "path": "/spec/queues/0/nodepool", "value": "h100"},
        {"op": "test", "path": "/spec/queues/0/resources/gpu/deserved", "value": 8},
        {"op": "replace", "path": "/spec/queues/0/resources/gpu/deserved", "value": 7})
    assert first.text().startswith("kubectl patch projects.kai.resources research-eval --type=json -p ")


def test_the_demo_as_written_blames_the_department_that_over_reached() -> None:
    """research keeps 8 h100 cards no project uses and puts the pool 8 over: the plan names
    research first, not nlp (the last department a single apply would refuse)."""
    planned = plan([o for o in demo() if o["kind"] == "Node"], demo(), RULES, POLICY)
    assert not planned.ok and not planned.steps
    first = planned.target_errors[0]
    assert (first.kind, first.name, first.rule) == ("Department", "research", "kai-pool-capacity")
    assert "8 cards cannot be met" in first.message
    assert {b.name for b in planned.target_errors} == {"research", "vision", "nlp"}


def test_the_demo_from_empty_creates_parents_first_and_every_prefix_is_admitted() -> None:
    target = demo(48)
    base = [o for o in target if o["kind"] == "Node"]
    planned = plan(base, target, RULES, POLICY)
    assert planned.ok, planned.blocked
    steps = order(planned.steps)
    assert len(steps) == 2 + 8 + 48 + 3  # pools, departments, projects, KAI queues
    assert all(op == "create" for op, _, _ in steps)
    position = {name: i for i, (_, _, name) in enumerate(steps)}
    for obj in target:
        if obj["kind"] == "Project":
            assert position[obj["spec"]["parent"]] < position[obj["metadata"]["name"]]
        if obj["kind"] == "Department":
            assert position["h100"] < position[obj["metadata"]["name"]]
    assert replay(planned, base, target, RULES, POLICY) == len(steps)


def small(dept_gpu: dict[str, int], projects: dict[str, tuple[str, int]]) -> list[dict[str, Any]]:
    """Pool a (16 cards), departments and projects with gpu guarantees on it."""
    out = [*nodes(), nodepool("a", "a"), nodepool("b", "b")]
    out += [krm("Department", d, [entry(d, "a", g, -1, 0, 1)]) for d, g in dept_gpu.items()]
    out += [krm("Project", p, [entry(p, "a", g, -1, 0, 1)], parent) for p, (parent, g) in projects.items()]
    return out


def test_a_department_grows_before_its_projects_and_shrinks_after_them() -> None:
    base = small({"d0": 8, "d1": 8}, {"p0": ("d0", 4), "p1": ("d0", 4), "p2": ("d1", 8)})
    target = small({"d0": 12, "d1": 4}, {"p0": ("d0", 6), "p1": ("d0", 6), "p2": ("d1", 4)})
    planned = plan(base, target, RULES, POLICY)
    assert planned.ok
    steps = [name for _, _, name in order(planned.steps)]
    assert steps.index("p2") < steps.index("d1") < steps.index("d0") < steps.index("p0")
    assert steps.index("d0") < steps.index("p1")
    replay(planned, base, target, RULES, POLICY)


def test_a_project_moves_between_departments_of_a_full_pool() -> None:
    """p1 (4 cards) moves from d0 to d1 while the pool's 16 cards are all promised: it
    gives its cards up, d0 shrinks, d1 grows, p1 moves with its cards back (the move and
    the raise in one write once d1 has room)."""
    base = small({"d0": 8, "d1": 8}, {"p0": ("d0", 4), "p1": ("d0", 4), "p2": ("d1", 8)})
    target = small({"d0": 4, "d1": 12}, {"p0": ("d0", 4), "p1": ("d1", 4), "p2": ("d1", 8)})
    planned = plan(base, target, RULES, POLICY)
    assert planned.ok, planned.blocked
    assert order(planned.steps) == [("update", "Project", "p1"), ("update", "Department", "d0"),
                                    ("update", "Department", "d1"), ("update", "Project", "p1")]
    assert "changes parent" in planned.steps[0].why and planned.steps[3].why == "to the target"
    replay(planned, base, target, RULES, POLICY)
    # Without the pool full, the project moves in one write, before the department shrinks.
    roomy = small({"d0": 8, "d1": 4}, {"p0": ("d0", 4), "p1": ("d0", 4), "p2": ("d1", 4)})
    moved = small({"d0": 4, "d1": 8}, {"p0": ("d0", 4), "p1": ("d1", 4), "p2": ("d1", 4)})
    planned = plan(roomy, moved, RULES, POLICY)
    assert order(planned.steps) == [("update", "Department", "d1"), ("update", "Project", "p1"),
                                    ("update", "Department", "d0")]
    replay(planned, roomy, moved, RULES, POLICY)


def test_deleting_a_department_deletes_its_projects_first() -> None:
    base = small({"d0": 8, "d1": 8}, {"p0": ("d0", 4), "p1": ("d0", 4), "p2": ("d1", 8)})
    target = [o for o in base if o["metadata"]["name"] not in ("d0", "p0", "p1")]
    planned = plan(base, target, RULES, STRICT)
    assert order(planned.steps)[-1] == ("delete", "Department", "d0")
    assert {s.name for s in planned.steps} == {"d0", "p0", "p1"}
    replay(planned, base, target, RULES, STRICT)


def test_a_swap_of_queue_names_is_blocked_and_says_by_what() -> None:
    """Two projects trading queue names: each write claims a name the other still holds,
    so no order of single writes exists; the plan stops and quotes the rule."""
    base = small({"d0": 8}, {"p0": ("d0", 4), "p1": ("d0", 4)})
    target = copy.deepcopy(base)
    named(target, "Project", "p0")["spec"]["queues"][0]["name"] = "p1-a"
    named(target, "Project", "p1")["spec"]["queues"][0]["name"] = "p0-a"
    planned = plan(base, target, RULES, POLICY)
    assert not planned.ok and not planned.target_errors and not planned.steps
    assert {(b.name, b.rule) for b in planned.blocked} == {("p0", "kai-queue-name-unique"),
                                                            ("p1", "kai-queue-name-unique")}
    assert "already used by project p1" in str(planned.blocked[0])


def test_a_patch_tests_what_it_read_so_a_concurrent_change_fails_it() -> None:
    old = {"queues": [{"name": "x-a", "nodepool": "a", "resources": {"gpu": {"deserved": 3}}}]}
    new = copy.deepcopy(old)
    new["queues"][0]["resources"]["gpu"]["deserved"] = 2
    new["queues"][0]["resources"]["gpu"]["limit"] = 4
    ops = patch_ops(old, new, "")
    assert jsonpatch.apply_patch(old, ops) == new
    assert [op["op"] for op in ops] == ["test", "test", "test", "test", "replace", "add"]
    raced = copy.deepcopy(old)
    raced["queues"][0]["resources"]["gpu"]["deserved"] = 5  # someone else's change
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(raced, ops)
    raced = copy.deepcopy(old)
    raced["queues"][0]["resources"]["gpu"]["limit"] = 9  # someone else added the limit
    with pytest.raises(jsonpatch.JsonPatchTestFailed):
        jsonpatch.apply_patch(raced, ops)
    raced = copy.deepcopy(old)
    raced["queues"].insert(0, {"name": "y-a", "nodepool": "a", "resources": {"gpu": {"deserved": 3}}})
    with pytest.raises(jsonpatch.JsonPatchTestFailed):  # the index now names another entry
        jsonpatch.apply_patch(raced, ops)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.data_too_large])
@given(tenancies(), tenancies(), st.data())
def test_every_prefix_of_a_generated_change_is_admitted(base: list[dict[str, Any]],
                                                        target: list[dict[str, Any]],
                                                        data: st.DataObject) -> None:
    """200 generated changes between two tenancies that pass the rules (updates, creates,
    deletes, projects changing department, KAI Queues, ResourceQuotas): the plan reaches
    the target and each of its prefixes is admitted, judged independently — under the
    default policy and with deleting a parent that still has children refused."""
    context = nodes()
    base, target = [*context, *base], [*context, *target]
    policy = data.draw(st.sampled_from((POLICY, STRICT)))
    planned = plan(base, target, RULES, policy)
    assert not planned.target_errors, [str(b) for b in planned.target_errors]
    assert planned.ok, [str(b) for b in planned.blocked]
    replay(planned, base, target, RULES, policy)


def test_what_the_base_already_had_does_not_block_an_unrelated_change() -> None:
    """Pool b is already over-promised (d1 holds 10 of its 8 cards); moving a card between
    two projects of d0 on pool a is planned, and the old excess is reported, not blamed."""
    base = small({"d0": 8}, {"p0": ("d0", 4), "p1": ("d0", 4)})
    base.append(krm("Department", "d1", [entry("d1", "b", 10, -1, 0, 1)]))
    target = copy.deepcopy(base)
    gpu(named(target, "Project", "p0"))["deserved"] = 5
    gpu(named(target, "Project", "p1"))["deserved"] = 3
    planned = plan(base, target, RULES, POLICY)
    assert planned.ok and order(planned.steps) == [("update", "Project", "p1"), ("update", "Project", "p0")]
    assert any("Department d1: kai-pool-capacity" in a for a in planned.already)
    replay(planned, base, target, RULES, POLICY)
    # Making that excess worse is still refused.
    worse = copy.deepcopy(base)
    gpu(named(worse, "Department", "d1"))["deserved"] = 11
    assert plan(base, worse, RULES, POLICY).blocked or plan(base, worse, RULES, POLICY).target_errors


def test_queues_krm_generated_are_read_never_written() -> None:
    """The cluster's KRM-generated Queues (owned by an existing Department or Project, by
    uid) are context: a target of files, which never hold them, deletes none of them."""
    base = small({"d0": 8}, {"p0": ("d0", 4), "p1": ("d0", 4)})
    generated = []
    for obj in base:
        if obj["kind"] in ("Department", "Project"):
            obj["metadata"]["uid"] = f"uid-{obj['metadata']['name']}"
            entry_ = obj["spec"]["queues"][0]
            spec: dict[str, Any] = {"resources": {"gpu": {"quota": entry_["resources"]["gpu"]["deserved"],
                                                          "limit": -1, "overQuotaWeight": 1}}}
            if obj["kind"] == "Project":
                spec["parentQueue"] = "d0-a"
            generated.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
                              "metadata": {"name": entry_["name"], "ownerReferences": [
                                  {"apiVersion": "kai.resources/v1alpha1", "kind": obj["kind"],
                                   "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"]}]},
                              "spec": spec})
    base += generated
    target = copy.deepcopy([o for o in base if o["metadata"]["name"] != "p1" and o["kind"] != "Queue"])
    gpu(named(target, "Department", "d0"))["deserved"] = 4
    planned = plan(base, target, RULES, STRICT)
    assert planned.ok, [str(b) for b in planned.blocked]
    assert order(planned.steps) == [("delete", "Project", "p1"), ("update", "Department", "d0")]
