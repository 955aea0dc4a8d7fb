"""``envelope audit``: judge what already runs, and write PolicyReports.

An audit reads, once, every kind the rules read (trimmed as the webhook's live view
trims them, into a :class:`~app.cluster.view.Store` with the rule set's indexes), then
lists every kind the rules judge, page by page, and judges each object as it stands:
a CREATE through :class:`app.core.frontdoor.FrontDoor`, the same door ``envelope check``
uses, so a result is exactly what the webhook pair would answer if the object were
written again today. Nothing is written to the objects: a mutation the webhook would
make is reported as a ``warn`` result carrying the RFC 6902 patch in its properties.
Objects a judged controller owns are counted as ``owned`` and skipped (``include_owned``
judges them too); results follow the policy's modes.

Which objects are skipped, and what each result (``pass``, ``fail``, ``warn``,
``error``, ``skip``) means: docs/audit.md, "``envelope audit``" and "What a result
means". The reports these results make are :mod:`app.audit.reports`; the continuous
audit (``audit --watch``) is :mod:`app.audit.watch`, its gauges :mod:`app.audit.metrics`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from app.cluster.kube import ApiError, KubeClient, pages
from app.cluster.live import resources_for
from app.cluster.view import Store
from app.core.config import Policy
from app.core.exemptions import watched_for
from app.core.frontdoor import FrontDoor
from app.core.ruleset import RuleSet
from app.k8s.kinds import KINDS, Kind

AUDIT_SCHEMA = "audit/v1"
"""``schemaVersion`` of ``audit -o json`` (docs/schemas/audit-output.v1.json)."""

Outcome = Literal["pass", "fail", "warn", "error", "skip"]
OUTCOMES: tuple[Outcome, ...] = ("pass", "fail", "warn", "error", "skip")


Judged = Kind
"""A kind the rules judge, and where to list it (``app.k8s.kinds.Kind``)."""

JUDGED: tuple[Kind, ...] = KINDS
"""Every kind with a list path; :func:`judged_for` picks those a rule set judges."""

#: Controllers whose objects are skipped as ``owned``: (owner kind, owned kind).
OWNERS: frozenset[tuple[str, str]] = frozenset({
    ("ReplicaSet", "Pod"), ("ReplicationController", "Pod"), ("StatefulSet", "Pod"),
    ("DaemonSet", "Pod"), ("Job", "Pod"), ("Deployment", "ReplicaSet"), ("CronJob", "Job"),
})


def judged_for(rules: RuleSet) -> tuple[Judged, ...]:
    """What to list for ``rules``: every kind they judge (a kind with no entry in
    :data:`JUDGED` is a programming error, said at start)."""
    wanted = rules.kinds
    missing = wanted - {j.ref for j in JUDGED}
    if missing:
        raise ValueError(f"no list path for judged kind(s) {sorted(missing)}; add them to "
                         f"KINDS in app/k8s/kinds.py")
    return tuple(j for j in JUDGED if j.ref in wanted)


@dataclass(frozen=True, slots=True)
class Result:
    """One rule's result on one object."""

    rule: str
    result: Outcome
    message: str
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    properties: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "result": self.result, "message": self.message,
                "apiVersion": self.api_version, "kind": self.kind,
                "namespace": self.namespace, "name": self.name,
                "properties": dict(self.properties)}


@dataclass
class Audit:
    """What one audit found."""

    results: list[Result] = field(default_factory=list)
    """Everything but passes."""
    passes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(namespace, rule) -> objects that passed."""
    namespaces: set[str] = field(default_factory=set)
    """Every namespace with at least one judged object ("" for cluster scope)."""
    objects: int = 0
    owned: int = 0
    absent: list[str] = field(default_factory=list)
    """Optional kinds whose CRD is not installed."""
    started: float = 0.0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """``audit -o json`` (schema ``AUDIT_SCHEMA``)."""
        counts = [{"namespace": ns, "rule": rule_id, "result": res, "count": n}
                  for (ns, rule_id, res), n in sorted(self.counts().items())]
        return {"schemaVersion": AUDIT_SCHEMA, "objects": self.objects, "owned": self.owned,
                "absent": self.absent, "seconds": round(self.seconds, 3), "summary": counts,
                "results": [r.as_dict() for r in self.results]}

    def counts(self) -> Counter[tuple[str, str, str]]:
        """(namespace, rule, result) -> results, passes included."""
        out: Counter[tuple[str, str, str]] = Counter()
        for (ns, rule_id), n in self.passes.items():
            out[(ns, rule_id, "pass")] += n
        for r in self.results:
            out[(r.namespace, r.rule, r.result)] += 1
        return out


def _text(path: str, message: str) -> str:
    return f"{path}: {message}" if path else message


def judge(rules: RuleSet, view: Any, policy: Policy, obj: dict[str, Any], judged: Judged,
          out: Audit) -> None:
    """Judge one object as it stands (a CREATE of itself) and add its results to ``out``."""
    meta = obj.get("metadata") or {}
    found = FrontDoor(rules, view, policy, namespace=None).judge(obj, kind=judged)
    evaluation, subject = found.evaluation, found.subject
    namespace, name = subject.namespace, subject.name
    ref = (judged.api_version, judged.kind, namespace, name, str(meta.get("uid") or ""))
    out.objects += 1
    out.namespaces.add(namespace)
    modes = rules.modes(policy)
    reported: set[str] = set()
    patch = orjson.dumps(evaluation.patch).decode() if evaluation.patch else ""
    for f in evaluation.findings:
        outcome: Outcome = "fail" if f.severity == "error" else "warn"
        props = [("mode", modes[f.rule].value)]
        if f.path:
            props.append(("path", f.path))
        out.results.append(Result(f.rule, outcome, _text(f.path, f.message), *ref,
                                  properties=tuple(props)))
        reported.add(f.rule)
    for f in evaluation.changes:
        props = [("mode", modes[f.rule].value), ("change", "the mutating webhook would make "
                                                 "this change on the object's next write")]
        if f.path:
            props.append(("path", f.path))
        if patch:
            props.append(("patch", patch))
        out.results.append(Result(f.rule, "warn", _text(f.path, f"would change: {f.message}"),
                                  *ref, properties=tuple(props)))
        reported.add(f.rule)
    for problem in evaluation.internal_errors:
        rule_id = problem.rule if problem.rule in rules else "internal"
        out.results.append(Result(rule_id, "error", problem.message, *ref,
                                  properties=(("mode", modes[rule_id].value
                                               if rule_id in modes else ""),)))
        reported.add(rule_id)
    for rule_id, why in evaluation.skipped.items():
        if rule_id not in reported:
            out.results.append(Result(rule_id, "skip", f"exempt: {why}", *ref,
                                      properties=(("mode", modes[rule_id].value),)))
            reported.add(rule_id)
    for phase in ("mutate", "validate"):
        for r, _ in rules.applicable(judged.group, judged.kind, phase, "CREATE", policy):
            if r.id in reported or (r.requires is not None and not r.requires(subject, obj)):
                continue  # reported, or does not apply to this object (as the engine gates)
            out.passes[(namespace, r.id)] += 1
            reported.add(r.id)


def _owned(obj: dict[str, Any], kind: str) -> bool:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") and (ref.get("kind"), kind) in OWNERS:
            return True
    return False


def _pages(client: KubeClient, path: str, page_size: int) -> Iterator[list[dict[str, Any]]]:
    """The items of each page (``app.cluster.kube.pages``)."""
    for body in pages(client, path, page_size, 60):
        yield body.get("items") or []


def read_kinds(rules: RuleSet, policy: Policy) -> frozenset[str]:
    """What the audit's view must hold: what the rules read, Namespaces when the
    policy's exceptions select namespaces by label, EnvelopeExceptions when it delegates."""
    return rules.reads | watched_for(policy)


