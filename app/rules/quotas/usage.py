"""Quota changes against what the queues hold right now: KAI Queue status.

KAI Scheduler's queue controller writes on every ``scheduling.run.ai/v2`` Queue what its
running jobs hold (``status.allocated``, ``allocatedNonPreemptible``) and ask
(``requested``) as Kubernetes ``ResourceList`` quantities, converted here exactly to the
spec's units (cards, mCPU, MB of 10^6 bytes; GPUs by :func:`app.crds.kai.status_resource`).
A status with none of the lists is "not evaluated", never zero; a Department or Project
is judged on the Queues KRM generates from it. Nothing is evicted when a number drops
under the usage, so these rules warn by default; on UPDATE they speak only about a
number this write lowered. What each list means, how a missing one is read, and the
messages: docs/quotas.md, "Usage: what the queues hold now".

Why one module of ~391 lines: three rules over one reading of Queue status (the
conversion, what an absent list means, a queue's own and its children's usage); they
share that reading and its "not evaluated" answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, localcontext
from typing import Any, cast

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.crds.kai import (
    RESOURCES,
    UNLIMITED,
    ZERO,
    Resource,
    describe,
    effective,
    status_resource,
)
from app.k8s.quantity import QuantityError, parse_quantity
from app.k8s.util import Memo, brief, digest
from app.rules.base import Finding, Subject, rule, warning
from app.rules.quotas.messages import names_list, plural
from app.rules.quotas.objects import (
    PROJECT_PARENT,
    QUEUE_PARENT,
    TREES,
    After,
    generated_queue,
    is_ours,
    spec,
)
from app.rules.quotas.tree import Slot, by_pool, old_slots, slots

__all__ = ["FIELDS", "Usage", "check_usage_children", "check_usage_guarantee",
           "check_usage_limit", "queue_usage", "read_usage"]

FIELDS = ("allocated", "allocatedNonPreemptible", "requested")
"""The usage lists of a KAI Queue's status."""

EXACT = Context(prec=60, Emax=MAX_EMAX, Emin=MIN_EMIN)
"""Usage arithmetic: 60 significant digits (exact for any quantity a scheduler writes:
0.1 + 0.2 is 0.3) and no overflow, since a status quantity may carry an exponent of 2^31
(the API server stores what it parses). Not unbounded precision: 1e2000000000 - 5 exactly
would be two billion digits."""
CONSEQUENCE = "nothing is evicted; the new {what} applies as workloads finish"
SHORT_CONSEQUENCE = "nothing evicted, applies as jobs finish"
"""The warning-header form (under 120 characters with the numbers): the queue by its name
alone (cluster-wide unique), the pool in the full message."""


Usage = dict[Resource, Decimal]
"""One usage list in the spec's units; a resource whose quantity does not parse is left out."""


def _convert(key: str, quantity: Decimal) -> tuple[Resource, Decimal] | None:
    """A status quantity in the spec's unit, exactly (a shift of the decimal point); the
    key read as KAI counts it (:func:`app.crds.kai.status_resource`: DRA GPUs are keyed by
    their DeviceClass name)."""
    resource = status_resource(key)
    if resource == "cpu":
        return "cpu", quantity.scaleb(3, EXACT)  # cores -> mCPU
    if resource == "memory":
        return "memory", quantity.scaleb(-6, EXACT)  # bytes -> MB of 10^6 bytes
    if resource == "gpu":
        return "gpu", quantity
    return None


_READ: Memo[tuple[bytes, str], Usage | None] = Memo(50_000, 16 * 2**20)
"""Usage by the digest of the status lists ``_read`` reads (``util.digest``): the view's
statuses are read by many requests. Not by identity, which kept every old status."""


def read_usage(status: Any, field: str) -> Usage | None:
    """One usage list of a Queue status in cards, mCPU and MB; None when it is absent
    (not reconciled, or idle: KAI cannot tell them apart for us). Never raises."""
    if not isinstance(status, dict):
        return None
    try:
        key = (digest([status.get(f) for f in FIELDS]), field)
    except TypeError:  # not JSON (a YAML file's non-string keys): not remembered
        with localcontext(EXACT):
            return _read(status, field)
    found = _READ.get(key, _ABSENT)
    if found is not _ABSENT:
        return cast("Usage | None", found)
    with localcontext(EXACT):
        usage = _read(status, field)
    return _READ.put(key, usage)


