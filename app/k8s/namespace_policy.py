"""Which ResourceQuotas and LimitRanges make the API server refuse a pod without CPU
limits. Pure functions over plain Kubernetes dicts.

Ported from Kubernetes v1.34.12 — quota scopes and constraints, LimitRanger's mutate and
validate steps; the upstream files: docs/fidelity.md, "The ports, file by file" — and
checked by the admission oracle on every e2e version (``e2e/test_oracle_admission.py``),
which creates the CPU-limit-stripped pod on the real kube-apiserver.

Why one module of ~679 lines: quota scopes, LimitRange checks and the orders in which
LimitRanger may apply several LimitRanges decide one answer together (a quota on
``limits.cpu`` sums what the LimitRanges defaulted, in each possible order), and
``tests/serve/test_server_cost.py`` checks the order enumeration against every
permutation. The defaults themselves are ``app/k8s/defaulting.py``.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from app.k8s.defaulting import apply_limit_range_defaults, defaulted_limit_range_item, limit_range_items
from app.k8s.quantity import QuantityError, parse_quantity
from app.k8s.scheduling import clamp_quantity, is_supported_pod_level_resource

__all__ = [
    "CpuLimitNeed",
    "cpu_limit_needs",
    "cpu_limit_needs_in_order",
    "is_best_effort",
    "job_pods_at_once",
    "limit_range_orders",
    "managed_elsewhere",
    "name_of",
    "pods_at_once",
    "quota_hard",
    "quota_matches_pod",
    "quota_scope_key",
    "quota_scope_text",
]

_MAX_MILLI = (2**63 - 1) // 1000


@dataclass(frozen=True)
class CpuLimitNeed:
    """One object that makes the API server refuse the pod once its CPU limits
    are gone: ``kind`` ResourceQuota or LimitRange, its ``name``, and ``reason``
    with the numbers (and, for a quota, its scope)."""

    kind: str
    name: str
    reason: str

    def __str__(self) -> str:
        return f'{self.kind} "{self.name}" {self.reason}'


# --------------------------------------------------------------------- pod facts


def _q(value: object) -> Decimal | None:
    """A quantity, saturated at 10^24 like app.k8s.scheduling's (cheap sums, no overflow)."""
    if isinstance(value, Decimal):
        return clamp_quantity(value)
    try:
        return clamp_quantity(parse_quantity(value))
    except QuantityError:
        return None


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    out: list[Mapping[str, Any]] = []
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        if isinstance(items, list):
            out += [c for c in items if isinstance(c, Mapping)]
    return out


