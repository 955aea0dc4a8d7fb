"""What the engine copies and compares for a workload write: ``COPIERS`` (copy only what
the mutating rules change) and ``UPDATES`` (which parts of an UPDATE the rules judge);
:class:`app.core.ruleset.RuleSet` reads both from the family.
"""

from __future__ import annotations

from typing import Any

from app.k8s.podspec import (
    POD_SPEC_PATHS,
    WORKLOAD_KINDS,
    compared_by_controller,
    held_on_update,
    pod_resources,
    template_part,
)
from app.rules.base import KindUpdates, Subject


def _copy_resources(resources: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in resources.items()}


def _copy_container(container: dict[str, Any]) -> dict[str, Any]:
    out = dict(container)
    if isinstance(out.get("resources"), dict):
        out["resources"] = _copy_resources(out["resources"])
    return out  # env stays shared: the env rule replaces the list it changes


def copy_for_mutation(subject: Subject, obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of what the mutating rules here change — the path to the pod spec, the
    container lists, each container's ``resources`` and the pod-level ``resources`` —
    sharing everything else with ``obj`` (metadata, volumes, probes, ``env``: the env
    rule replaces a list rather than change it).
    The property tests check that ``obj`` is never changed through it."""
    root = dict(obj)
    node = root
    for key in POD_SPEC_PATHS[(subject.group, subject.kind)]:
        child = node.get(key)
        if not isinstance(child, dict):
            return root
        node[key] = node = dict(child)
    for field in ("initContainers", "containers"):
        items = node.get(field)
        if isinstance(items, list):
            node[field] = [_copy_container(c) if isinstance(c, dict) else c for c in items]
    if isinstance(node.get("resources"), dict):
        node["resources"] = _copy_resources(node["resources"])
    return root


COPIERS = dict.fromkeys(WORKLOAD_KINDS, copy_for_mutation)


UPDATES = dict.fromkeys(WORKLOAD_KINDS, KindUpdates(
    mutate_parts={pod_resources: template_part}, held=held_on_update, owned=compared_by_controller))
"""Every workload kind's writes: in the mutate phase the pod template's resources and env
must change for a rule judging ``pod_resources`` to run (``template_part``); the parts
the API server keeps on an UPDATE (``held_on_update``); a Deployment's ReplicaSets left
as their controller wrote them (``compared_by_controller``)."""
