"""What a rule is: a pure function from an object (and what it may read) to findings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from app.cluster.view import ClusterView
    from app.config import Mode, Policy

__all__ = ["COPIERS", "RULES", "Finding", "Phase", "Rule", "Subject", "register"]

Severity = Literal["error", "warning", "change"]
Phase = Literal["mutate", "validate"]


@dataclass(frozen=True)
class Finding:
    """One thing a rule says about an object.

    ``error`` denies (in ``enforce`` mode), ``warning`` is shown to the user,
    ``change`` describes a mutation the rule made (the patch carries it).
    """

    severity: Severity
    rule: str
    path: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity, "rule": self.rule, "path": self.path,
                "message": self.message}


@dataclass(frozen=True)
class Subject:
    """The write being judged: the same shape for the webhook and `envelope check`."""

    group: str
    version: str
    kind: str
    operation: str = "CREATE"
    namespace: str = ""
    name: str = ""
    obj: dict[str, Any] | None = None
    old: dict[str, Any] | None = None
    dry_run: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RuleFn = Callable[["Subject", dict[str, Any], "ClusterView", "Policy"], list[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    phase: Phase
    kinds: frozenset[tuple[str, str]]
    """(API group, kind) pairs the rule judges."""
    default_mode: Mode
    fn: RuleFn
    summary: str
    operations: frozenset[str] = frozenset({"CREATE", "UPDATE"})
    mutates: bool = True
    """A mutate-phase rule that only reads (a guard) says False: no copy is made for it."""
    order: int = 100
    """Rules of a phase run in this order (guards that others consult run first)."""
    grandfather: bool = False
    """On UPDATE, an error the old object already had is only a warning: an unrelated
    write (``kubectl rollout restart``, a label) to an object that predates the policy,
    or that a shrunken cluster no longer fits, is not blocked for what it did not change."""
    reads: frozenset[str] = frozenset()
    """Kinds the rule reads from the cluster view; a stale view of them is an
    internal error, answered per the failure mode."""


RULES: dict[str, Rule] = {}

Copier = Callable[["Subject", dict[str, Any]], dict[str, Any]]

#: (API group, kind) -> how to copy an object before mutating rules change it: a family
#: that knows which parts its rules touch copies only those and shares the rest, which
#: also lets the patch diff skip shared parts by identity. Kinds without one get a
#: full copy.
COPIERS: dict[tuple[str, str], Copier] = {}


def register(*rules: Rule) -> None:
    """Add a family's rules to the registry, in the order they should run."""
    for rule in rules:
        if rule.id in RULES:
            raise ValueError(f"rule id {rule.id!r} registered twice")
        RULES[rule.id] = rule
