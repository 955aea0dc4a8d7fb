"""The quota planner's ordering engine (issue #40): from a base quota tree to a target,
an ordered list of single-object writes in which **every intermediate state passes
Envelope's own rules** — the rule set and engine the webhook runs
(:func:`app.core.engine.check_object` over a :class:`~app.cluster.view.StaticView` of the
state so far, the written object replacing its stored copy as the rules' ``After``
does), not a copy of them. Pure: objects in, steps out, no I/O.

Each round the candidate writes are tried in a fixed preference (deletes, lowerings,
creates, the target object, a changed parent, guarantees zeroed before a move) and the
first the rules admit is applied. Lowerings never raise anything, so a target that passes
the rules is always reachable; when no candidate is admitted the plan stops and says which
object blocks and why, and when the target itself does not pass the blame goes to the
object that over-reached (its guarantee grew, or it keeps cards no child uses), not to
the last one that would be written. The preference and why each comes where it does:
docs/quotas.md, "Planning a change".

Why one module of ~490 lines: the candidates, the state they are judged against and the
blame are one search; each candidate is built from the state the previous writes made,
and the blame scores the same objects the candidates write.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import Evaluation, check_object, json_copy
from app.core.ruleset import RuleSet
from app.k8s.util import same
from app.rules.base import Subject
from app.rules.quotas.objects import is_ours, krm_owned, name_of

__all__ = ["PLANNED_KINDS", "Blocker", "Key", "Plan", "Step", "admits", "apply_step", "key_of",
           "plan", "state_of"]

#: The kinds a plan writes. Nodes (and anything else) are context: read, never written.
PLANNED_KINDS = ("NodePool", "Department", "Project", "Queue", "ResourceQuota")
#: Kinds the quota rules read besides the planned ones.
CONTEXT_KINDS = ("Node",)

Key = tuple[str, str, str]
"""(kind, namespace, name); namespace is empty for the cluster-scoped KAI kinds."""
Op = Literal["create", "update", "delete"]

GUARANTEE = {"Department": "deserved", "Project": "deserved", "Queue": "quota"}
PARENT = {"Project": "parent", "Queue": "parentQueue"}
RESOURCES = ("gpu", "cpu", "memory")


@dataclass(frozen=True)
class Step:
    """One write: what it reads (``before``) and what it leaves (``after``)."""

    op: Op
    kind: str
    namespace: str
    name: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    why: str

    @property
    def key(self) -> Key:
        return (self.kind, self.namespace, self.name)

    @property
    def api_version(self) -> str:
        obj = self.after if self.after is not None else self.before
        return str((obj or {}).get("apiVersion", ""))


@dataclass(frozen=True)
class Blocker:
    """Why the plan cannot go on: the object, the rule and the rule's own message."""

    kind: str
    name: str
    rule: str
    message: str
    namespace: str = ""

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}: {self.rule}: {self.message}"


@dataclass
class Plan:
    steps: list[Step] = field(default_factory=list)
    blocked: list[Blocker] = field(default_factory=list)
    """Empty when the steps reach the target."""
    target_errors: list[Blocker] = field(default_factory=list)
    """The target's own findings (each object judged as a CREATE against the target, as
    ``envelope check`` judges files): no order reaches a target that has any."""
    unplanned: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    """Findings the base already had and the target keeps (they do not block; each step is
    judged as the webhook judges it, which refuses only a write that makes them worse)."""
    """Differences the plan does not write (a NodePool's immutable label pair, ...)."""

    @property
    def ok(self) -> bool:
        return not self.blocked and not self.target_errors and not self.unplanned


# --- objects and states ---------------------------------------------------------------

def _meta(obj: dict[str, Any], key: str) -> str:
    meta = obj.get("metadata")
    value = meta.get(key) if isinstance(meta, dict) else None
    return value if isinstance(value, str) else ""


def key_of(obj: dict[str, Any]) -> Key | None:
    """The object's key when a plan writes its kind, else None."""
    kind = obj.get("kind")
    if kind == "ResourceQuota" and obj.get("apiVersion") == "v1":
        return ("ResourceQuota", _meta(obj, "namespace") or "default", _meta(obj, "name"))
    if isinstance(kind, str) and kind in PLANNED_KINDS and is_ours(kind, obj):
        return (kind, "", name_of(obj))
    return None