def _rl(container: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    res = container.get("resources")
    rl = res.get(which) if isinstance(res, Mapping) else None
    return rl if isinstance(rl, Mapping) else {}


def _pod_level(spec: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    res = spec.get("resources")
    rl = res.get(which) if isinstance(res, Mapping) else None
    return rl if isinstance(rl, Mapping) else {}


def is_pod_level_resources_set(spec: Mapping[str, Any]) -> bool:
    """component-helpers ``IsPodLevelResourcesSet``: pod-level cpu, memory or
    hugepages in requests or limits."""
    return any(is_supported_pod_level_resource(str(n))
               for which in ("requests", "limits") for n in _pod_level(spec, which))


def is_best_effort(spec: Mapping[str, Any]) -> bool:
    """QoS BestEffort (qos.go ``ComputePodQOS``): no cpu/memory request or limit
    above zero — on the pod level when ``spec.resources`` is set, else on the
    containers and init containers."""
    if isinstance(spec.get("resources"), Mapping):
        lists = [_pod_level(spec, "requests"), _pod_level(spec, "limits")]
    else:
        lists = [_rl(c, w) for c in _containers(spec) for w in ("requests", "limits")]
    for rl in lists:
        for name in ("cpu", "memory"):
            value = _q(rl.get(name)) if name in rl else None
            if value is not None and value > 0:
                return False
    return True


def _is_terminating(spec: Mapping[str, Any]) -> bool:
    deadline = spec.get("activeDeadlineSeconds")
    return isinstance(deadline, int) and not isinstance(deadline, bool) and deadline >= 0


def _cross_namespace_affinity(spec: Mapping[str, Any]) -> bool:
    affinity = spec.get("affinity")
    if not isinstance(affinity, Mapping):
        return False
    for kind in ("podAffinity", "podAntiAffinity"):
        block = affinity.get(kind)
        if not isinstance(block, Mapping):
            continue
        required = block.get("requiredDuringSchedulingIgnoredDuringExecution")
        preferred = block.get("preferredDuringSchedulingIgnoredDuringExecution")
        terms = list(required) if isinstance(required, list) else []
        terms += [w.get("podAffinityTerm") for w in (preferred if isinstance(preferred, list) else [])
                  if isinstance(w, Mapping)]
        for term in terms:
            if not isinstance(term, Mapping):
                continue
            if term.get("namespaces") or term.get("namespaceSelector") is not None:
                return True
    return False


def _scope_selectors(quota: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """quota.go ``getScopeSelectorsFromQuota``: ``scopes`` as Exists, then the
    scopeSelector's expressions. Lists of the wrong type (the API server refuses them;
    ``envelope check`` reads raw files) are read as empty, never a crash."""
    raw = quota.get("spec")
    spec: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    scopes = spec.get("scopes")
    out: list[Mapping[str, Any]] = [{"scopeName": s, "operator": "Exists"}
                                    for s in (scopes if isinstance(scopes, list) else [])]
    selector = spec.get("scopeSelector")
    expressions = selector.get("matchExpressions") if isinstance(selector, Mapping) else None
    if isinstance(expressions, list):
        out += [e for e in expressions if isinstance(e, Mapping)]
    return out


def quota_scope_key(quota: Mapping[str, Any]) -> str:
    """The quota's scopes and scopeSelector as one string: two quotas with the same key
    count the same pods (``quota_matches_pod``), so what is derived per scope can be
    shared between them."""
    return repr([(s.get("scopeName"), s.get("operator"), s.get("values")) for s in _scope_selectors(quota)])


def _scope_matches(selector: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    scope = selector.get("scopeName")
    if scope == "Terminating":
        return _is_terminating(spec)
    if scope == "NotTerminating":
        return not _is_terminating(spec)
    if scope == "BestEffort":
        return is_best_effort(spec)
    if scope == "NotBestEffort":
        return not is_best_effort(spec)
    if scope == "CrossNamespacePodAffinity":
        return _cross_namespace_affinity(spec)
    if scope == "PriorityClass":
        name = str(spec.get("priorityClassName") or "")
        operator = selector.get("operator")
        raw = selector.get("values")
        values = [str(v) for v in raw] if isinstance(raw, list) else []
        if operator == "Exists":
            return name != ""
        if operator == "In":
            return name != "" and name in values
        if operator == "NotIn":
            return name == "" or name not in values
        if operator == "DoesNotExist":
            return name == ""
        return False
    return False


def quota_matches_pod(quota: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Does this ResourceQuota apply to a pod with this spec? (scopes and scopeSelector)."""
    return all(_scope_matches(s, spec) for s in _scope_selectors(quota))


def quota_scope_text(quota: Mapping[str, Any]) -> str:
    """The quota's scope for messages: ``scopes NotBestEffort, PriorityClass In (high)``."""
    parts = []
    for s in _scope_selectors(quota):
        values = s.get("values") or []
        parts.append(f"{s.get('scopeName')}" + ("" if s.get("operator") == "Exists"
                                                else f" {s.get('operator')}" + (f" ({', '.join(values)})"
                                                                                 if values else "")))
    return f"scopes {', '.join(parts)}" if parts else "no scope"


# ------------------------------------------------------- pods a quota charges at once


def _count(value: object, default: int | None) -> int | None:
    """A count as the API server decodes it (an int32; null or absent is the default).
    Anything else — ``parallelism: "x"``, ``replicas: 1.5``, a YAML ``y`` — is the
    default here, never a crash: the API server refuses the object, and ``envelope
    check`` reads raw files. Negative counts (refused too) are 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        return max(value, 0)
    return default


def _finished(status: Mapping[str, Any]) -> bool:
    """A Job with a ``Complete`` or ``Failed`` condition ``True`` runs no more pods."""
    conditions = status.get("conditions")
    return any(isinstance(c, Mapping) and c.get("type") in ("Complete", "Failed")
               and c.get("status") == "True" for c in (conditions if isinstance(conditions, list) else []))


JOB_CONTROLLER = "kubernetes.io/job-controller"
"""``batch/v1`` ``JobControllerName``: the ``spec.managedBy`` of a Job the built-in Job
controller runs (absent means the same)."""


def managed_elsewhere(job_spec: Mapping[str, Any]) -> str | None:
    """The controller named by a Job spec's ``managedBy`` when it is not the built-in
    one (``pkg/controller/job/job_controller.go`` v1.37.2 ``managedByExternalController``;
    JobManagedBy GA and locked on since 1.35:
    the Job controller skips such a Job, so it makes no Pod in this cluster — MultiKueue
    runs them in a worker cluster); None when the Job controller runs it."""
    value = job_spec.get("managedBy")
    return value if isinstance(value, str) and value and value != JOB_CONTROLLER else None


def job_pods_at_once(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> int:
    """How many pods the Job controller keeps running at once for this Job spec
    (``pkg/controller/job/job_controller.go`` ``manageJob``, v1.37.2; the same for
    ``completionMode: Indexed`` and ``NonIndexed``): none for a Job another controller
    manages (:func:`managed_elsewhere`); none while ``suspend`` is true;
    ``parallelism`` (default 1, ``pkg/apis/batch/v1/defaults.go``) without
    ``completions``; else ``min(parallelism, completions - succeeded)``, at least 0.
    ``status.succeeded`` is read when the Job has a status (the cluster's Jobs); a Job
    finished (``Complete``/``Failed``) runs none. Without ``completions``, upstream keeps
    running what runs once one pod succeeded; that is counted as ``parallelism``."""
    status = status or {}
    if spec.get("suspend") is True or _finished(status) or managed_elsewhere(spec):
        return 0
    parallelism = _count(spec.get("parallelism"), 1) or 0
    completions = _count(spec.get("completions"), None)
    if completions is None:
        return parallelism
    succeeded = _count(status.get("succeeded"), 0) or 0
    return max(min(parallelism, completions - succeeded), 0)


def _mapping(obj: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: object = obj
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def pods_at_once(kind: str, obj: Mapping[str, Any]) -> int:
    """How many pods of this workload a ResourceQuota is charged for at once, as its
    controller runs them (the quota counts Pods, ``pods.go`` ``QuotaV1Pod``: a
    Succeeded or Failed Pod is not counted):

    - Pod: 1, none once Succeeded or Failed;
    - Deployment, ReplicaSet, StatefulSet, ReplicationController: ``spec.replicas``
      (default 1). A Deployment's rollout surge (``maxSurge``) is not counted: the steady
      state is;
    - Job: :func:`job_pods_at_once`;
    - CronJob: the pods of one Job made from ``jobTemplate`` (none while the CronJob is
      suspended, nor when the template's ``managedBy`` names another controller).
      ``concurrencyPolicy: Forbid`` and ``Replace`` run one Job at a time
      (``pkg/controller/cronjob/cronjob_controllerv2.go``); ``Allow``, the default, may
      overlap runs — how many depends on the schedule and how long each run takes,
      which no spec says — so one Job is counted: a lower bound;
    - DaemonSet: 0 — one pod per node its selection matches, not a count the namespace
      chooses (not modelled);
    - anything else: 0.

    Wrong types anywhere count as Kubernetes' default (``_count``), never a crash."""
    spec = _mapping(obj, "spec")
    if kind == "Pod":
        return 0 if _mapping(obj, "status").get("phase") in ("Succeeded", "Failed") else 1
    if kind in ("Deployment", "ReplicaSet", "StatefulSet", "ReplicationController"):
        return _count(spec.get("replicas"), 1) or 0
    if kind == "Job":
        return job_pods_at_once(spec, _mapping(obj, "status"))
    if kind == "CronJob":
        return 0 if spec.get("suspend") is True else job_pods_at_once(_mapping(spec, "jobTemplate", "spec"))
    return 0


# -------------------------------------------------------------------- LimitRanges


def _milli(value: Decimal) -> int:
    return int((value * 1000).to_integral_value(rounding=ROUND_CEILING))


def _value(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def _enforced_values(req: Decimal | None, lim: Decimal | None, enforced: Decimal) -> tuple[int, int, int]:
    """admission.go ``requestLimitEnforcedValues``: millis unless one overflows."""
    r, lm = req or Decimal(0), lim or Decimal(0)
    if max(_value(r), _value(lm), _value(enforced)) <= _MAX_MILLI:
        return _milli(r), _milli(lm), _milli(enforced)
    return _value(r), _value(lm), _value(enforced)


def _show(value: object) -> str:
    return str(value)


def _check_cpu(kind: str, item: Mapping[str, Any], requests: Mapping[str, Any],
               limits: Mapping[str, Any], who: str) -> list[str]:
    """min/max/maxLimitRequestRatio on cpu for one container (or the pod)."""
    problems = []
    req_raw, lim_raw = requests.get("cpu"), limits.get("cpu")
    req = _q(req_raw) if "cpu" in requests else None
    lim = _q(lim_raw) if "cpu" in limits else None
    for bound in ("min", "max", "maxLimitRequestRatio"):
        raw = (item.get(bound) or {}).get("cpu")
        enforced = _q(raw) if raw is not None else None
        if enforced is None:
            continue
        r, lm, e = _enforced_values(req, lim, enforced)
        if bound == "min":
            if req is None:
                problems.append(f"type {kind} min cpu {_show(raw)}: {who} has no CPU request")
            elif r < e or (lim is not None and lm < e):
                problems.append(f"type {kind} min cpu {_show(raw)}: {who} asks less")
        elif bound == "max":
            if lim is None:
                problems.append(f"type {kind} max cpu {_show(raw)}: {who} has no CPU limit")
            elif lm > e or (req is not None and r > e):
                problems.append(f"type {kind} max cpu {_show(raw)}: {who} exceeds it")
        else:
            ratio_text = f"type {kind} maxLimitRequestRatio cpu {_show(raw)}"
            if req is None or r == 0:
                problems.append(f"{ratio_text}: {who} has no CPU request")
            elif lim is None or lm == 0:
                problems.append(f"{ratio_text}: {who} has no CPU limit")
            else:
                ratio = Decimal(lm) / Decimal(r)
                allowed = Decimal(_milli(enforced)) / 1000 if _value(enforced) <= _MAX_MILLI \
                    else Decimal(_value(enforced))
                if ratio > allowed:
                    problems.append(f"type {kind} maxLimitRequestRatio cpu {_show(raw)}: {who}'s CPU "
                                    f"limit/request is {ratio:.3f}")
    return problems


def _aggregate(spec: Mapping[str, Any], which: str) -> dict[str, Decimal]:
    """admission.go ``podRequests`` / ``podLimits``: containers + sidecars vs the
    largest init container (+ earlier sidecars); pod-level values override."""
    total: dict[str, Decimal] = {}

    def add(into: dict[str, Decimal], rl: Mapping[str, Any]) -> None:
        for name, raw in rl.items():
            value = _q(raw)
            if value is not None:
                into[name] = into.get(name, Decimal(0)) + value

    for c in spec.get("containers") or []:
        if isinstance(c, Mapping):
            add(total, _rl(c, which))
    sidecars: dict[str, Decimal] = {}
    peak: dict[str, Decimal] = {}
    for c in spec.get("initContainers") or []:
        if not isinstance(c, Mapping):
            continue
        if c.get("restartPolicy") == "Always":
            add(total, _rl(c, which))
            add(sidecars, _rl(c, which))
            use = dict(sidecars)
        else:
            use = {}
            add(use, _rl(c, which))
            for k, v in sidecars.items():
                use[k] = use.get(k, Decimal(0)) + v
        for k, v in use.items():
            if k not in peak or v > peak[k]:
                peak[k] = v
    for k, v in peak.items():
        if k not in total or v > total[k]:
            total[k] = v
    if isinstance(spec.get("resources"), Mapping):
        for name, raw in _pod_level(spec, which).items():
            value = _q(raw)
            if is_supported_pod_level_resource(str(name)) and value is not None:
                total[str(name)] = value
    return total


def limit_range_cpu_problems(spec: Mapping[str, Any], limit_range: Mapping[str, Any],
                             aggregates: list[dict[str, Decimal]] | None = None) -> list[str]:
    """What LimitRanger's validation says about the CPU of this (already
    LimitRanger-defaulted) pod spec, for one LimitRange. ``aggregates``: a list the
    caller keeps for this spec, where the pod's requests and limits are computed
    once for all its LimitRanges (empty at first)."""
    problems: list[str] = []
    for item in limit_range_items(limit_range):
        if not any(isinstance(item.get(b), Mapping) and item[b].get("cpu") is not None
                   for b in ("min", "max", "maxLimitRequestRatio")):
            continue  # no CPU bound: _check_cpu has nothing to say (and reads every container)
        kind = item.get("type")
        if kind == "Container":
            for c in _containers(spec):
                problems += _check_cpu("Container", item, _rl(c, "requests"), _rl(c, "limits"),
                                       f"container {c.get('name')}")
        elif kind == "Pod":
            if aggregates is None:
                aggregates = []
            if not aggregates:
                aggregates += [_aggregate(spec, "requests"), _aggregate(spec, "limits")]
            problems += _check_cpu("Pod", item, aggregates[0], aggregates[1], "the pod")
    return problems


# ------------------------------------------------------------------- the verdict


def quota_hard(quota: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the quota enforces: ``status.hard`` (the admission plugin reads it);
    ``spec.hard`` when no status was written yet."""
    status = quota.get("status")
    hard = status.get("hard") if isinstance(status, Mapping) else None
    if not isinstance(hard, Mapping):
        spec = quota.get("spec")
        hard = spec.get("hard") if isinstance(spec, Mapping) else None
    return hard if isinstance(hard, Mapping) else {}


def _used(quota: Mapping[str, Any], name: str) -> Decimal:
    status = quota.get("status")
    used = status.get("used") if isinstance(status, Mapping) else None
    value = _q(used.get(name)) if isinstance(used, Mapping) and name in used else None
    return value or Decimal(0)


def _first_default_cpu(limit_ranges: Iterable[Mapping[str, Any]]) -> tuple[str, Decimal | None] | None:
    """The LimitRange whose default CPU limit a container gets (the first with one)."""
    for lr in limit_ranges:
        meta = lr.get("metadata") if isinstance(lr.get("metadata"), Mapping) else {}
        for item in limit_range_items(lr):
            if item.get("type") == "Container" and "cpu" in defaulted_limit_range_item(item)["default"]:
                return str(meta.get("name", "")), _q(defaulted_limit_range_item(item)["default"]["cpu"])  # type: ignore[union-attr]
    return None


def name_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return str(meta.get("name", "")) if isinstance(meta, Mapping) else ""


def _sets_defaults(lr: Mapping[str, Any]) -> bool:
    return any(i.get("type") == "Container" and any(defaulted_limit_range_item(i).values())
               for i in limit_range_items(lr))


def _gives(lr: Mapping[str, Any], which: str, name: str) -> bool:
    """Does ``apply_limit_range_defaults`` take ``resources.<which>.<name>`` from this
    LimitRange (for a container without it)?"""
    key = "default" if which == "limits" else "defaultRequest"
    return any(i.get("type") == "Container" and name in defaulted_limit_range_item(i)[key]
               for i in limit_range_items(lr))


def _decisive_keys(quotas: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The defaults whose winner can change a verdict: the CPU limit and request (the
    checks, the quota sums) always; memory only through BestEffort (a ``limits.cpu``
    quota scoped BestEffort or NotBestEffort). No other default is read."""
    keys = [("limits", "cpu"), ("requests", "cpu")]
    if any("limits.cpu" in quota_hard(q) and any(s.get("scopeName") in ("BestEffort", "NotBestEffort")
                                            for s in _scope_selectors(q)) for q in quotas):
        keys += [("limits", "memory"), ("requests", "memory")]
    return keys


def _first_order(n: int, firsts: list[tuple[int, frozenset[int]]]) -> tuple[int, ...] | None:
    """The lexicographically first order of ``range(n)`` in which each ``(w, group)``
    has ``w`` before the rest of ``group``; None when no order does (a cycle). Greedy:
    the smallest index whose predecessors are placed (Kahn with a min-heap)."""
    before: list[set[int]] = [set() for _ in range(n)]
    for w, group in firsts:
        for other in group:
            if other != w:
                before[other].add(w)
    waiting = [len(b) for b in before]
    after: list[list[int]] = [[] for _ in range(n)]
    for i, b in enumerate(before):
        for w in b:
            after[w].append(i)
    ready = [i for i in range(n) if not waiting[i]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            waiting[j] -= 1
            if not waiting[j]:
                heapq.heappush(ready, j)
    return tuple(order) if len(order) == n else None


MAX_LIMIT_RANGE_ORDERS = 32
"""How many distinct outcomes of LimitRanger's defaulting are judged (each is one
evaluation of the LimitRanges and quotas, linear in their number and the containers,
so a review costs at most this many times a linear pass). Ten LimitRanges that all
default the CPU limit have ten outcomes; four that default only the CPU limit and
four only the CPU request have 20. Beyond this bound only the first order is judged
and CPU limits are kept (``cpu_limit_needs``): what LimitRanger would do with the
others is not decided, and keeping the limits is what Kubernetes does anyway."""


def limit_range_orders(limit_ranges: Iterable[Mapping[str, Any]], quotas: Iterable[Mapping[str, Any]] = ()
                       ) -> tuple[list[list[Mapping[str, Any]]], bool]:
    """(orders, complete): the orders LimitRanger may apply these LimitRanges in, one per
    distinct outcome, and whether they are all of them.

    LimitRanger (``plugin/pkg/admission/limitranger/admission.go``) lists them from its
    informer cache, whose order is a Go map's (undefined), and applies each in turn;
    a default fills only what is still missing, so for each resource the *first*
    LimitRange with a default for it wins. What the verdict can depend on is therefore
    which LimitRange wins each decisive default (``_decisive_keys``); an order is
    possible iff each winner comes before the other LimitRanges with that default,
    which is a precedence graph that must be acyclic. This enumerates the winner
    combinations (at most the product of the groups' sizes, pruned as soon as two
    winners require each other first), not the n! orders: for each possible
    combination it returns its lexicographically first order (of the LimitRanges that
    set defaults, then the others), sorted — exactly the orders the full enumeration
    of permutations meets first for each outcome, so ``cpu_limit_needs`` merges the
    same needs in the same order as enumerating every permutation would.

    Bounded by :data:`MAX_LIMIT_RANGE_ORDERS`: beyond it, the first orders (of those
    found, sorted) are returned and ``complete`` is False; ``cpu_limit_needs`` then keeps CPU limits."""
    items = list(limit_ranges)
    flags = [_sets_defaults(lr) for lr in items]
    with_defaults = [lr for lr, f in zip(items, flags, strict=True) if f]
    if len(with_defaults) < 2:
        return [items], True
    others = [lr for lr, f in zip(items, flags, strict=True) if not f]
    n = len(with_defaults)
    groups = []
    for which, name in _decisive_keys(quotas):
        group = frozenset(i for i, lr in enumerate(with_defaults) if _gives(lr, which, name))
        if group:
            groups.append(group)
    found: set[tuple[int, ...]] = set()

    def choose(k: int, chosen: list[tuple[int, frozenset[int]]]) -> None:
        if len(found) > MAX_LIMIT_RANGE_ORDERS:
            return
        if k == len(groups):
            order = _first_order(n, chosen)
            if order is not None:
                found.add(order)
            return
        for w in sorted(groups[k]):
            # Two winners that must each come before the other: no order has them both.
            if any(v != w and w in g and v in groups[k] for v, g in chosen):
                continue
            choose(k + 1, [*chosen, (w, groups[k])])

    choose(0, [])
    if not groups:
        found.add(tuple(range(n)))
    orders = [[with_defaults[i] for i in order] + others
              for order in sorted(found)[:MAX_LIMIT_RANGE_ORDERS]]
    return orders, len(found) <= MAX_LIMIT_RANGE_ORDERS


def cpu_limit_needs(stripped_spec: Mapping[str, Any], limit_ranges: Iterable[Mapping[str, Any]],
                    quotas: Iterable[Mapping[str, Any]], *,
                    limit_range_defaults: bool = True) -> list[CpuLimitNeed]:
    """``cpu_limit_needs_in_order`` over every order LimitRanger may use
    (``limit_range_orders``, one order per distinct outcome), merged: the CPU limits
    are needed when any order refuses the pod.

    ``limit_range_defaults=False`` judges a Pod whose LimitRange defaults were
    applied *before* the webhook stripped its CPU limits (LimitRanger mutates
    ahead of mutating webhooks and is not run again; its validation runs after):
    nothing puts a CPU limit back, so no defaults are applied here."""
    quotas = list(quotas)
    limit_ranges = list(limit_ranges)
    merged: dict[CpuLimitNeed, None] = {}  # ordered, and a membership test in O(1)
    orders, complete = limit_range_orders(limit_ranges, quotas) if limit_range_defaults \
        else ([limit_ranges], True)
    for order in orders if complete else orders[:1]:
        for need in cpu_limit_needs_in_order(stripped_spec, order, quotas,
                                             limit_range_defaults=limit_range_defaults):
            merged.setdefault(need)
    if not complete:  # decided, not guessed: keeping the limits is what Kubernetes does anyway
        why = (f"{len(limit_ranges)} LimitRanges set container defaults that combine in more "
               f"than {MAX_LIMIT_RANGE_ORDERS} ways, too many to judge each")
        merged.setdefault(CpuLimitNeed("LimitRange", name_of(orders[0][0]), f"and the other {why}"))
        for quota in quotas:
            if "limits.cpu" in quota_hard(quota):
                cpu = quota_hard(quota)["limits.cpu"]
                merged.setdefault(CpuLimitNeed("ResourceQuota", name_of(quota),
                                               f"sets limits.cpu={cpu}, and {why}"))
    return list(merged)


def cpu_limit_needs_in_order(stripped_spec: Mapping[str, Any], limit_ranges: Iterable[Mapping[str, Any]],
                             quotas: Iterable[Mapping[str, Any]], *,
                             limit_range_defaults: bool = True) -> list[CpuLimitNeed]:
    """Why the API server would refuse this pod spec — the pod as Envelope lets it
    through, with no CPU limit left — on account of CPU: LimitRanges (both types)
    and the ResourceQuotas that match the pod. Empty: nothing needs the limits.

    Judges a *Pod* spec as the API server has it when admission runs (API
    defaulting done, see app/defaulting.default_pod); LimitRanger's own defaults
    are applied here."""
    limit_ranges = list(limit_ranges)
    spec = apply_limit_range_defaults(stripped_spec, limit_ranges if limit_range_defaults else [])
    needs: list[CpuLimitNeed] = []
    # Once per order, not per LimitRange item and container (each was a scan of them all).
    first = _first_default_cpu(limit_ranges) if limit_range_defaults else None
    aggregates: list[dict[str, Decimal]] = []  # the pod's requests and limits, once
    unlimited = [(c, _q(_rl(c, "requests").get("cpu"))) for c in _containers(stripped_spec)
                 if "cpu" in _rl(c, "requests") and "cpu" not in _rl(c, "limits")] if first else []
    for lr in limit_ranges:
        lr_name = name_of(lr)
        for item in limit_range_items(lr) if first is not None and lr_name == first[0] else []:
            if item.get("type") != "Container" or "cpu" not in defaulted_limit_range_item(item)["default"]:
                continue
            default = _q(defaulted_limit_range_item(item)["default"]["cpu"])
            if default is None or (lr_name, default) != first:
                continue
            for c, request in unlimited:
                # Validation (not LimitRanger) then refuses request > limit.
                if request is not None and request > default:
                    needs.append(CpuLimitNeed(
                        "LimitRange", lr_name,
                        f"default CPU limit {defaulted_limit_range_item(item)['default']['cpu']} is below "
                        f"container {c.get('name')}'s CPU request {_rl(c, 'requests')['cpu']}"))
        for problem in limit_range_cpu_problems(spec, lr, aggregates):
            needs.append(CpuLimitNeed("LimitRange", lr_name, problem))
    pod_level = is_pod_level_resources_set(spec)
    pod_limit_cpu = _aggregate(spec, "limits").get("cpu")
    for quota in quotas:
        hard = quota_hard(quota)
        if "limits.cpu" not in hard or not quota_matches_pod(quota, spec):
            continue
        meta = quota.get("metadata") if isinstance(quota.get("metadata"), Mapping) else {}
        name = str(meta.get("name", ""))  # type: ignore[union-attr]
        scope = quota_scope_text(quota)
        missing = [str(c.get("name")) for c in _containers(spec) if "cpu" not in _rl(c, "limits")]
        if not pod_level and missing:
            needs.append(CpuLimitNeed("ResourceQuota", name,
                                      f"({scope}) sets limits.cpu={hard['limits.cpu']}: every container "
                                      f"needs a CPU limit ({', '.join(sorted(missing))} has none)"))
            continue
        limit = _q(hard["limits.cpu"])
        if pod_limit_cpu is not None and limit is not None \
                and _used(quota, "limits.cpu") + pod_limit_cpu > limit:
            needs.append(CpuLimitNeed("ResourceQuota", name,
                                      f"({scope}) sets limits.cpu={hard['limits.cpu']}: LimitRange "
                                      f"defaults would give the pod CPU limit {pod_limit_cpu}"))
    return needs
