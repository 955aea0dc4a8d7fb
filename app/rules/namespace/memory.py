"""``namespace-memory-composition``: replicas x pod memory over the namespace's workloads
fits its memory quota.

A memory envelope is only honest when it fits the namespace's memory budget: the sum is
the namespace as this write leaves it, counted as the quota admission charges pods (each
controller's pods at once, a child counted through its owner). Sums are remembered per
namespace state, so a review costs a lookup (docs/rules/namespace-memory-composition.md;
the memos' bounds: docs/reliability.md).
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from app.cluster.after import AfterWrite
from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.namespace_policy import name_of, pods_at_once, quota_hard, quota_matches_pod, quota_scope_key
from app.k8s.podmodel import Admission, admit
from app.k8s.podspec import POD_SPEC_PATHS, WORKLOAD_KINDS, pod_resources, well_formed
from app.k8s.quantity import QuantityError, format_bytes, parse_quantity
from app.k8s.scheduling import clamp_quantity
from app.k8s.util import Memo, digest, footprint
from app.rules.base import Finding, Ratchet, Subject, error, rule
from app.rules.envelope import pod_amount

COUNTED_KINDS = ("Deployment", "StatefulSet", "ReplicaSet", "ReplicationController", "Job", "CronJob")
"""The workloads whose pods the namespace's memory quota is charged for. Bare Pods are
not read (the webhook would watch every Pod of the cluster): a Pod write is counted as
itself, against the workloads."""
_OWNER_OF = {"ReplicaSet": "Deployment", "Job": "CronJob"}
"""A child whose pods its controller's object is counted for (its controller owner)."""
_QUOTA_KEYS = {"requests.memory": "requests", "memory": "requests", "limits.memory": "limits"}
_SPEC_PATH = {kind: path for (_, kind), path in POD_SPEC_PATHS.items()}
"""Where each workload kind keeps its pod spec, by view name (the workload kinds' names
are unique)."""
_SEEN = (*COUNTED_KINDS, "LimitRange")
"""The kinds a namespace's sums are derived from: remembered until one of them changes in
that namespace (``view.version(kind, namespace)``)."""
_CLUSTER_SEEN = ("PriorityClass", "RuntimeClass")
"""The cluster-scoped kinds they are derived from too (the Pods' class and overhead, as
the Priority and RuntimeClass plugins write them): ``view.version(kind)``."""


def _counted_by_owner(view: ClusterView, kind: str, obj: Mapping[str, Any], namespace: str) -> bool:
    """Is this a ReplicaSet whose controller is a Deployment in the view (a Job, a
    CronJob)? Its pods are counted through that owner (the Deployment's replicas, one
    Job of the CronJob), not twice. An ownerReference is a claim anyone can write: it
    counts only when the owner exists (same name, and the same uid when both say one);
    a child that names a missing owner is counted itself."""
    parent = _OWNER_OF.get(kind)
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if parent is not None and isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else []:
        if not (isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("kind") == parent
                and isinstance(ref.get("name"), str)):
            continue
        owner = view.get(str(parent), ref["name"], namespace)
        owner_meta = owner.get("metadata") if owner is not None else None
        uid = owner_meta.get("uid") if isinstance(owner_meta, Mapping) else None
        if owner is not None and (uid is None or ref.get("uid") is None or uid == ref.get("uid")):
            return True
    return False


@dataclass(frozen=True)
class _Pods:
    """One workload's pods as the quota counts them: how many at once, the pod spec as
    stored (LimitRanger's container defaults applied) and its memory per quota section
    (None: a quantity that does not parse — the quantities rule names it there)."""

    kind: str
    name: str
    count: int
    spec: Mapping[str, Any]
    memory: Mapping[str, Decimal | None]
    shared: bool = field(default=False, compare=False)
    """``spec`` is the stored object's own (no LimitRange default applied): the view
    holds it, a memo does not pay for it."""