def state_of(objects: Iterable[dict[str, Any]]) -> tuple[dict[Key, dict[str, Any]], list[dict[str, Any]]]:
    """The planned objects by key, and the context (Nodes, KRM-generated Queues: read by
    the rules, never written — KRM rewrites its Queues from their Department or Project)."""
    objects = list(objects)
    planned: dict[Key, dict[str, Any]] = {}
    context: list[dict[str, Any]] = []
    owners = _Owners(objects)
    for obj in objects:
        key = key_of(obj)
        if key is None:
            if obj.get("kind") in CONTEXT_KINDS:
                context.append(obj)
        elif key[0] == "Queue" and krm_owned(obj, owners):
            context.append(obj)
        else:
            planned[key] = obj
    return planned, context


class _Owners:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self._by = {(str(o.get("kind")), name_of(o)): o for o in objects
                    if o.get("kind") in ("Department", "Project")}

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        return self._by.get((kind, name))


def _judged(obj: dict[str, Any]) -> Any:
    """What a plan compares and writes: the spec (metadata and status are the cluster's)."""
    return obj.get("spec")


def _written(current: dict[str, Any], spec: Any) -> dict[str, Any]:
    """``current`` with ``spec`` (its metadata and status kept)."""
    out = dict(current)
    out["spec"] = json_copy(spec)
    return out


# --- numbers --------------------------------------------------------------------------

def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return Decimal(str(value))
    except InvalidOperation:
        return None


def _at_most(now: Any, target: Any) -> Any:
    """The smaller guarantee of the two (-1 = unlimited is the largest), as written."""
    a, b = _number(now), _number(target)
    if a is None or b is None:
        return now
    if a == -1:
        return target
    if b == -1:
        return now
    return target if b < a else now


def _resources(kind: str, entry: dict[str, Any]) -> dict[str, Any]:
    found = entry.get("resources")
    return found if isinstance(found, dict) else {}


def _entries(kind: str, spec: Any) -> dict[str, dict[str, Any]]:
    """The queue entries of a spec by node pool (a KAI Queue is one entry, its spec)."""
    if not isinstance(spec, dict):
        return {}
    if kind == "Queue":
        return {"": spec}
    queues = spec.get("queues")
    out: dict[str, dict[str, Any]] = {}
    if isinstance(queues, list):
        for entry in queues:
            if isinstance(entry, dict):
                out.setdefault(str(entry.get("nodepool", "")), entry)
    return out


def _lowered(kind: str, now: Any, target: Any, *, drop: bool) -> Any:
    """``now`` with every guarantee at ``min(now, target)`` on the pools both have and,
    when ``drop``, the queues on pools the target leaves removed. Never raises anything."""
    if kind not in GUARANTEE or not isinstance(now, dict):
        return now
    out = json_copy(now)
    field_name = GUARANTEE[kind]
    wanted = _entries(kind, target)
    if kind != "Queue" and drop and isinstance(out.get("queues"), list):
        out["queues"] = [e for e in out["queues"]
                         if not isinstance(e, dict) or str(e.get("nodepool", "")) in wanted]
    for pool, entry in _entries(kind, out).items():
        goal = wanted.get(pool)
        goal_resources = _resources(kind, goal) if goal is not None else {}
        for r, block in _resources(kind, entry).items():
            if not isinstance(block, dict) or field_name not in block:
                continue
            goal_block = goal_resources.get(r)
            goal_value = goal_block.get(field_name, 0) if isinstance(goal_block, dict) else 0
            block[field_name] = _at_most(block[field_name], goal_value)
    return out


def _gives_only(kind: str, now: Any, target: Any) -> bool:
    """The target raises no guarantee and adds no queue (it may change anything else)."""
    if kind not in GUARANTEE or _parent(kind, now) != _parent(kind, target):
        return False
    if not set(_entries(kind, target)) <= set(_entries(kind, now)):
        return False
    return same(_lowered(kind, target, now, drop=False), target)


