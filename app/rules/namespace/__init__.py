"""Workload rules that read the namespace and the nodes, one module per family:
``cpu_limits`` (the guards that keep CPU limits where the namespace needs them),
``pod_fits`` with ``node_groups`` (each pod fits a node) and ``memory`` (the namespace's
memory quota). Their rule pages are docs/rules/; the arithmetic they read is
``app/k8s/namespace_policy.py`` and ``app/k8s/scheduling.py``.

The package is what :func:`app.core.ruleset.default_ruleset` collects: its rules, in the
order they are bound below (the rule set's order, :func:`app.rules.base.rules_of`), and
``INDEXES``, the view lookups they need.
"""

from __future__ import annotations

from app.cluster.view import NODE_LABEL, Index
from app.rules.namespace import cpu_limits, memory, node_groups, pod_fits

__all__ = ["INDEXES", "limitrange_default_below_request", "limitrange_needs_cpu_limits",
           "namespace_memory_composition", "pod_fits_node", "quota_needs_cpu_limits"]

quota_needs_cpu_limits = cpu_limits.quota_needs_cpu_limits
limitrange_needs_cpu_limits = cpu_limits.limitrange_needs_cpu_limits
limitrange_default_below_request = cpu_limits.limitrange_default_below_request
pod_fits_node = pod_fits.pod_fits_node
namespace_memory_composition = memory.namespace_memory_composition

INDEXES: tuple[Index, ...] = (NODE_LABEL, node_groups.NODE_CLASS, node_groups.SLICE_SPEC,
                              node_groups.CLAIM_DEVICES)