def _admission(view: ClusterView, namespace: str, policy: Policy) -> Admission:
    """What the admission plugins before the webhook read for a Pod of ``namespace``
    (app/k8s/podmodel.py ``admit``): its LimitRanges (in the view's order; LimitRanger's own
    is a Go map's), the PriorityClasses and RuntimeClasses."""
    return Admission(view.list("LimitRange", namespace), view.list("PriorityClass"),
                     {name_of(rc): rc for rc in view.list("RuntimeClass")},
                     frozenset(policy.admission_plugins))


def _charged_spec(spec: Mapping[str, Any], admission: Admission) -> Mapping[str, Any] | None:
    """The pod spec the quota sees: a Pod made from the template goes through the
    mutating admission plugins before the quota admission charges it (``admit``:
    LimitRanger's container defaults, the default PriorityClass its scopes read, the
    RuntimeClass's overhead it charges); None when the RuntimeClass plugin refuses it."""
    admitted_spec, refused = admit(spec, admission)
    return None if refused is not None else admitted_spec


def _amount(spec: Mapping[str, Any], section: str) -> Decimal | None:
    try:
        return clamp_quantity(pod_amount(dict(spec), "memory", section))
    except (TypeError, AttributeError, ValueError, QuantityError):
        return None  # the quantities rule names the value on its own object


def _pods_of(kind: str, name: str, obj: Mapping[str, Any], admission: Admission) -> _Pods | None:
    """None when the object's pods cannot be read (a pod spec of the wrong type: the
    quantities rule names it on that object) or it runs none."""
    node: Any = obj
    for key in _SPEC_PATH.get(kind, ()):
        node = node.get(key) if isinstance(node, Mapping) else None
    count = pods_at_once(kind, obj)
    if not isinstance(node, Mapping) or not count:
        return None
    try:
        spec = _charged_spec(node, admission)
    except (TypeError, AttributeError, ValueError, QuantityError):
        return None
    if spec is None:
        return None  # the RuntimeClass plugin refuses its Pods: none is charged
    return _Pods(kind, name, count, spec, {s: _amount(spec, s) for s in ("requests", "limits")},
                 shared=spec is node)


def _weigh_pods(key: object, pods: _Pods | None) -> int:
    """An entry of ``_derived``: its key and what it made, not the view's own pod spec."""
    if pods is None or not pods.shared:
        return footprint((key, pods))
    return footprint((key, pods.kind, pods.name, pods.memory)) + sys.getsizeof(pods)


DERIVED_BUDGET = 32 * 2**20
_derived: Memo[tuple[str, str, tuple[Any, ...], bytes], _Pods | None] = Memo(
    1 << 17, DERIVED_BUDGET, _weigh_pods)
"""Each stored object's pods, by its kind, name, the versions of what the admission
plugins read (the namespace's LimitRanges, the cluster's PriorityClasses and
RuntimeClasses, the policy's plugins) and the digest of what ``_pods_of`` reads
(``spec`` and ``status``): a namespace summed again after one change derives only what
changed, and an object changed in nothing read (an annotation patch) is found again.
Never keyed by identity: that kept every old version of a changed workload (issue 38:
48,000 annotation patches on the 30k cluster took RSS from 184 to 398 MiB)."""

_NOT_DERIVED: Any = object()
_pods: Memo[str, tuple[tuple[Any, ...], list[_Pods]]] = Memo(
    256, 16 * 2**20, lambda key, found: footprint((key, found[0])) + sys.getsizeof(found[1]) + sum(
        sys.getsizeof(p) for p in found[1]))
"""Each namespace's pods with the versions they were derived at: one entry per
namespace, replaced when it changes (an old state is never kept). The lists hold
``_derived``'s values (paid for there)."""