def _zeroed(kind: str, now: Any) -> Any:
    """``now`` with every guarantee 0: what a child holds while it changes parent."""
    out = json_copy(now)
    field_name = GUARANTEE.get(kind, "")
    for entry in _entries(kind, out).values():
        for block in _resources(kind, entry).values():
            if isinstance(block, dict) and _number(block.get(field_name)) not in (None, Decimal(0)):
                block[field_name] = 0
    return out


def _parent(kind: str, spec: Any) -> str:
    value = spec.get(PARENT[kind]) if kind in PARENT and isinstance(spec, dict) else None
    return value if isinstance(value, str) else ""


def _with_parent(kind: str, spec: Any, parent: str) -> Any:
    out = json_copy(spec)
    if parent:
        out[PARENT[kind]] = parent
    else:
        out.pop(PARENT[kind], None)
    return out


# --- judging one write ----------------------------------------------------------------

def _subject(op: Op, key: Key, obj: dict[str, Any] | None, old: dict[str, Any] | None) -> Subject:
    sample = obj if obj is not None else old or {}
    group, _, version = str(sample.get("apiVersion", "")).rpartition("/")
    operation = {"create": "CREATE", "update": "UPDATE", "delete": "DELETE"}[op]
    return Subject(group, version, key[0], operation, key[1], key[2], obj, old)


def admits(rules: RuleSet, policy: Policy, view: StaticView, step: Step) -> Evaluation:
    """The webhook pair's answer to ``step`` over ``view`` (the state before it)."""
    return check_object(rules, _subject(step.op, step.key, step.after, step.before), view, policy)


def _refused(result: Evaluation) -> bool:
    return bool(result.errors or result.internal_errors)


def apply_step(state: dict[Key, dict[str, Any]], step: Step) -> None:
    if step.after is None:
        state.pop(step.key, None)
    else:
        state[step.key] = step.after


def _owner_gone(obj: dict[str, Any], state: dict[Key, dict[str, Any]]) -> bool:
    """A KRM-generated Queue whose Department or Project this plan has deleted: the
    garbage collector removes it with its owner, so the rules must not see it either."""
    meta = obj.get("metadata")
    owners = meta.get("ownerReferences") if isinstance(meta, dict) else None
    return obj.get("kind") == "Queue" and isinstance(owners, list) and any(
        isinstance(o, dict) and o.get("kind") in ("Department", "Project")
        and (str(o["kind"]), "", str(o.get("name"))) not in state for o in owners)


def _view(state: dict[Key, dict[str, Any]], context: list[dict[str, Any]], rules: RuleSet) -> StaticView:
    return StaticView([*(o for o in context if not _owner_gone(o, state)), *state.values()], rules.indexes)


# --- candidates -----------------------------------------------------------------------

_DELETE_ORDER = {"Project": 0, "ResourceQuota": 0, "Queue": 1, "Department": 2, "NodePool": 3}
_CREATE_ORDER = {"NodePool": 0, "Department": 1, "Queue": 2, "Project": 3, "ResourceQuota": 4}


def _queue_depth(name: str, specs: dict[str, Any]) -> int:
    depth, seen = 0, {name}
    parent = _parent("Queue", specs.get(name))
    while parent and parent not in seen and parent in specs:
        seen.add(parent)
        depth += 1
        parent = _parent("Queue", specs.get(parent))
    return depth


