"""`envelope check`'s results, structured: what every output format renders.

A :class:`Report` holds one :class:`ObjectResult` per object of the input: where it is
(file, document, line) and the engine's :class:`~app.core.engine.Evaluation` of it — the
findings, the changes and RFC 6902 patch the mutating webhook would make, internal
errors (records with their rule id) and exemptions — plus the findings made before the
engine ran (strict field validation). :attr:`ObjectResult.findings` and
:attr:`ObjectResult.changes` place each one on its line (:class:`Located`).

The formats are in :mod:`app.render`, one module each, chosen through its registry.
The rules come in as a parameter (any objects with ``.id`` and ``.summary``, optionally
``.kinds``, ``.reads`` and ``.needs``), so the rule registry can change shape freely.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, Protocol

from app.core.engine import Evaluation
from app.core.ruleset import NEEDS, STAND_INS
from app.k8s.kinds import name_of
from app.rules.base import Finding

__all__ = ["NEEDS", "FailOn", "Located", "NotEvaluated", "ObjectResult", "Report", "RuleInfo",
           "not_evaluated"]

FailOn = Literal["error", "warning", "change"]
"""The lowest severity that fails a run; ``change`` (below warning) also fails on any
object the webhook would mutate."""


class RuleInfo(Protocol):
    id: str
    summary: str


@dataclass(frozen=True)
class NotEvaluated:
    rule: str
    missing: tuple[str, ...]
    """Kinds the input lacks."""
    objects: int
    """How many objects in the input the rule would have judged."""

    @property
    def message(self) -> str:
        kinds = " or ".join(self.missing)
        return (f"not evaluated: the input has no {kinds} objects, so {self.rule} could not "
                f"judge {self.objects} object(s); add the {kinds} manifests to evaluate it")


def not_evaluated(rules: Iterable[Any], objects: Iterable[tuple[str, str]],
                  needs: Mapping[str, Collection[str]] = NEEDS,
                  present: Collection[str] = (),
                  stand_ins: Mapping[tuple[str, str], Collection[str]] = STAND_INS,
                  ) -> list[NotEvaluated]:
    """Rules that judge some object of the input but lack a kind they need.

    ``objects`` are the (API group, kind) of every loaded object. A rule's needs are its
    own ``needs`` attribute when it has one, else ``needs[rule.id]``; a rule without a
    ``kinds`` attribute is taken to judge every object. ``present`` adds kinds the rules
    see besides the judged objects (a live cluster's, with ``--kubeconfig``), by view
    name (``app.k8s.kinds``). A needed kind counts as present when one of its ``stand_ins``
    for that rule is (Karpenter NodePools for ``pod-fits-node``'s Nodes).
    """
    seen = Counter(objects)
    present = {kind for _, kind in seen} | {name_of(*key) for key in seen} | set(present)
    out = []
    for rule in rules:
        wanted = tuple(getattr(rule, "needs", None) or needs.get(rule.id, ()))
        missing = tuple(k for k in wanted if k not in present and not any(
            alt in present for alt in stand_ins.get((rule.id, k), ())))
        if not missing:
            continue
        kinds = getattr(rule, "kinds", None)
        judged = sum(n for key, n in seen.items() if kinds is None or key in kinds)
        if judged:
            out.append(NotEvaluated(rule.id, missing, judged))
    return out


@dataclass(frozen=True)
class Located:
    """A finding, change or internal error of one object, placed on its line."""

    severity: str
    """``error``, ``warning`` or ``change``."""
    rule: str
    """The rule's id; ``internal`` for an internal error (whose message starts with the
    id of the rule that could not run), ``fields`` for strict field validation."""
    path: str
    message: str
    line: int

    def as_finding(self) -> dict[str, Any]:
        """As ``check -o json`` writes a finding (docs/schemas/check-output.v1.json)."""
        return {"severity": self.severity, "rule": self.rule, "path": self.path,
                "message": self.message, "line": self.line}

    def as_change(self) -> dict[str, Any]:
        """As ``check -o json`` writes a change."""
        return {"rule": self.rule, "path": self.path, "message": self.message,
                "line": self.line}


QUANTITIES = "quantities"
"""The rule whose error means the API server refuses the object before any webhook."""


@dataclass
class ObjectResult:
    kind: str
    api_version: str
    namespace: str
    name: str
    file: str
    document: int
    line: int
    evaluation: Evaluation = field(default_factory=Evaluation)
    """The engine's result for the object (``engine.check_object``); empty for an object
    refused before the engine (strict field validation)."""
    before: list[Finding] = field(default_factory=list)
    """Findings made before the engine ran: strict field validation's (rule ``fields``)."""
    line_of: Callable[[str], int] | None = None
    """The line of a field path in the object's file (else the object's line)."""

    def _at(self, path: str) -> int:
        return self.line_of(path) if self.line_of is not None and path else self.line

    @cached_property
    def _refused(self) -> bool:
        """A value the API server cannot decode, or a quantity that does not parse: it
        refuses the object before any webhook, so that is all there is to say, and no
        change is proposed to it."""
        return any(f.rule == QUANTITIES and f.severity == "error"
                   for f in self.evaluation.findings)

    @cached_property
    def findings(self) -> list[Located]:
        """Errors and warnings, in order: field validation's, the rules', internal errors."""
        early = [Located(f.severity, f.rule, f.path, f.message, self._at(f.path))
                 for f in self.before]
        judged = [Located(f.severity, f.rule, f.path, f.message, self._at(f.path))
                  for f in self.evaluation.findings]
        if self._refused:
            return early + [f for f in judged if f.rule == QUANTITIES and f.severity == "error"]
        return early + judged + [Located("error", "internal", "", str(e), self.line)
                                 for e in self.evaluation.internal_errors]

    @cached_property
    def changes(self) -> list[Located]:
        """Mutations the webhook would make."""
        if self._refused:
            return []
        return [Located("change", f.rule, f.path, f.message, self._at(f.path))
                for f in self.evaluation.changes]

    @property
    def patch(self) -> list[dict[str, Any]]:
        """The RFC 6902 patch the mutating webhook would answer with."""
        return [] if self._refused else self.evaluation.patch

    @property
    def exempt(self) -> list[dict[str, str]]:
        """Rules not run on the object because a policy exception or annotation exempts
        it: ``rule``, ``reason``."""
        return [{"rule": r, "reason": why} for r, why in self.evaluation.skipped.items()]

    @property
    def title(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


@dataclass
class Report:
    objects: list[ObjectResult]
    rules: list[Any]
    """The rules run (``.id``, ``.summary``): SARIF's rule metadata."""
    not_evaluated: list[NotEvaluated] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of files and directories left out."""
    version: str = "0"

    def count(self, severity: str) -> int:
        return sum(f.severity == severity for o in self.objects for f in o.findings)

    def failed(self, fail_on: FailOn = "error") -> bool:
        return bool(self.count("error") or (fail_on in ("warning", "change") and self.count("warning"))
                    or (fail_on == "change" and self.mutated))

    @property
    def mutated(self) -> int:
        return sum(bool(o.patch) for o in self.objects)

    def summary(self) -> str:
        exempt = sum(len(o.exempt) for o in self.objects)
        return (f"{len(self.objects)} objects: {self.count('error')} errors, "
                f"{self.count('warning')} warnings, {self.mutated} would be mutated"
                + (f", {exempt} rules skipped as exempt" if exempt else ""))

    def skipped_summary(self) -> str:
        if not self.skipped:
            return ""
        reasons = Counter(reason for _, reason in self.skipped)
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        return f"skipped {len(self.skipped)} path(s): {parts}"
