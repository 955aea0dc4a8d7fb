"""The CPU-limit guards: ``quota-needs-cpu-limits``, ``limitrange-needs-cpu-limits`` and
``limitrange-default-below-request``.

Stripping CPU limits is only safe where the namespace lets pods live without them: a
ResourceQuota on ``limits.cpu`` or a LimitRange ``max.cpu`` refuses such pods, and the
ReplicaSet only shows FailedCreate. The guards keep the limits (warn) or refuse the write
(enforce) and hold back the rules that strip them (docs/rules/, docs/fidelity.md). The
arithmetic of what a namespace needs is ``app/k8s/namespace_policy.py``.
"""

from __future__ import annotations

from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.defaulting import default_pod
from app.k8s.namespace_policy import CpuLimitNeed, cpu_limit_needs, name_of
from app.k8s.podmodel import Admission, admit
from app.k8s.podspec import WORKLOAD_KINDS, containers, pod_resources, pod_spec, well_formed
from app.k8s.quantity import QuantityError, parse_quantity
from app.rules.base import Finding, Ratchet, Subject, error, rule
from app.rules.envelope import move_cpu_limit_to_request, move_pod_level_cpu_limit
from app.rules.workloads.cpu import CPU_LIMIT_RULES, keeps_cpu_limit


def _has_cpu_limit_to_strip(subject: Subject, obj: dict[str, Any]) -> bool:
    spec = pod_spec(subject, obj) or {}
    holders = [c.get("resources") for _, _, c in containers(subject, obj)]
    holders.append(spec.get("resources"))
    return any(isinstance(r, dict) and "cpu" in (r.get("limits") or {}) for r in holders)


def _without_cpu_limits(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod Envelope would let through: API defaults applied (a Pod made from the
    template), every CPU limit removed as the cpu-limits rule removes it."""
    out: dict[str, Any] = default_pod({"spec": spec})["spec"]
    for key in ("containers", "initContainers"):
        for container in out.get(key) or []:
            if isinstance(container, dict) and isinstance(container.get("resources"), dict):
                move_cpu_limit_to_request(container["resources"])
    move_pod_level_cpu_limit(out)
    return out


def _cpu_limit_needs(subject: Subject, obj: dict[str, Any], view: ClusterView,
                     kind: str) -> list[CpuLimitNeed]:
    """app.k8s.namespace_policy.cpu_limit_needs for this workload's pods without CPU
    limits: the LimitRanges (both types, their defaults applied) and the quotas whose
    scopes match the pod (checked against the API server by the admission oracle);
    only the needs of ``kind`` (quotas need the LimitRanges too, for their defaults)."""
    spec = pod_spec(subject, obj)
    if spec is None:
        return []
    limit_ranges = view.list("LimitRange", subject.namespace)
    quotas = view.list("ResourceQuota", subject.namespace) if kind == "ResourceQuota" else []
    if not (quotas if kind == "ResourceQuota" else limit_ranges):
        return []  # nothing of that kind in the namespace: nothing can need the limits
    try:
        stripped = _without_cpu_limits(spec)
        if quotas:
            # The Pods' PriorityClass as the Priority plugin sets it (quota scopes read it;
            # app/k8s/podmodel.py ``admit``); LimitRanger's defaults are cpu_limit_needs', in
            # each order it may apply them.
            stripped = admit(stripped, Admission(priority_classes=view.list("PriorityClass")),
                             limit_ranger=False)[0]
        # A Pod reaches the webhook after LimitRanger's defaults; once stripped, nothing
        # puts them back. A template's Pods get them after the strip.
        needs = cpu_limit_needs(stripped, limit_ranges, quotas,
                                limit_range_defaults=subject.kind != "Pod")
    except QuantityError:
        return []  # the quantities rule names the value that does not parse
    return [n for n in needs if n.kind == kind]


def _guard(subject: Subject, obj: dict[str, Any], policy: Policy, needs: list[CpuLimitNeed]) -> list[Finding]:
    """Keep CPU limits (warn) or refuse the write (enforce) where the namespace needs
    them. Either way the rule holds back the rules that would strip them. A workload
    that opted out keeps its CPU limits anyway: nothing to keep or refuse (class 5)."""
    if not needs or not _has_cpu_limit_to_strip(subject, obj) or keeps_cpu_limit(subject, obj, policy):
        return []
    why = "; ".join(str(n) for n in needs)
    return [error("metadata.namespace",
                  f"{why}: pods without CPU limits would be refused there, and Envelope removes "
                  f'CPU limits; change that object or annotate {policy.opt_out_annotation}: "true"',
                  as_warning=f"CPU limits kept: {why}")]


def _guarded(subject: Subject, obj: dict[str, Any], view: ClusterView, policy: Policy,
             kind: str) -> list[Finding]:
    """A guard on the namespace's ``kind`` objects: the cheap reasons first (no CPU limit
    to strip, or the workload keeps its CPU limits), then what those objects need."""
    if not _has_cpu_limit_to_strip(subject, obj) or keeps_cpu_limit(subject, obj, policy):
        return []
    return _guard(subject, obj, policy, _cpu_limit_needs(subject, obj, view, kind))


@rule("quota-needs-cpu-limits", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a ResourceQuota matching the pod needs CPU limits: keep them (warn) or refuse (enforce)",
      mutates=False, order=10, reads={"ResourceQuota", "LimitRange", "PriorityClass"},
      judges=pod_resources, holds_back=CPU_LIMIT_RULES, requires=well_formed)
def quota_needs_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                           policy: Policy) -> list[Finding]:
    return _guarded(subject, obj, view, policy, "ResourceQuota")


def _container_limits(view: ClusterView, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for lr in view.list("LimitRange", namespace):
        for item in (lr.get("spec") or {}).get("limits") or []:
            if isinstance(item, dict) and item.get("type") == "Container":
                out.append((name_of(lr), item))
    return out


@rule("limitrange-needs-cpu-limits", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a LimitRange (type Container or Pod) needs CPU limits: keep them or refuse",
      mutates=False, order=10, reads={"LimitRange"}, judges=pod_resources,
      holds_back=CPU_LIMIT_RULES, requires=well_formed)
def limitrange_needs_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                policy: Policy) -> list[Finding]:
    return _guarded(subject, obj, view, policy, "LimitRange")


@rule("limitrange-default-below-request", "validate", WORKLOAD_KINDS, Mode.WARN,
      "a LimitRange default CPU limit below a container's CPU request",
      reads={"LimitRange"}, judges=pod_resources, ratchet=Ratchet.WARN, requires=well_formed)
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