def _namespace_pods(view: ClusterView, namespace: str, policy: Policy) -> list[_Pods]:
    """Every counted workload of the namespace that runs pods, once per state of the
    kinds they are derived from in the namespace (``view.version(kind, namespace)``): an
    ``envelope check`` or an audit of every object reads the namespace once, not once
    per object, and the webhook again only after a change in that namespace."""
    versions = (*(view.version(k, namespace) for k in _SEEN),
                *(view.version(k) for k in _CLUSTER_SEEN), tuple(policy.admission_plugins))
    found = _pods.get(namespace)
    if found is not None and found[0] == versions:
        return found[1]
    admission = _admission(view, namespace, policy)
    ranges = (view.version("LimitRange", namespace), *(view.version(k) for k in _CLUSTER_SEEN),
              tuple(policy.admission_plugins))
    out = []
    for kind in COUNTED_KINDS:
        for w in view.list(kind, namespace):
            if _counted_by_owner(view, kind, w, namespace):
                continue
            name = name_of(w)
            try:
                key = (kind, name, ranges, digest((w.get("spec"), w.get("status"))))
            except TypeError:  # not JSON (a YAML file's non-string keys): not remembered
                pods = _pods_of(kind, name, w, admission)
            else:
                pods = _derived.get(key, _NOT_DERIVED)
                if pods is _NOT_DERIVED:
                    pods = _derived.put(key, _pods_of(kind, name, w, admission))
            if pods is not None:
                out.append(pods)
    _pods.put(namespace, (versions, out))
    return out


_SHOWN = 16
"""How many of the largest shares a sum keeps for the message: an item is at least 13
characters (``a 1 x 1B = 1B``) and a separator, and the total's text follows, so at most
``110 // 15 = 7`` fit; 16 leaves room for the written object's stored copy, skipped."""


@dataclass(frozen=True)
class _Sum:
    """What one quota (a section, a scope) is charged for by the namespace's workloads:
    the total, each workload's share by (kind, name), how many there are, and the
    largest shares first (ties in the view's order) for the message."""

    total: Decimal
    share: dict[tuple[str, str], Decimal]
    count: int
    ranked: list[tuple[str, str, int, Decimal]]


_sums: Memo[tuple[str, str, str], tuple[tuple[Any, ...], _Sum]] = Memo(1024, 16 * 2**20)
"""Each namespace's sum per section and scope, with the versions it was made at: one
entry each, replaced when the namespace changes."""


