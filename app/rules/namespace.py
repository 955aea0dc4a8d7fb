"""Workload rules that read the namespace and the nodes.

Stripping CPU limits is only safe where the namespace lets pods live without them (a
ResourceQuota on ``limits.cpu`` or a LimitRange ``max.cpu`` refuses such pods, and the
ReplicaSet only shows FailedCreate), and a memory envelope is only honest when it fits
somewhere: on a node, and in the namespace's memory budget.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.cluster.view import NODE_LABEL, ClusterView
from app.config import Mode, Policy
from app.envelope import pod_amount
from app.quantity import QuantityError, format_bytes, format_cpu, parse_quantity
from app.rules.base import Finding, Ratchet, Subject, error, rule
from app.rules.workloads import (
    CPU_LIMIT_RULES,
    POD_SPEC_PATHS,
    WORKLOAD_KINDS,
    containers,
    pod_resources,
    pod_spec,
)
from app.util import Memo

__all__ = ["INDEXES", "node_capacity", "replicas_of"]

INDEXES = (NODE_LABEL,)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _has_cpu_limit_to_strip(subject: Subject, obj: dict[str, Any]) -> bool:
    spec = pod_spec(subject, obj) or {}
    holders = [c.get("resources") for _, _, c in containers(subject, obj)]
    holders.append(spec.get("resources"))
    return any(isinstance(r, dict) and "cpu" in (r.get("limits") or {}) for r in holders)


def _guard(subject: Subject, obj: dict[str, Any], reasons: list[str]) -> list[Finding]:
    """Keep CPU limits (warn) or refuse the write (enforce) where the namespace needs
    them. Either way the rule holds back the rules that would strip them."""
    if not reasons or not _has_cpu_limit_to_strip(subject, obj):
        return []
    why = "; ".join(reasons)
    return [error("metadata.namespace",
                  f"{why}: pods without CPU limits would be refused there, and Envelope removes "
                  f"CPU limits; drop limits.cpu from that object or opt this workload out",
                  as_warning=f"CPU limits kept: {why}")]


@rule("quota-needs-cpu-limits", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a ResourceQuota on limits.cpu: keep CPU limits (warn) or refuse (enforce)",
      mutates=False, order=10, reads={"ResourceQuota"}, judges=pod_resources,
      holds_back=CPU_LIMIT_RULES)
def quota_needs_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                           policy: Policy) -> list[Finding]:
    reasons = [f'ResourceQuota "{_name(q)}" sets limits.cpu'
               for q in view.list("ResourceQuota", subject.namespace)
               if "limits.cpu" in ((q.get("spec") or {}).get("hard") or {})]
    return _guard(subject, obj, reasons)


def _container_limits(view: ClusterView, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for lr in view.list("LimitRange", namespace):
        for item in (lr.get("spec") or {}).get("limits") or []:
            if isinstance(item, dict) and item.get("type") == "Container":
                out.append((_name(lr), item))
    return out


@rule("limitrange-needs-cpu-limits", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a LimitRange with max.cpu or maxLimitRequestRatio.cpu: keep CPU limits or refuse",
      mutates=False, order=10, reads={"LimitRange"}, judges=pod_resources,
      holds_back=CPU_LIMIT_RULES)
def limitrange_needs_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                policy: Policy) -> list[Finding]:
    reasons = []
    for name, item in _container_limits(view, subject.namespace):
        for field in ("max", "maxLimitRequestRatio"):
            if "cpu" in (item.get(field) or {}):
                reasons.append(f'LimitRange "{name}" sets {field}.cpu={item[field]["cpu"]}')
    return _guard(subject, obj, reasons)


@rule("limitrange-default-below-request", "validate", WORKLOAD_KINDS, Mode.WARN,
      "a LimitRange default CPU limit below a container's CPU request",
      reads={"LimitRange"}, judges=pod_resources, ratchet=Ratchet.WARN)
def limitrange_default_below_request(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                     policy: Policy) -> list[Finding]:
    """LimitRanger puts ``default.cpu`` on every Pod created without a CPU limit; below the
    request, the Pod is refused and the ReplicaSet shows FailedCreate."""
    if subject.kind == "Pod":
        return []  # Pods reach the webhook after LimitRanger; reinvocation strips its default
    defaults = [(name, item["default"]["cpu"]) for name, item in
                _container_limits(view, subject.namespace)
                if "cpu" in (item.get("default") or {})]
    if not defaults:
        return []
    findings = []
    for label, path, c in containers(subject, obj):
        resources = c.get("resources") or {}
        if "cpu" in (resources.get("limits") or {}):
            continue
        request = (resources.get("requests") or {}).get("cpu")
        if request is None:
            continue
        for name, default in defaults:
            if parse_quantity(request) > parse_quantity(default):
                findings.append(error(
                    f"{path}.resources.requests.cpu",
                    f'{label}: LimitRange "{name}" default cpu limit {default} < request '
                    f"{request}; pods fail without Envelope's Pod webhook"))
    return findings


# --- pod fits a node --------------------------------------------------------------


_capacity: Memo[tuple[int, tuple[tuple[str, str], ...]], dict[str, Any]] = Memo(256)


def _allocatable(node: dict[str, Any], name: str) -> Decimal:
    status = node.get("status") or {}
    value = (status.get("allocatable") or {}).get(name)
    if value is None:
        value = (status.get("capacity") or {}).get(name)
    try:
        return parse_quantity(value) if value is not None else Decimal(0)
    except QuantityError:
        return Decimal(0)


def node_capacity(view: ClusterView, selector: dict[str, str]) -> dict[str, Any]:
    """The largest schedulable node's cpu and memory among nodes matching ``selector``.

    Cached per (Node version, selector): recomputed only when a Node changes in
    a way rules can see (heartbeats do not count), so admission cost does not grow
    with the number of nodes.
    """
    pairs = tuple(sorted(selector.items()))
    key = (view.version("Node"), pairs)
    cached = _capacity.get(key)
    if cached is not None:
        return cached
    if pairs:
        candidates = min((view.by_index(NODE_LABEL, f"{k}={v}") for k, v in pairs), key=len)
    else:
        candidates = view.list("Node")
    best: dict[str, Any] = {"nodes": 0, "cpu": (Decimal(0), ""), "memory": (Decimal(0), "")}
    for node in candidates:
        labels = (node.get("metadata") or {}).get("labels") or {}
        if (node.get("spec") or {}).get("unschedulable") or any(
                labels.get(k) != v for k, v in pairs):
            continue
        best["nodes"] += 1
        for name in ("cpu", "memory"):
            amount = _allocatable(node, name)
            if amount > best[name][0]:
                best[name] = (amount, _name(node))
    return _capacity.put(key, best)


@rule("pod-fits-node", "validate", WORKLOAD_KINDS, Mode.ENFORCE,
      "each pod's CPU and memory fit the largest matching schedulable node",
      reads={"Node"}, judges=pod_resources, ratchet=Ratchet.WARN)
def pod_fits_node(subject: Subject, obj: dict[str, Any], view: ClusterView,
                  policy: Policy) -> list[Finding]:
    spec = pod_spec(subject, obj)
    if spec is None:
        return []
    selector = spec.get("nodeSelector") or {}
    selector = {str(k): str(v) for k, v in selector.items()} if isinstance(selector, dict) else {}
    if view.count("Node") == 0:
        return []  # no nodes known: nothing to judge against
    capacity = node_capacity(view, selector)
    which = f"node matching nodeSelector {selector}" if selector else "schedulable node"
    path = ".".join(POD_SPEC_PATHS[(subject.group, subject.kind)])
    if capacity["nodes"] == 0:
        return [error(path, f"no {which} is known; the pods cannot be placed")] if selector else []
    settings = policy.nodes
    reserves = {"cpu": parse_quantity(settings.reserve_cpu),
                "memory": parse_quantity(settings.reserve_memory)
                + parse_quantity(settings.sandbox_parent_reserve_memory)}
    fmt = {"cpu": format_cpu, "memory": format_bytes}
    findings = []
    for name in ("cpu", "memory"):
        need = pod_amount(spec, name)
        largest, node = capacity[name]
        offer = largest - reserves[name]
        if need > offer:
            findings.append(error(
                path,
                f"each pod needs {fmt[name](need)} {name}; the largest {which} "
                f"({node}) offers {fmt[name](max(offer, Decimal(0)))} "
                f"(allocatable {fmt[name](largest)}, reserve {fmt[name](reserves[name])})"))
    return findings


# --- namespace memory composition -------------------------------------------------

COUNTED_KINDS = ("Deployment", "StatefulSet", "ReplicaSet")
_QUOTA_KEYS = {"requests.memory": "requests", "memory": "requests", "limits.memory": "limits"}


def replicas_of(subject: Subject, obj: dict[str, Any]) -> int:
    """How many pods the object asks for at once."""
    spec = obj.get("spec") or {}
    if subject.kind == "Pod":
        return 1
    if subject.kind == "Job":
        return int(spec.get("parallelism", 1) or 0)
    if subject.kind == "CronJob":
        job = ((spec.get("jobTemplate") or {}).get("spec") or {})
        return int(job.get("parallelism", 1) or 0)
    if subject.kind == "DaemonSet":
        return 0  # one per node: not a replica count the namespace chooses
    value = spec.get("replicas", 1)
    return int(value) if isinstance(value, int) else 1


@rule("namespace-memory-composition", "validate", WORKLOAD_KINDS, Mode.WARN,
      "replicas x pod memory over the namespace's workloads fits its memory quota",
      reads={"ResourceQuota", *COUNTED_KINDS}, judges=pod_resources, ratchet=Ratchet.WARN)
def namespace_memory_composition(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                 policy: Policy) -> list[Finding]:
    quotas = [(q, key, value) for q in view.list("ResourceQuota", subject.namespace)
              for key, value in ((q.get("spec") or {}).get("hard") or {}).items()
              if key in _QUOTA_KEYS]
    if not quotas:
        return []
    rows: list[tuple[str, int, dict[str, Any]]] = []
    for kind in COUNTED_KINDS:
        for w in view.list(kind, subject.namespace):
            if kind == subject.kind and _name(w) == subject.name:
                continue  # the incoming object replaces its old version
            template = ((w.get("spec") or {}).get("template") or {}).get("spec") or {}
            rows.append((_name(w), int((w.get("spec") or {}).get("replicas", 1) or 0), template))
    spec = pod_spec(subject, obj)
    if spec is not None:
        rows.append((subject.name or "(this)", replicas_of(subject, obj), spec))
    findings = []
    for quota, key, hard in quotas:
        section = _QUOTA_KEYS[key]
        parts = [(name, n, pod_amount(t, "memory", section)) for name, n, t in rows if n]
        total = sum((n * m for _, n, m in parts), Decimal(0))
        if total <= parse_quantity(hard):
            continue
        parts.sort(key=lambda p: p[1] * p[2], reverse=True)
        tail = f"total {format_bytes(total)} > quota {_name(quota)} {key} {hard}"
        shown: list[str] = []
        for name, n, m in parts:
            item = f"{name} {n} x {format_bytes(m)} = {format_bytes(n * m)}"
            if len(", ".join([*shown, item, tail])) > 110:
                break
            shown.append(item)
        if len(shown) < len(parts):
            shown.append(f"+{len(parts) - len(shown)} more")
        findings.append(error("metadata.namespace", ", ".join([*shown, tail])))
    return findings