_ABSENT = object()


def _read(status: dict[str, Any], field: str) -> Usage | None:
    found = status.get(field)
    if not isinstance(found, dict):
        # KAI rewrites all three lists on every reconcile and omits the empty ones: when
        # another is there, the queue was reconciled and this one is empty (a busy queue
        # of preemptible jobs only has no allocatedNonPreemptible).
        if any(isinstance(status.get(f), dict) for f in FIELDS):
            return dict.fromkeys(RESOURCES, ZERO)
        return None
    out: Usage = dict.fromkeys(RESOURCES, ZERO)
    unreadable: set[Resource] = set()
    for key, value in found.items():
        known = _convert(str(key), ZERO)
        if known is None:
            continue  # run.ai/gpu.memory, pods, ...: no quota of the spec
        try:
            resource, amount = _convert(str(key), parse_quantity(value)) or known
        except QuantityError:
            unreadable.add(known[0])  # not evaluated, never zero
            continue
        out[resource] += amount
    for resource in unreadable:
        del out[resource]
    return out


@dataclass(frozen=True)
class Seen:
    """A queue's usage as the view shows it, or why it cannot be read."""

    queue: str
    usage: Usage | None
    why: str = ""
    """Why ``usage`` is None, for a "not evaluated" message."""
    exists: bool = True
    """False when no such KAI Queue is in the view: KRM has not created it yet, so no
    workload runs in it (KAI schedules none into a queue that does not exist) and there
    is nothing to say. ``envelope check`` says "not evaluated" when the view has no
    Queues at all (``app.core.ruleset.NEEDS``)."""


def _status_of(obj: Any) -> Any:
    return obj.get("status") if isinstance(obj, dict) else None


def queue_usage(after: After, queue: str, field: str, subject: Subject | None = None,
                obj: dict[str, Any] | None = None) -> Seen:
    """The usage of KAI Queue ``queue``. For the Queue being written, its status comes
    from the request (on UPDATE the old object: the API server keeps status out of a
    spec write), else the view's copy; for any other queue, the view's copy."""
    candidates: list[Any] = []
    if subject is not None:
        if subject.operation == "UPDATE":
            candidates.append(_status_of(subject.old))
        candidates.append(_status_of(obj))
    stored = after.view.get("Queue", queue)
    stored = stored if is_ours("Queue", stored) else None
    candidates.append(_status_of(stored))
    for status in candidates:
        usage = read_usage(status, field)
        if usage is not None:
            return Seen(queue, usage)
    if stored is None and not (subject is not None and subject.operation == "UPDATE"):
        return Seen(queue, None, "", exists=False)
    return Seen(queue, None, f"no status.{field} from KAI")


DIGITS = 24
"""Usage with more integer or fraction digits than this is shown in scientific form: a
status quantity of 1e2000000000 must not become a message of two billion digits."""


def amount(resource: Resource, value: Decimal) -> str:
    """A usage amount in the resource's units, bounded in length."""
    if value.is_finite() and value != 0 and abs(value.adjusted()) > DIGITS:
        unit = {"gpu": "cards", "cpu": "mCPU", "memory": "MB"}[resource]
        return f"{value:.6E} {unit}"
    return describe(resource, value)


def _was(prev: Slot | None, resource: Resource, limit: bool) -> Decimal | None:
    if prev is None:
        return None
    return prev.limit(resource) if limit else prev.guarantee(resource)


def lowered_to(old: Decimal | None, new: Decimal) -> bool:
    """The write lowers a cap (unlimited counts as the highest; no old value: a CREATE
    or a new queue, judged as set)."""
    if old is None:
        return True
    if new == UNLIMITED:
        return False
    return old == UNLIMITED or new < old


def _below(cap: Decimal, held: Decimal) -> bool:
    return cap != UNLIMITED and effective(cap) < held


def _cap_text(slot: Slot, r: Resource, limit: bool, value: Decimal) -> str:
    field = "limit" if limit else slot.guarantee_field
    unset = " (a limit left out is 0)" if limit and not slot.amounts[r].limit_set else ""
    return f"{r} {field} {describe(r, value)}{unset}"


def _not_evaluated(slot: Slot, r: Resource, limit: bool, old: Decimal, new: Decimal,
                   why: str) -> Finding:
    field = "limit" if limit else slot.guarantee_field
    return warning(slot.field_path(r, field), brief(
        f"{slot.queue}: {r} {field} cut to {describe(r, new)} (was {describe(r, old)}), usage "
        f"not evaluated: {why}"))