def _matches(quota: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    try:
        return quota_matches_pod(quota, spec)
    except (TypeError, AttributeError, ValueError, QuantityError):
        return False


def _namespace_sum(view: ClusterView, namespace: str, quota: Mapping[str, Any], section: str,
                   policy: Policy) -> _Sum:
    """The pods of the namespace's workloads that ``quota`` counts (its scopes and
    scopeSelector, ``quota_matches_pod``, as the guards read them), summed once per
    namespace state, section and scope: linear in the workloads over a whole run."""
    scope = quota_scope_key(quota)
    key = (namespace, section, scope)
    versions = (*(view.version(k, namespace) for k in _SEEN),
                *(view.version(k) for k in _CLUSTER_SEEN), tuple(policy.admission_plugins))
    found = _sums.get(key)
    if found is not None and found[0] == versions:
        return found[1]
    share: dict[tuple[str, str], Decimal] = {}
    rows: list[tuple[str, str, int, Decimal]] = []
    unscoped = scope == "[]"  # no scope: every pod is counted
    for pods in _namespace_pods(view, namespace, policy):
        memory = pods.memory[section]
        if memory and (unscoped or _matches(quota, pods.spec)):
            share[(pods.kind, pods.name)] = pods.count * memory  # one object per kind and name
            rows.append((pods.kind, pods.name, pods.count, memory))
    # nlargest is sorted(..., reverse=True)[:n]: a stable sort's order, ties as listed
    ranked = heapq.nlargest(_SHOWN, rows, key=lambda r: r[2] * r[3])
    made = _Sum(sum(share.values(), Decimal(0)), share, len(rows), ranked)
    _sums.put(key, (versions, made))
    return made


def _breakdown(parts: Iterator[tuple[str, int, Decimal]], count: int, tail: str) -> str:
    """The largest shares first, as many as fit in ~110 characters, then ``+N more``."""
    shown: list[str] = []
    for name, n, m in parts:
        item = f"{name} {n} x {format_bytes(m)} = {format_bytes(n * m)}"
        if len(", ".join([*shown, item, tail])) > 110:
            break
        shown.append(item)
    if len(shown) < count:
        shown.append(f"+{count - len(shown)} more")
    return ", ".join([*shown, tail])


def _merged(ranked: list[tuple[str, str, int, Decimal]], skip: tuple[str, str] | None,
            mine: tuple[str, int, Decimal]) -> Iterator[tuple[str, int, Decimal]]:
    """The namespace's shares without the written object's stored copy, with the written
    object's own after those at least as large: the order of a stable sort of the
    shares with the written object appended, read lazily (the message needs a few)."""
    own = mine[1] * mine[2]
    placed = False
    for kind, name, n, m in ranked:
        if (kind, name) == skip:
            continue
        if not placed and n * m < own:
            placed = True
            yield mine
        yield name, n, m
    if not placed:
        yield mine


@rule("namespace-memory-composition", "validate", WORKLOAD_KINDS, Mode.WARN,
      "replicas x pod memory over the namespace's workloads fits its memory quota",
      reads={"ResourceQuota", "LimitRange", *_CLUSTER_SEEN, *COUNTED_KINDS}, judges=pod_resources,
      ratchet=Ratchet.WARN, requires=well_formed)
def namespace_memory_composition(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                 policy: Policy) -> list[Finding]:
    """The namespace as this write leaves it — its workloads' pods as their controllers
    run them (``pods_at_once``: Job concurrency, one Job per CronJob, a ReplicaSet or a
    Job counted through its existing owner) less the written object's stored copy
    (``AfterWrite.writes``), plus the written object's — against every memory quota that
    counts this write's pods. Each quota's sum is the namespace's, computed once per
    state of the view (``_namespace_sum``); a review costs a lookup and a short merge."""
    quotas = [(q, key, value) for q in view.list("ResourceQuota", subject.namespace)
              for key, value in quota_hard(q).items() if key in _QUOTA_KEYS]
    if not quotas or _counted_by_owner(view, subject.kind, obj, subject.namespace):
        return []  # no memory quota; or a child whose owner's write counts its pods
    mine = _pods_of(subject.kind, subject.name, obj, _admission(view, subject.namespace, policy))
    if mine is None:
        return []  # this write runs no pods (a DaemonSet, a suspended Job): nothing it adds
    name = subject.name or "(this)"
    after = AfterWrite(view, subject.kind, subject.name, obj, namespace=subject.namespace)
    findings = []
    for quota, key, hard in quotas:
        section = _QUOTA_KEYS[key]
        amount = mine.memory[section]
        try:
            limit = parse_quantity(hard)
        except QuantityError:
            continue  # the quota's own write was refused for it
        if not amount or not _matches(quota, mine.spec):
            continue  # this write's pods are not charged to this quota
        charged = _namespace_sum(view, subject.namespace, quota, section, policy)
        stored = (subject.kind, subject.name)
        skip = stored if stored in charged.share and after.writes(*stored, subject.namespace) else None
        total = charged.total - (charged.share[skip] if skip else 0) + mine.count * amount
        if total <= limit:
            continue
        count = charged.count - (1 if skip else 0) + 1
        tail = f"total {format_bytes(total)} > quota {name_of(quota)} {key} {hard}"
        parts = _merged(charged.ranked, skip, (name, mine.count, amount))
        findings.append(error("metadata.namespace", _breakdown(parts, count, tail)))
    return findings