def _candidates(state: dict[Key, dict[str, Any]], target: dict[Key, dict[str, Any]],
                zeroed: set[Key]) -> Iterator[Step]:
    """The writes to try now, most preferred first (see the module's docstring)."""
    queues_now = {k[2]: _judged(o) for k, o in state.items() if k[0] == "Queue"}
    queues_goal = {k[2]: _judged(o) for k, o in target.items() if k[0] == "Queue"}
    gone = [k for k in state if k not in target]
    gone.sort(key=lambda k: (_DELETE_ORDER[k[0]], -_queue_depth(k[2], queues_now), k))
    for k in gone:
        yield Step("delete", *k, state[k], None, "not in the target")
    for k in gone:  # a parent that cannot go yet (children still point at it) gives its cards up
        if k[0] in GUARANTEE:
            low = _zeroed(k[0], _judged(state[k]))
            if not same(low, _judged(state[k])):
                yield Step("update", *k, state[k], _written(state[k], low),
                           "gives up its guarantees before it is deleted")
    changed = sorted((k for k in state if k in target and not same(_judged(state[k]), _judged(target[k]))),
                     key=lambda k: (_DELETE_ORDER[k[0]], -_queue_depth(k[2], queues_now), k))
    for k in changed:
        now, goal = _judged(state[k]), _judged(target[k])
        tried: list[Any] = [now]
        if _gives_only(k[0], now, goal):  # the whole change gives: one write, in the givers' turn
            tried.append(goal)
            yield Step("update", *k, state[k], _written(state[k], goal),
                       "gives up guarantee (a giver goes first)")
        for drop in (True, False):  # without its queues on pools it leaves, if they still hold children
            low = _lowered(k[0], now, goal, drop=drop)
            if not any(same(low, t) for t in tried):
                tried.append(low)
                yield Step("update", *k, state[k], _written(state[k], low),
                           "gives up guarantee (a giver goes first)")
    new = [k for k in target if k not in state]
    new.sort(key=lambda k: (_CREATE_ORDER[k[0]], _queue_depth(k[2], queues_goal), k))
    for k in new:
        yield Step("create", *k, None, json_copy(target[k]), "new in the target")
    changed.sort(key=lambda k: (_CREATE_ORDER[k[0]], _queue_depth(k[2], queues_goal), k))
    for k in changed:
        yield Step("update", *k, state[k], _written(state[k], _judged(target[k])), "to the target")
    for k in changed:
        now, goal = _judged(state[k]), _judged(target[k])
        if k[0] in PARENT and _parent(k[0], now) != _parent(k[0], goal):
            moved = _with_parent(k[0], now, _parent(k[0], goal))
            yield Step("update", *k, state[k], _written(state[k], moved),
                       f"moves from {_parent(k[0], now) or '(none)'} to {_parent(k[0], goal) or '(none)'}")
    for k in changed:
        now, goal = _judged(state[k]), _judged(target[k])
        if k[0] in PARENT and k not in zeroed and _parent(k[0], now) != _parent(k[0], goal):
            low = _zeroed(k[0], now)
            if not same(low, now):
                yield Step("update", *k, state[k], _written(state[k], low),
                           "gives up its guarantees while it changes parent (taken back after the move)")


# --- the target's own findings and the blame ------------------------------------------

def _target_errors(target: dict[Key, dict[str, Any]], context: list[dict[str, Any]], rules: RuleSet,
                   policy: Policy) -> dict[Key, list[tuple[str, str]]]:
    view = _view(target, context, rules)
    out: dict[Key, list[tuple[str, str]]] = {}
    for k, obj in target.items():
        result = check_object(rules, _subject("create", k, obj, None), view, policy)
        found = [(f.rule, f.message) for f in result.errors]
        found += [(e.rule, e.message) for e in result.internal_errors]
        if found:
            out[k] = found
    return out


def _gpu_total(kind: str, spec: Any) -> Decimal:
    total = Decimal(0)
    for entry in _entries(kind, spec).values():
        block = _resources(kind, entry).get("gpu")
        value = _number(block.get(GUARANTEE.get(kind, ""))) if isinstance(block, dict) else None
        if value is not None and value > 0:
            total += value
    return total