def _targets(subject: Subject, obj: dict[str, Any]) -> list[tuple[Slot, Slot | None]]:
    """(slot, its previous version) for every queue the object declares."""
    mine = slots(subject.kind, obj) or ()
    before = old_slots(subject)
    if subject.kind == "Queue":
        return [(s, before[0] if before else None) for s in mine]
    prev = by_pool(before)
    return [(s, prev.get(s.pool)) for s in mine]


def _own_usage(subject: Subject, obj: dict[str, Any], view: ClusterView, limit: bool
               ) -> list[Finding]:
    after = After(view, subject, obj)
    field = "allocated" if limit else "allocatedNonPreemptible"
    findings: list[Finding] = []
    for slot, prev in _targets(subject, obj):
        changed = [r for r in RESOURCES
                   if lowered_to(_was(prev, r, limit),
                                 slot.limit(r) if limit else slot.guarantee(r))]
        if not changed:
            continue
        own = subject if subject.kind == "Queue" else None
        seen = queue_usage(after, slot.queue, field, own, obj if own else None)
        for r in changed:
            cap = slot.limit(r) if limit else slot.guarantee(r)
            old = _was(prev, r, limit)
            if seen.usage is None or r not in seen.usage:
                if old is not None and seen.usage is None and seen.exists and \
                        not _children_reported(after, subject, slot, field):
                    # a parent without a status of its own: kai-usage-children sums its
                    # children's statuses instead
                    findings.append(_not_evaluated(slot, r, limit, old, cap, seen.why))
                continue
            held = seen.usage[r]
            if not _below(cap, held):
                continue
            findings.append(_usage_finding(slot, r, limit, cap, held, old))
    return findings


def _usage_finding(slot: Slot, r: Resource, limit: bool, cap: Decimal, held: Decimal,
                   old: Decimal | None) -> Finding:
    field = "limit" if limit else slot.guarantee_field
    what = "limit" if limit else "guarantee"
    holders = "the queue has allocated" if limit else "non-preemptible workloads hold"
    source = "status.allocated" if limit else "status.allocatedNonPreemptible"
    was = f" (was {describe(r, old)})" if old is not None else ""
    short = (f"{slot.queue}: {r} {field} {describe(r, cap)} < {amount(r, held)} "
             f"{'allocated' if limit else 'non-preemptible'}; {SHORT_CONSEQUENCE}")
    after_text = ("until then the queue gets no more " + r) if limit else \
        "until then other queues cannot reclaim what it holds above it"
    text = (f"{slot.where}: {_cap_text(slot, r, limit, cap)}{was} is below the "
            f"{amount(r, held)} {holders} now ({source} of queue {slot.queue}) - "
            f"{amount(r, held - effective(cap))} over. {CONSEQUENCE.format(what=what).capitalize()}, "
            f"{after_text}. To avoid the wait, lower the {what} in steps as usage falls")
    return Finding("error", "", slot.field_path(r, field), text, brief(short))


@rule("kai-usage-limit", "validate", TREES, Mode.WARN,
      "a queue's limit is not cut below what it has allocated now (KAI Queue status)",
      reads={"Queue", "Department", "Project"}, judges=spec)
def check_usage_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """A limit below the queue's ``status.allocated``: nothing is evicted, the new limit
    applies as workloads finish."""
    if generated_queue(subject, obj, view):
        return []
    with localcontext(EXACT):
        return _own_usage(subject, obj, view, limit=True)


@rule("kai-usage-guarantee", "validate", TREES, Mode.WARN,
      "a guarantee is not cut below what non-preemptible workloads hold now",
      reads={"Queue", "Department", "Project"}, judges=spec)
def check_usage_guarantee(subject: Subject, obj: dict[str, Any], view: ClusterView,
                          policy: Policy) -> list[Finding]:
    """A guarantee (``deserved``, ``quota``) below the queue's
    ``status.allocatedNonPreemptible``: those workloads cannot be reclaimed."""
    if generated_queue(subject, obj, view):
        return []
    with localcontext(EXACT):
        return _own_usage(subject, obj, view, limit=False)


def _children_reported(after: After, subject: Subject, slot: Slot, field: str) -> bool:
    """Some child of this parent has a status: kai-usage-children judges from theirs."""
    if subject.kind == "Project":
        return False
    return any(queue_usage(after, c, field).usage is not None
               for c in _children(after, subject, slot)[1])


