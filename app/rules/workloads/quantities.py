"""``quantities``: pod specs have Kubernetes' shape and their resource quantities parse, so
every other workload rule can read them (docs/rules/quantities.md).
"""

from __future__ import annotations

from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.podspec import WORKLOAD_KINDS, holders, pod_resources, shape_problems
from app.k8s.quantity import QuantityError, parse_quantity
from app.rules.base import Finding, Ratchet, Subject, error, rule


@rule("quantities", "validate", WORKLOAD_KINDS, Mode.ENFORCE,
      "pod specs have Kubernetes' shape and resource quantities parse",
      judges=pod_resources, ratchet=Ratchet.WARN)
def check_resource_quantities(subject: Subject, obj: dict[str, Any], view: ClusterView,
                              policy: Policy) -> list[Finding]:
    """The shape the API server decodes a pod spec into, and quantities that parse (the
    API server refuses both before any webhook, but ``envelope check`` reads raw files
    and anyone who reaches the port can send anything)."""
    problems = shape_problems(subject, obj)
    if problems:
        return [error(path, f"{path}: {why}") for path, why in problems[:5]]
    findings = []
    for holder in holders(subject, obj):
        for section in ("requests", "limits"):
            values = holder.resources.get(section)
            if not isinstance(values, dict):
                continue
            for key, value in values.items():
                try:
                    parse_quantity(value)
                except QuantityError as exc:
                    findings.append(error(f"{holder.path}.{section}.{key}",
                                          f"{holder.label}: {section}.{key}: {exc}"))
    return findings
