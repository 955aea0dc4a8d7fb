"""The one front door to the engine: an object judged as the webhook pair would judge
its write, for every tool that judges without a webhook (``envelope check``, ``fix``,
``krm-fn``, ``audit``, the quota picture and the rule reference).

:class:`FrontDoor` builds what the API server would send (docs/architecture.md, "A
request, from bytes to verdict"): the subject of a CREATE (or the operation asked), in
the namespace ``kubectl apply`` places an object written without one, as a dry run (the
tools store nothing); converts a current-format (``api.ate.dev``) ActorTemplate into
the ``ate.dev`` form the rules judge, placed against the WorkerPools of every namespace;
optionally writes LimitRanger's defaults into a Pod first; then runs
:func:`app.core.engine.check_object` (mutate, then validate) and returns its
:class:`~app.core.engine.Evaluation` in a :class:`Judged`, with the identity the user
wrote.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from app.cluster.view import ClusterView, StaticView
from app.core.config import Policy
from app.core.engine import Evaluation, check_object
from app.core.ruleset import RuleSet
from app.crds.substrate import as_crd_template, is_current_template, read_current_template
from app.k8s import kinds
from app.k8s.defaulting import limit_ranger_pod
from app.rules.base import Finding, Subject

__all__ = ["ACTOR_LIMITS", "ANY_NAMESPACE", "DEFAULT_NAMESPACE", "FrontDoor", "Judged",
           "admitted", "placed", "pools_anywhere", "subject_of"]

DEFAULT_NAMESPACE = "default"
"""Where ``kubectl apply`` puts a namespaced object written without a namespace when it
is given none (and its context names none)."""

ANY_NAMESPACE = "any namespace"
"""Where a substrate-API ActorTemplate is placed: it lives in an atespace, not a
namespace, and upstream's scheduler matches workers of every namespace."""

ACTOR_LIMITS = "actor-limits"
"""The rule a current-format template's unreadable envelope is reported under."""


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def subject_of(obj: dict[str, Any] | None, operation: str = "CREATE",
               old: dict[str, Any] | None = None, *, dry_run: bool = False) -> Subject:
    """The write of ``obj`` (of ``old`` for a DELETE: ``obj`` None) as the API server
    describes it to the webhooks: its group, version and kind from ``apiVersion``/``kind``,
    its namespace and name from ``metadata`` as written."""
    written = obj if obj is not None else old or {}
    group, _, version = str(written.get("apiVersion", "")).rpartition("/")
    meta = _meta(written)
    return Subject(group, version, str(written.get("kind", "")), operation,
                   str(meta.get("namespace") or ""), str(meta.get("name") or ""), obj, old,
                   dry_run)