def load_view(client: KubeClient, rules: RuleSet, policy: Policy,
              page_size: int = 500) -> tuple[Store, list[str]]:
    """One LIST of every kind the audit reads, trimmed as the live view trims them.
    Returns the view and the optional kinds that are not installed."""
    view = Store(indexes=rules.indexes)
    absent: list[str] = []
    for resource in resources_for(read_kinds(rules, policy)):
        # Trimmed page by page (an Informer's list keeps every full object of the kind
        # until the last page: 8,000 Deployments are 80 MiB that way).
        trimmed: list[dict[str, Any]] = []
        try:
            for page in _pages(client, resource.path, page_size):
                trimmed.extend(t for t in map(resource.trim, page) if t is not None)
        except ApiError as exc:
            if exc.status == 404 and resource.optional:
                view.replace(resource.kind, [])
                absent.append(resource.kind)
                continue
            raise
        view.replace(resource.kind, trimmed)
    return view, absent


def audit(client: KubeClient, rules: RuleSet, policy: Policy, *, view: Any = None,
          include_owned: bool = False, page_size: int = 500) -> Audit:
    """List and judge every object the rules judge. ``view``: what the rules read
    (default: one LIST of each kind, :func:`load_view`)."""
    out = Audit(started=time.time())
    begun = time.perf_counter()
    if view is None:
        view, out.absent = load_view(client, rules, policy, page_size=page_size)
    for judged in judged_for(rules):
        try:
            for page in _pages(client, judged.path, page_size):
                for obj in page:
                    obj.setdefault("apiVersion", judged.api_version)
                    obj.setdefault("kind", judged.kind)
                    meta = obj.get("metadata")
                    if isinstance(meta, dict):
                        meta.pop("managedFields", None)
                    if not include_owned and _owned(obj, judged.kind):
                        out.owned += 1
                        continue
                    judge(rules, view, policy, obj, judged, out)
        except ApiError as exc:
            if exc.status == 404 and judged.optional:
                if judged.kind not in out.absent:
                    out.absent.append(judged.kind)
                continue
            raise
    out.seconds = time.perf_counter() - begun
    return out


# --- text ----------------------------------------------------------------------------


def summary_text(found: Audit) -> str:
    """A table per rule and namespace (results other than pass), then the totals."""
    lines = []
    counts = found.counts()
    rows = sorted((rule_id, ns, res, n) for (ns, rule_id, res), n in counts.items()
                  if res != "pass")
    for r in sorted(found.results, key=lambda r: (r.namespace, r.kind, r.name, r.rule)):
        where = f"{r.namespace}/{r.name}" if r.namespace else r.name
        lines.append(f"{r.result:<5} {r.kind} {where} {r.rule}: {r.message}")
    if lines:
        lines.append("")
    if rows:
        lines.append(f"{'RULE':<34} {'NAMESPACE':<24} {'RESULT':<6} COUNT")
        for rule_id, ns, res, n in rows:
            lines.append(f"{rule_id:<34} {ns or '(cluster)':<24} {res:<6} {n}")
        lines.append("")
    totals: Counter[str] = Counter()
    for (_, _, res), n in counts.items():
        totals[res] += n
    absent = f"; not installed: {', '.join(found.absent)}" if found.absent else ""
    lines.append(f"{found.objects} objects audited ({found.owned} owned by a controller, "
                 f"judged through it){absent} in {found.seconds:.1f}s: "
                 + ", ".join(f"{totals[k]} {k}" for k in OUTCOMES))
    return "\n".join(lines) + "\n"
