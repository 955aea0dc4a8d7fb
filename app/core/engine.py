"""Runs a rule set over one write: modes, reads, updates and failures are decided here,
once, for every rule.

The same engine serves ``/mutate``, ``/validate`` and ``envelope check``. For each rule
that applies to the subject's kind, phase and operation it skips what need not run
(mode ``off``, an UPDATE that leaves what the rule judges as it was, a guard's
``holds_back``, an object its controller owns), hands the rule a view of the kinds it
declared and nothing else (stale: an internal error in ``enforce``, a warning in
``warn``), ratchets UPDATEs, applies the mode, undoes a change the API server would
refuse on an UPDATE (``KindUpdates.held``) and turns a crash into an
:class:`InternalError` that leaves no half-made patch. Findings made before the engine
ran (``given``) join their rule's own, so its mode and the exemptions apply to them.

Every consumer reads the one result type, :class:`Evaluation`: the webhook's answer
(``app.serve.admission.decide``), ``envelope check``'s reports (``app.render``) and the audit's
PolicyReports (``app.audit``). Each step in order, and the conversions that make
``given``: docs/architecture.md, "A request, from bytes to verdict" and "The admission
boundary and the one result type".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from decimal import DecimalException
from typing import Any

import orjson

from app.cluster.view import ClusterView, ScopedView
from app.core.config import Mode, Policy
from app.core.exemptions import ALL, exemptions, unreached
from app.core.ruleset import RuleSet
from app.k8s.jsonpatch import diff, path_of
from app.k8s.podspec import Held
from app.k8s.quantity import QuantityError
from app.k8s.util import deep_copy, dig, same, undotted
from app.rules.base import Finding, KindUpdates, Part, Phase, Ratchet, Rule, Subject

__all__ = ["Evaluation", "InternalError", "check_object", "evaluate", "json_copy"]

log = logging.getLogger("envelope.engine")


@dataclass(frozen=True)
class InternalError:
    """A rule Envelope could not run on this object: it crashed, or what it reads was not
    current. Answered per ``failureMode`` by the webhook, an ``error`` result in the audit."""

    rule: str
    """The id of the rule that could not run."""
    message: str
    """What happened: ``RuntimeError: boom``, ``cluster view not current (...)``."""

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


@dataclass
class Evaluation:
    findings: list[Finding] = field(default_factory=list)
    """Errors and warnings, after modes were applied."""
    changes: list[Finding] = field(default_factory=list)
    """What enforced mutations did (the patch carries them)."""
    obj: dict[str, Any] | None = None
    """The object after enforced mutations."""
    patch: list[dict[str, Any]] = field(default_factory=list)
    internal_errors: list[InternalError] = field(default_factory=list)
    """Rules that crashed or could not read a current view."""
    skipped: dict[str, str] = field(default_factory=dict)
    """Rules that did not run because the object is exempt from them: id -> why."""
    results: dict[str, str] = field(default_factory=dict)
    """Each applicable rule's result, as Kyverno reports them: ``pass`` (nothing to say,
    or its mutation applied), ``fail`` (an error that denies), ``warn``, ``skip`` (exempt,
    unchanged by an UPDATE, held back, or not the shape it judges), ``error`` (crashed or
    read a stale view)."""

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def rule_ids(self) -> list[str]:
        return sorted({f.rule for f in (*self.findings, *self.changes)})


def json_copy(obj: Any) -> Any:
    """A deep copy of a JSON document, five times faster than ``copy.deepcopy``; one
    nested past what orjson writes (255 levels) is copied by a loop."""
    try:
        return orjson.loads(orjson.dumps(obj))
    except orjson.JSONEncodeError:
        return deep_copy(obj)


def _stamp(rule: Rule, found: list[Finding]) -> list[Finding]:
    """Findings carry the id of the rule that returned them (they are the rule's fresh
    values, so the id is written in place)."""
    for f in found:
        f.rule = rule.id
    return found


def _apply_mode(found: list[Finding], mode: Mode, out: Evaluation, announces: bool = False) -> None:
    for f in found:
        if mode is Mode.ENFORCE:
            (out.changes if f.severity == "change" else out.findings).append(f)
            if announces and f.severity == "change":
                out.findings.append(Finding("warning", f.rule, f.path, f.message))
        elif f.severity == "change":
            out.findings.append(Finding("warning", f.rule, f.path,
                                        f"not applied ({f.rule} in warn mode): {f.message}"))
        else:
            out.findings.append(Finding("warning", f.rule, f.path, f.as_warning or f.message))


def _part(rule: Rule, phase: Phase, kind: KindUpdates | None) -> Part | None:
    """What an UPDATE must change for the rule to run: ``Rule.judges``, or in the mutate
    phase what the kind's family maps it to (``KindUpdates.mutate_parts``: a workload's
    pod template resources and env, so a patch never rewrites what the UPDATE left as
    stored — on a Deployment a rollout nobody asked for, on a Job a refused UPDATE)."""
    if phase == "mutate" and kind is not None and rule.judges is not None:
        return kind.mutate_parts.get(rule.judges, rule.judges)
    return rule.judges


def _unchanged(rule: Rule, subject: Subject, obj: dict[str, Any] | None,
               phase: Phase = "validate", kind: KindUpdates | None = None) -> bool:
    """An UPDATE that leaves what the rule judges as it was. Compared at any depth;
    when the judged part cannot even be taken (a ``judges`` that recurses, or fails),
    it counts as changed: the rule runs, inside its own isolation, and answers."""
    part = _part(rule, phase, kind)
    if part is None or subject.operation != "UPDATE" or not isinstance(subject.old, dict):
        return False
    try:
        after = part(subject, obj or {})
        return after is not None and same(after, part(subject, subject.old))
    except RecursionError:  # nested deeper than any Kubernetes object: judge it
        return False
    except Exception:  # a bug in a judges function: judge the update rather than fail it
        log.exception("rule %s: could not take the judged part", rule.id)
        return False


def _ratchet(rule: Rule, subject: Subject, found: list[Finding], view: ClusterView,
             policy: Policy) -> list[Finding]:
    """On UPDATE, what the old object already had: a warning or nothing (``Rule.ratchet``)."""
    if not any(f.severity == "error" for f in found):
        return found
    before = Subject(subject.group, subject.version, subject.kind, "CREATE", subject.namespace,
                     subject.name, subject.old, None, subject.dry_run)
    try:
        had = {(f.severity, f.path, f.message)
               for f in rule.fn(before, subject.old or {}, view, policy)}
    except Exception:  # the old object is judged only to forgive; never fail on it
        return found
    if rule.ratchet is Ratchet.DROP:
        return [f for f in found if (f.severity, f.path, f.message) not in had]
    return [Finding("warning", f.rule, f.path, f"already so before this update: {f.message}")
            if f.severity == "error" and (f.severity, f.path, f.message) in had else f
            for f in found]


def evaluate(rules: RuleSet, subject: Subject, view: ClusterView, policy: Policy,  # noqa: C901, PLR0915
             phase: Phase, given: Sequence[Finding] = ()) -> Evaluation:
    """Run the ``phase`` rules of ``rules`` for the subject's kind and operation.
    ``given``: findings a conversion of the input made for a rule (stamped with its id),
    added to what that rule finds when it runs (see the module's docstring).

    Why one function of ~121 lines: one pass over the rules in order, every step of the
    module docstring inline: it is the hot path of every review (a helper call per rule
    per step was measured slower)."""
    out = Evaluation(obj=subject.obj)
    applicable = rules.applicable(subject.group, subject.kind, phase, subject.operation, policy)
    if not applicable:
        return out
    original = subject.obj
    working, copied = original, False
    held: set[str] = set()
    update = subject.operation == "UPDATE"
    exempt = exemptions(subject, view, policy) if policy.exceptions or policy.allow_object_exemptions \
        or policy.delegated_exceptions is not None else {}
    if exempt and phase == "validate":
        out.findings.extend(unreached(subject, policy))
    gates: dict[object, bool] = {}
    results = out.results
    kind = rules.updates.get((subject.group, subject.kind))
    owned = kind.owned(subject, original) if kind is not None and kind.owned else None
    kept = kind.held(subject, original, subject.old, subject.subresource) \
        if kind is not None and kind.held and update and phase == "mutate" and original is not None \
        else None
    for rule, mode in applicable:
        if (held and rule.id in held) or (update and _unchanged(rule, subject, original, phase, kind)):
            results[rule.id] = "skip"
            continue
        if owned is not None:
            out.skipped[rule.id] = owned
            results[rule.id] = "skip"
            continue
        if rule.requires is not None:
            ok = gates.get(rule.requires)
            if ok is None:
                ok = gates[rule.requires] = rule.requires(subject, original or {})
            if not ok:
                results[rule.id] = "skip"
                continue
        if rule.where is not None and not rule.where(subject, view, policy):
            results[rule.id] = "skip"
            continue
        if exempt:
            why = exempt.get(rule.id) or exempt.get(ALL)
            if why is not None:
                out.skipped[rule.id] = why
                results[rule.id] = "skip"
                continue
        if rule.reads:
            stale = view.problems(rule.reads)
            if stale:
                text = f"cluster view not current ({', '.join(stale)})"
                if mode is Mode.ENFORCE:
                    out.internal_errors.append(InternalError(rule.id, text))
                else:
                    out.findings.append(Finding("warning", rule.id, "", f"not evaluated: {text}"))
                results[rule.id] = "error"
                continue
        target = working
        if phase == "mutate" and rule.mutates and original is not None:
            copier = rules.copiers.get((subject.group, subject.kind))
            if mode is not Mode.ENFORCE:  # warn: run on a scratch copy, then drop it
                current = working if working is not None else original
                target = copier(subject, current) if copier else json_copy(current)
            elif not copied:
                working = target = copier(subject, original) if copier else json_copy(original)
                copied = True
        scoped = ScopedView(view, rule.reads, rule.id) if rule.reads else rules.blind(rule)
        before = json_copy(target) if kept is not None and rule.mutates and target is not None \
            else None
        try:
            found = rule.fn(subject, target if target is not None else {}, scoped, policy)
            if kept is not None and before is not None and target is not None:
                found, reverted = _keep_held(kept, before, target, found)
                if reverted and target is working:
                    working = target = before
            if found and rule.ratchet is not Ratchet.NONE and subject.operation == "UPDATE" \
                    and isinstance(subject.old, dict):
                found = _ratchet(rule, subject, found, scoped, policy)
        except QuantityError as exc:
            found = [Finding("error", rule.id, "", str(exc))]
        except RecursionError:  # nested deeper than any Kubernetes object (orjson takes 1,024)
            found = [Finding("error", rule.id, "", "the object nests deeper than a Kubernetes "
                                                   "object can; it cannot be judged")]
        except DecimalException as exc:  # a valid quantity beyond what can be compared
            found = [Finding("error", rule.id, "", f"a quantity is too large or too precise to "
                                                   f"compare ({type(exc).__name__}); use a value "
                                                   f"a node could hold")]
        except Exception as exc:  # a bug in a rule must not become a 500
            log.exception("rule %s failed", rule.id)
            out.internal_errors.append(InternalError(rule.id, f"{type(exc).__name__}: {exc}"))
            results[rule.id] = "error"
            if target is working and copied:
                # It may have half-changed the object: patch nothing at all, and let
                # the failure mode decide (allow then means "unmodified", like Ignore).
                working, copied = original, False
                break
            continue
        if given:
            found = [replace(f) for f in given if f.rule == rule.id] + found
        if found:
            found = _stamp(rule, found)
            if rule.holds_back and any(f.severity != "change" for f in found):
                held |= rule.holds_back
            _apply_mode(found, mode, out, rule.announces)
            severities = {f.severity for f in found}
            results[rule.id] = ("fail" if "error" in severities and mode is Mode.ENFORCE
                                else "warn" if severities - {"change"} or mode is not Mode.ENFORCE
                                else "pass")
        else:
            results[rule.id] = "pass"
    if copied and working is not None and out.changes and policy.mutations_annotation and (
            subject.kind != "Pod" or policy.annotate_pods):
        working = _annotated(working, out.changes, policy.mutations_annotation)
    out.obj = working
    if copied:
        out.patch = diff(original, working)
    return out


def _keep_held(kept: Held, before: dict[str, Any], after: dict[str, Any],
               found: list[Finding]) -> tuple[list[Finding], bool]:
    """A mutating rule's findings on an UPDATE where the API server keeps part of the
    object as stored (``KindUpdates.held``): when its changes reach that part,
    they are undone (the caller restores ``before``) — a Job's template, a resize's
    env — and said as warnings (``Held.why``), or dropped silently when the API server
    would have dropped them itself. Returns the findings and whether to undo."""
    if not any(not kept.allows(path_of(op["path"])) for op in diff(before, after)):
        return found, False
    if kept.why is None:
        return [f for f in found if f.severity != "change"], True
    return [Finding("warning", f.rule, f.path, f"not applied: {kept.why}: {f.message}")
            if f.severity == "change" else f for f in found], True


def _where(change: Finding, obj: dict[str, Any]) -> str:
    """A container's name for a change inside it, else the changed field's path."""
    parts = undotted(change.path)
    for i, part in enumerate(parts):
        if part in ("containers", "initContainers") and i + 1 < len(parts) and \
                isinstance(parts[i + 1], int):
            name = dig(obj, (*parts[:i + 2], "name"))
            return name if isinstance(name, str) else f"{part}[{parts[i + 1]}]"
    return "pod" if change.path.endswith((".resources.limits.cpu", ".resources.limits.memory",
                                          ".resources.requests.memory")) \
        else change.path


def _annotated(obj: dict[str, Any], changes: list[Finding], key: str) -> dict[str, Any]:
    """``obj`` (a copy the engine owns, whose metadata may be shared with the admitted
    object) with ``key`` naming what the mutations changed, so ``kubectl get -o yaml``
    explains the difference from the manifest: ``cpu-limits:app,sidecar;memory-limit:app``."""
    by_rule: dict[str, list[str]] = {}
    for change in changes:
        places = by_rule.setdefault(change.rule, [])
        where = _where(change, obj)
        if where not in places:
            places.append(where)
    value = ";".join(f"{rule}:{','.join(places)}" for rule, places in by_rule.items())
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return obj
    annotations = meta.get("annotations")
    if annotations is not None and not isinstance(annotations, dict):
        return obj
    return {**obj, "metadata": {**meta, "annotations": {**(annotations or {}), key: value}}}


def check_object(rules: RuleSet, subject: Subject, view: ClusterView, policy: Policy,
                 given: Sequence[Finding] = ()) -> Evaluation:
    """What the webhook pair would answer: mutate, then validate the mutated object."""
    mutated = evaluate(rules, subject, view, policy, "mutate", given)
    after = replace(subject, obj=mutated.obj)
    validated = evaluate(rules, after, view, policy, "validate", given)
    return Evaluation(
        findings=mutated.findings + validated.findings,
        changes=mutated.changes,
        obj=mutated.obj,
        patch=mutated.patch,
        internal_errors=mutated.internal_errors + validated.internal_errors,
        skipped={**mutated.skipped, **validated.skipped},
        results={**mutated.results, **validated.results},
    )