def placed(obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    """``obj`` in the namespace ``kubectl apply`` puts it in: a namespaced object written
    without ``metadata.namespace`` lands in the namespace kubectl is given (or its
    context's, ``default`` offline), so that namespace's LimitRanges and quotas apply to
    it (issue 37: the kubernetes.io LimitRange tutorial, published without namespaces,
    passed offline). Cluster-scoped kinds and kinds Envelope does not know are left as
    written (the same object, not a copy)."""
    group, _, _ = str(obj.get("apiVersion", "")).rpartition("/")
    known = kinds.by_ref(group, str(obj.get("kind", "")))
    meta = obj.get("metadata")
    if known is None or not known.namespaced or not isinstance(meta, dict) \
            or meta.get("namespace"):
        return obj
    return {**obj, "metadata": {**meta, "namespace": namespace}}


def admitted(obj: dict[str, Any], view: ClusterView) -> dict[str, Any]:
    """A Pod as the mutating webhooks receive it: LimitRanger (a mutating admission
    plugin that runs before them) has written its namespace's container defaults
    (``app.k8s.defaulting.limit_ranger_pod``). A workload's template is not defaulted: its
    Pods are judged as Pods by the rules that need them. Anything else is returned as
    it is."""
    if obj.get("kind") != "Pod" or str(obj.get("apiVersion", "")) != "v1":
        return obj
    namespace = str(_meta(obj).get("namespace") or "")
    limit_ranges = view.list("LimitRange", namespace) if namespace else []
    return limit_ranger_pod(obj, limit_ranges) if limit_ranges else obj


def pools_anywhere(objects: Iterable[dict[str, Any]], rules: RuleSet) -> StaticView:
    """Every ate.dev WorkerPool given in one namespace, named ``<ns>/<name>``; a later
    one replaces an earlier one of the same namespace and name (files over the cluster)."""
    pools = []
    for obj in objects:
        if obj.get("kind") != "WorkerPool" or not str(obj.get("apiVersion", "")).startswith("ate.dev/"):
            continue
        meta = _meta(obj)
        name = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        pools.append({**obj, "metadata": {**meta, "namespace": ANY_NAMESPACE, "name": name}})
    return StaticView(pools, rules.indexes)


@dataclass(frozen=True)
class Judged:
    """One object judged: the engine's result and what it was handed."""

    evaluation: Evaluation
    """What the webhook pair would answer (mutate, then validate)."""
    subject: Subject
    """The write the engine judged (for a converted template: the ``ate.dev`` form)."""
    kind: str
    api_version: str
    namespace: str
    name: str
    """The object as the user wrote it (a current-format template: its kind, atespace
    and name)."""
    converted: bool = False
    """A current-format template judged in its ``ate.dev`` form: ``evaluation.patch``
    (none today: every actor rule validates) would be a patch of that form, not of the
    document."""


class FrontDoor:
    """Judges objects against one view, each as the webhook pair would judge its write.

    ``objects``: every object of the input (files, and the cluster's with
    ``--kubeconfig``), where a current-format template finds its WorkerPools and an
    ActorTemplateVersion its ActorTemplate. ``namespace``: where an object written
    without one is placed (None: as written). ``admit``: write LimitRanger's defaults
    into a Pod before judging it (``envelope check``: its report is what the cluster
    stores; not ``fix``, whose patch must apply to the file as written)."""

    def __init__(self, rules: RuleSet, view: ClusterView, policy: Policy, *,
                 objects: Iterable[dict[str, Any]] = (), namespace: str | None = DEFAULT_NAMESPACE,
                 admit: bool = False) -> None:
        self.rules, self.view, self.policy = rules, view, policy
        self.namespace, self.admit = namespace, admit
        self._objects = objects
        self._everything: list[dict[str, Any]] | None = None
        self._pools: StaticView | None = None

    def judge(self, obj: dict[str, Any] | None, *, operation: str = "CREATE",
              old: dict[str, Any] | None = None, kind: kinds.Kind | None = None) -> Judged:
        """``obj`` written (``operation``; ``old`` the stored object of an UPDATE or
        DELETE). ``kind``: the kind it was listed as (the audit), over its own
        ``apiVersion``/``kind``."""
        if obj is not None and operation == "CREATE" and is_current_template(obj):
            return self._current_template(obj)
        if self.namespace is not None:
            obj = placed(obj, self.namespace) if obj is not None else None
            old = placed(old, self.namespace) if old is not None else None
        if obj is not None and self.admit:
            obj = admitted(obj, self.view)
        subject = subject_of(obj, operation, old, dry_run=True)
        if kind is not None:
            subject = replace(subject, group=kind.group, version=kind.version, kind=kind.kind)
        return Judged(check_object(self.rules, subject, self.view, self.policy), subject,
                      subject.kind, subject.api_version, subject.namespace, subject.name)

    def _current_template(self, obj: dict[str, Any]) -> Judged:
        """An ``api.ate.dev`` ActorTemplate (or ActorTemplateVersion), converted into the
        ``ate.dev`` ActorTemplate the rules judge (``app.crds.substrate``): what the
        conversion could not read becomes ``actor-limits`` findings given to the engine,
        so that rule's mode and the exemptions apply to them as to its own. The
        document's labels and annotations are kept, for exceptions and the exemption
        annotation."""
        if self._everything is None:
            self._everything = list(self._objects)
        selector_from = None
        if obj.get("kind") == "ActorTemplateVersion":
            parent = obj.get("actorTemplate")
            wanted = parent.get("name") if isinstance(parent, dict) else None
            selector_from = next((o for o in self._everything if is_current_template(o)
                                  and o.get("kind") == "ActorTemplate"
                                  and _meta(o).get("name") == wanted), None)
        template = read_current_template(obj, selector_from)
        crd = as_crd_template(template, ANY_NAMESPACE)
        meta = obj.get("metadata")
        for key in ("labels", "annotations"):
            found = meta.get(key) if isinstance(meta, dict) else None
            if isinstance(found, dict):
                crd["metadata"][key] = dict(found)
        subject = Subject("ate.dev", "v1alpha1", "ActorTemplate", "CREATE", ANY_NAMESPACE,
                          template.name, crd, dry_run=True)
        unread = [Finding("error", ACTOR_LIMITS, p.split(":", 1)[0], p) for p in template.problems]
        if self._pools is None:
            self._pools = pools_anywhere(self._everything, self.rules)
        return Judged(check_object(self.rules, subject, self._pools, self.policy, unread),
                      subject, template.kind, str(obj.get("apiVersion")), template.atespace,
                      template.name, converted=True)