def _children(after: After, subject: Subject, slot: Slot) -> tuple[str, list[str]]:
    """(what the children are called, their KAI queue names)."""
    if subject.kind == "Queue":
        return "child queues", sorted({o.get("metadata", {}).get("name", "")
                                       for o in after.by_index(QUEUE_PARENT, slot.queue)} - {""})
    names = [s.queue for o in after.by_index(PROJECT_PARENT, after.name)
             for s in slots("Project", o) or () if s.pool == slot.pool]
    return "projects", sorted(set(names))


@rule("kai-usage-children", "validate", {(g, k) for g, k in TREES if k != "Project"}, Mode.WARN,
      "a parent is not cut below what its children hold now (KAI Queue status)",
      reads={"Queue", "Department", "Project"}, judges=spec)
def check_usage_children(subject: Subject, obj: dict[str, Any], view: ClusterView,
                         policy: Policy) -> list[Finding]:
    """A department queue or parent Queue whose limit is below what its children have
    allocated, or whose guarantee is below their non-preemptible share, summed from the
    children's own statuses. When the parent's own status already shows as much,
    ``kai-usage-limit`` / ``kai-usage-guarantee`` say it and this rule does not repeat it.
    A child without a status counts as unknown: the known ones are a lower bound, which
    is enough to warn, never to say "fits"."""
    if generated_queue(subject, obj, view):
        return []
    with localcontext(EXACT):
        return _children_usage(subject, obj, view)


def _children_usage(subject: Subject, obj: dict[str, Any], view: ClusterView) -> list[Finding]:
    after = After(view, subject, obj)
    findings: list[Finding] = []
    for slot, prev in _targets(subject, obj):
        family: tuple[str, list[str]] | None = None
        for limit in (True, False):
            field = "allocated" if limit else "allocatedNonPreemptible"
            changed = [r for r in RESOURCES
                       if lowered_to(_was(prev, r, limit),
                                     slot.limit(r) if limit else slot.guarantee(r))
                       and (slot.limit(r) if limit else slot.guarantee(r)) != UNLIMITED]
            if not changed:
                continue
            family = family or _children(after, subject, slot)
            label, children = family
            if not children:
                continue
            seen = [queue_usage(after, c, field) for c in children]
            own_sub = subject if subject.kind == "Queue" else None
            own = queue_usage(after, slot.queue, field, own_sub, obj if own_sub else None)
            unknown = [s.queue for s in seen if s.usage is None]
            for r in changed:
                cap = slot.limit(r) if limit else slot.guarantee(r)
                held = sum((s.usage.get(r, ZERO) for s in seen if s.usage is not None), ZERO)
                if not _below(cap, held):
                    continue
                if own.usage is not None and _below(cap, own.usage.get(r, ZERO)):
                    continue  # the parent's own status says it (kai-usage-limit/-guarantee)
                findings.append(_children_finding(slot, r, limit, cap, held, label, seen,
                                                  unknown))
    return findings


def _children_finding(slot: Slot, r: Resource, limit: bool, cap: Decimal, held: Decimal,
                      label: str, seen: list[Seen], unknown: list[str]) -> Finding:
    what = "limit" if limit else "guarantee"
    field = "limit" if limit else slot.guarantee_field
    hold = "have allocated" if limit else "hold non-preemptible"
    ranked = sorted(((s.usage.get(r, ZERO), s.queue) for s in seen if s.usage), reverse=True)
    top = names_list([f"{q} {amount(r, v)}" for v, q in ranked if v > 0])
    more = (f"; {plural(len(unknown), 'child')} not evaluated (no status: "
            f"{names_list(unknown)}), so they hold at least this") if unknown else ""
    short = (f"{slot.queue}: {r} {field} {describe(r, cap)} < {amount(r, held)} held "
             f"{'' if limit else 'non-preemptible '}by {label}; {SHORT_CONSEQUENCE}")
    text = (f"{slot.where}: {_cap_text(slot, r, limit, cap)} is below the {amount(r, held)} its "
            f"{label} {hold} now ({top}){more} - {amount(r, held - effective(cap))} over. "
            f"{CONSEQUENCE.format(what=what).capitalize()}")
    return Finding("error", "", slot.field_path(r, field), text, brief(short))
