"""The rule set: every rule Envelope runs, built once at start and passed to whatever
judges (the webhook, ``envelope check``) and to policy loading.

A family module (``app/rules/*.py``) declares its rules with :func:`app.rules.base.rule`,
and may declare ``COPIERS`` (how to copy its kinds before mutating rules change them),
``UPDATES`` (what an UPDATE of its kinds holds or leaves alone: ``KindUpdates``) and
``INDEXES`` (lookups its rules need from the view). :func:`default_ruleset`
collects the four families; tests build smaller sets from the same declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from types import ModuleType
from typing import Any

from app.cluster.view import Index, ScopedView, StaticView
from app.core.config import Mode, Policy, capped
from app.k8s.kinds import KARPENTER_NODEPOOL
from app.rules import actors, exceptions, namespace, workloads
from app.rules.base import KindUpdates, Phase, Rule, Subject, rules_of
from app.rules.quotas import objects as quota_objects
from app.rules.quotas import rules as quotas
from app.rules.quotas import usage as quota_usage

__all__ = ["NEEDS", "STAND_INS", "Copier", "RuleSet", "default_ruleset"]

Copier = Callable[[Subject, dict[str, Any]], dict[str, Any]]

NEEDS: dict[str, tuple[str, ...]] = {
    "pod-fits-node": ("Node",),
    "limitrange-needs-cpu-limits": ("LimitRange",),
    "limitrange-default-below-request": ("LimitRange",),
    "quota-needs-cpu-limits": ("ResourceQuota",),
    "namespace-memory-composition": ("ResourceQuota",),
    "kai-pool-capacity": ("NodePool", "Node"),
    "actor-placement": ("WorkerPool",),
    "kai-usage-limit": ("Queue",),
    "kai-usage-guarantee": ("Queue",),
    "kai-usage-children": ("Queue",),
}
"""Kinds without which a rule has nothing to judge against and passes silently, so the
result would be a silent "fine" (``envelope check`` says "not evaluated"; the rule pages
say so). A rule may declare its own (``Rule.needs``); this table is the fallback for rules
that do not. All listed kinds must be present."""

STAND_INS: dict[tuple[str, str], tuple[str, ...]] = {
    ("pod-fits-node", "Node"): (KARPENTER_NODEPOOL,),
}
"""Kinds that stand in for a needed kind of one rule: ``pod-fits-node`` judges a pod
against the Nodes Karpenter can create when the input has Karpenter NodePools and no
Nodes (issue 37: it said "no Node objects" for pods it had just judged)."""


class RuleSet(Mapping[str, Rule]):
    """Rules by id (a read-only mapping), by (group, kind, phase) in run order, and
    what they read."""

    def __init__(self, rules: Iterable[Rule], copiers: Mapping[tuple[str, str], Copier] | None = None,
                 indexes: Iterable[Index] = (),
                 updates: Mapping[tuple[str, str], KindUpdates] | None = None) -> None:
        self.rules: dict[str, Rule] = {}
        for r in rules:
            if r.id in self.rules:
                raise ValueError(f"rule id {r.id!r} declared twice")
            self.rules[r.id] = r
        self.copiers: dict[tuple[str, str], Copier] = dict(copiers or {})
        self.indexes: tuple[Index, ...] = tuple(dict.fromkeys(indexes))
        self.updates: dict[tuple[str, str], KindUpdates] = dict(updates or {})
        self._by_kind: dict[tuple[str, str, str], list[Rule]] = {}
        self._modes: dict[int, tuple[Policy, dict[str, Mode]]] = {}
        self._applicable: dict[tuple[str, str, str, str, int], list[tuple[Rule, Mode]]] = {}
        self._blind = {r.id: ScopedView(StaticView(), frozenset(), r.id) for r in self.rules.values()}

    @classmethod
    def from_modules(cls, *modules: ModuleType) -> RuleSet:
        rules: list[Rule] = []
        copiers: dict[tuple[str, str], Copier] = {}
        indexes: list[Index] = []
        updates: dict[tuple[str, str], KindUpdates] = {}
        for module in modules:
            rules.extend(rules_of(vars(module)))
            copiers.update(getattr(module, "COPIERS", {}))
            indexes.extend(getattr(module, "INDEXES", ()))
            updates.update(getattr(module, "UPDATES", {}))
        return cls(rules, copiers, indexes, updates)

    def __iter__(self) -> Iterator[str]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __getitem__(self, rule_id: str) -> Rule:
        return self.rules[rule_id]

    @property
    def reads(self) -> frozenset[str]:
        """Every kind some rule reads: what the live view must watch."""
        return frozenset(k for r in self.rules.values() for k in r.reads)

    @property
    def kinds(self) -> frozenset[tuple[str, str]]:
        """Every (group, kind) some rule judges."""
        return frozenset(k for r in self.rules.values() for k in r.kinds)

    def for_kind(self, group: str, kind: str, phase: Phase) -> list[Rule]:
        key = (group, kind, phase)
        found = self._by_kind.get(key)
        if found is None:
            found = sorted((r for r in self.rules.values()
                            if r.phase == phase and (group, kind) in r.kinds), key=lambda r: r.order)
            self._by_kind[key] = found
        return found

    def applicable(self, group: str, kind: str, phase: Phase, operation: str,
                   policy: Policy) -> list[tuple[Rule, Mode]]:
        """The rules to run, in order, with their modes (``off`` left out): asked on every
        request, computed once per (kind, phase, operation, policy)."""
        modes = self.modes(policy)  # keeps the policy alive while its id is a key below
        key = (group, kind, phase, operation, id(policy))
        found = self._applicable.get(key)
        if found is None:
            found = [(r, modes[r.id]) for r in self.for_kind(group, kind, phase)
                     if operation in r.operations and modes[r.id] is not Mode.OFF]
            if len(self._applicable) >= 512:
                self._applicable.clear()
            self._applicable[key] = found
        return found

    def blind(self, rule: Rule) -> ScopedView:
        """The view handed to a rule that declares no reads: any read raises."""
        return self._blind[rule.id]

    def modes(self, policy: Policy) -> dict[str, Mode]:
        """Every rule's mode under ``policy``, computed once per policy: the engine asks
        for it on every request."""
        found = self._modes.get(id(policy))
        if found is not None and found[0] is policy:
            return found[1]
        modes = {rid: policy.rules.get(rid, capped(r.default_mode, policy.default_mode))
                 for rid, r in self.rules.items()}
        if len(self._modes) >= 8:
            self._modes.clear()
            self._applicable.clear()
        self._modes[id(policy)] = (policy, modes)  # the policy is kept: its id stays unique
        return modes

    def unknown(self, rule_ids: Iterable[str]) -> list[str]:
        return sorted(set(rule_ids) - set(self.rules))

    def env_names(self) -> dict[str, str]:
        """``ENVELOPE_RULE_<ID>`` -> rule id, for environment overrides."""
        return {"ENVELOPE_RULE_" + rid.upper().replace("-", "_"): rid for rid in self.rules}


def default_ruleset() -> RuleSet:
    """Every rule Envelope ships: workloads, namespace-aware workload rules, KAI quota
    trees, actor sandboxes, delegated exceptions."""
    return RuleSet.from_modules(workloads, namespace, quota_objects, quotas, quota_usage, actors,
                                exceptions)