def _blame(errors: dict[Key, list[tuple[str, str]]], base: dict[Key, dict[str, Any]],
           target: dict[Key, dict[str, Any]]) -> list[Blocker]:
    """The target's errors, the over-reacher first: among the objects a sum's error is
    reported on, the ones whose guarantee grew most from the base (a new object grew by all
    of it), then the ones that keep most cards no child uses (a department guaranteed more
    than its projects)."""
    children: dict[str, Decimal] = {}
    for k, obj in target.items():
        if k[0] == "Project":
            parent = _parent("Project", _judged(obj))
            children[parent] = children.get(parent, Decimal(0)) + _gpu_total("Project", _judged(obj))

    def score(k: Key) -> tuple[Decimal, Decimal, Key]:
        mine = _gpu_total(k[0], _judged(target[k]))
        before = _gpu_total(k[0], _judged(base[k])) if k in base else Decimal(0)
        slack = mine - children.get(k[2], Decimal(0)) if k[0] == "Department" else Decimal(0)
        return (-(mine - before), -slack, k)

    ranked = sorted(errors, key=score)
    out: list[Blocker] = []
    for k in ranked:
        for rule_id, message in errors[k]:
            out.append(Blocker(k[0], k[2], rule_id, message, k[1]))
    return out


# --- the plan -------------------------------------------------------------------------

def plan(base: Iterable[dict[str, Any]], target: Iterable[dict[str, Any]], rules: RuleSet,
         policy: Policy) -> Plan:
    """The ordered writes from ``base`` to ``target`` (complete sets of objects: what is
    in the base and not in the target is deleted). Context objects (Nodes) are taken
    from the target when it has any, else from the base."""
    state, base_context = state_of(base)
    goal, goal_context = state_of(target)
    nodes = goal_context if any(o.get("kind") == "Node" for o in goal_context) else \
        [o for o in base_context if o.get("kind") == "Node"]
    context = [*nodes, *(o for o in base_context if o.get("kind") != "Node")]
    out = Plan()
    for k in goal:
        if k[0] == "NodePool" and k in state and not same(_judged(state[k]), _judged(goal[k])):
            out.unplanned.append(f"NodePool {k[2]}: labelKey and labelValue are immutable; delete "
                                 f"the pool and create it anew (its queues move first)")
            goal[k] = state[k]
    errors = _target_errors(goal, context, rules, policy)
    if errors:
        # What the base already had is not the change's doing: the webhook ratchets it
        # (a write that does not make a sum worse is admitted), and each step is judged
        # below. Only an error the base did not have blocks the target.
        had = _target_errors(state, context, rules, policy)
        known = {(k, rule) for k, found in had.items() for rule, _ in found}
        new = {k: [(rule, m) for rule, m in found if (k, rule) not in known] for k, found in errors.items()}
        new = {k: found for k, found in new.items() if found}
        out.already = [str(b) for b in _blame({k: f for k, f in errors.items() if k not in new}, state, goal)]
        if new:
            out.target_errors = _blame(new, state, goal)
            return out
    zeroed: set[Key] = set()
    limit = 8 * (len(state) + len(goal)) + 16
    view = _view(state, context, rules)
    while len(out.steps) < limit:
        if all(k in goal and same(_judged(o), _judged(goal[k])) for k, o in state.items()) and \
                all(k in state for k in goal):
            return out
        chosen = None
        for step in _candidates(state, goal, zeroed):
            if not _refused(admits(rules, policy, view, step)):
                chosen = step
                break
        if chosen is None:
            out.blocked = _stuck(state, goal, zeroed, view, rules, policy)
            return out
        if chosen.why.startswith("gives up its guarantees while"):
            zeroed.add(chosen.key)
        out.steps.append(chosen)
        apply_step(state, chosen)
        view = _view(state, context, rules)
    out.blocked = [Blocker("", "", "planner", f"no order found within {limit} writes")]
    return out


def _stuck(state: dict[Key, dict[str, Any]], goal: dict[Key, dict[str, Any]], zeroed: set[Key],
           view: StaticView, rules: RuleSet, policy: Policy) -> list[Blocker]:
    """Why no write is admitted: each pending object's write to its target, refused, with
    the rule's message."""
    out: list[Blocker] = []
    seen: set[Key] = set()
    for step in _candidates(state, goal, zeroed):
        if step.key in seen:
            continue
        seen.add(step.key)
        result = admits(rules, policy, view, step)
        for f in result.errors:
            out.append(Blocker(step.kind, step.name, f.rule, f.message, step.namespace))
        for e in result.internal_errors:
            out.append(Blocker(step.kind, step.name, e.rule, e.message, step.namespace))
    return out
