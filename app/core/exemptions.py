"""Which rules do not apply to one object: the policy's exceptions, the EnvelopeExceptions
of its namespace that the policy's ``delegatedExceptions`` allows, and the object's own
exemption annotation. The view is read only for the Namespace's labels and the
namespace's EnvelopeExceptions; the clock only for an EnvelopeException's ``expires``."""

from __future__ import annotations

import datetime
from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Policy, RuleException
from app.crds import exceptions as envelope_exceptions
from app.k8s.kinds import name_of
from app.k8s.podspec import POD_SPEC_PATHS, pod_template
from app.rules.base import Finding, Subject

__all__ = ["ALL", "EXCEPTION_KIND", "exemptions", "is_delegated", "needs_exceptions",
           "needs_namespaces", "unreached", "watched_for"]

ALL = "*"
EXCEPTION_KIND = name_of(envelope_exceptions.GROUP, envelope_exceptions.KIND)
"""The view's name of EnvelopeExceptions."""


def needs_namespaces(policy: Policy) -> bool:
    """Whether the view must hold Namespaces for the policy's exceptions (or for where
    ``memoryBelowLimit`` applies, or delegatedExceptions' namespaceSelector)."""
    choice = policy.memory_below_limit
    delegated = policy.delegated_exceptions
    return any(e.namespace_selector is not None for e in policy.exceptions) or \
        (choice is not None and choice.namespace_selector is not None) or \
        (delegated is not None and delegated.namespace_selector is not None)


def needs_exceptions(policy: Policy) -> bool:
    """Whether the view must hold EnvelopeExceptions: the policy delegates some (otherwise
    none is honoured, and none is watched: installing the CRD changes nothing)."""
    return policy.delegated_exceptions is not None


def watched_for(policy: Policy) -> set[str]:
    """The kinds the view must hold for the policy itself, beyond what the rules read."""
    return ({"Namespace"} if needs_namespaces(policy) else set()) | \
        ({EXCEPTION_KIND} if needs_exceptions(policy) else set())


def _labels(obj: Any) -> dict[str, str]:
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def _matches(exception: RuleException, subject: Subject, view: ClusterView) -> bool:
    if exception.kinds and not ({subject.kind, f"{subject.group}/{subject.kind}"} & set(exception.kinds)):
        return False
    if exception.namespaces and subject.namespace not in exception.namespaces:
        return False
    if exception.object_selector is not None and not exception.object_selector.matches(
            _labels(subject.obj if subject.obj is not None else subject.old)):
        return False
    if exception.namespace_selector is not None:
        namespace = view.get("Namespace", subject.namespace) if subject.namespace else None
        if namespace is None or not exception.namespace_selector.matches(_labels(namespace)):
            return False  # an unknown namespace exempts nothing
    return True


def _annotated(subject: Subject, policy: Policy) -> list[str]:
    obj = subject.obj if subject.obj is not None else subject.old
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    return _exempted_by(meta, policy)


def _exempted_by(meta: Any, policy: Policy) -> list[str]:
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    value = annotations.get(policy.exempt_annotation) if isinstance(annotations, dict) else None
    if not isinstance(value, str):
        return []
    return [part.strip() for part in value.split(",") if part.strip() not in ("", ALL)]


def is_delegated(why: str) -> bool:
    """Whether an exemption's reason (``Evaluation.skipped``) is a namespace owner's
    EnvelopeException (``EnvelopeException <namespace>/<name>[: reason]``)."""
    return why.startswith(f"{envelope_exceptions.KIND} ")


def _delegated(subject: Subject, view: ClusterView, policy: Policy,
               found: dict[str, str]) -> None:
    """The EnvelopeExceptions of the subject's namespace that cover it, each for the rules
    it names that ``delegatedExceptions`` allows (checked here again, whatever was admitted:
    an exception stored before the policy narrowed, or while the webhook was not called,
    exempts from nothing the policy does not allow now)."""
    delegated = policy.delegated_exceptions
    if delegated is None or not subject.namespace:
        return
    stored = view.list(EXCEPTION_KIND, subject.namespace)
    if not stored:
        return
    if delegated.namespace_selector is not None:
        namespace = view.get("Namespace", subject.namespace)
        if not delegated.selects(subject.namespace, _labels(namespace) if namespace else None):
            return
    elif not delegated.selects(subject.namespace, None):
        return
    obj = subject.obj if subject.obj is not None else subject.old
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    # A Pod its controller makes from generateName has no name yet at the mutating webhook
    # (the API server names it after mutating admission, before validating: pepr issue
    # 3218, k8s.io/apiserver handlers/create.go): its generateName stands in, so a
    # pattern such as "grafana-*" covers it in both phases.
    name = meta.get("name") or meta.get("generateName") if isinstance(meta, dict) else None
    name = name if isinstance(name, str) else subject.name or ""
    labels = _labels(obj)
    allowed = set(delegated.allowed_rules)
    now = datetime.datetime.now(datetime.UTC)
    for item in sorted(stored, key=lambda o: str(o.get("metadata", {}).get("name", ""))):
        exception, _ = envelope_exceptions.parse(item)
        if exception is None or exception.expired(now) or \
                not exception.matches(subject.group, subject.kind, name, labels):
            continue
        why = exception.ref + (f": {exception.reason}" if exception.reason else "")
        for rule_id in exception.rules:
            if rule_id in allowed:
                found.setdefault(rule_id, why)


def exemptions(subject: Subject, view: ClusterView, policy: Policy) -> dict[str, str]:
    """Rule id (or ``"*"``) -> why it does not apply to this object. An EnvelopeException
    is never exempt (it is how exemptions are granted: ``exception-allowed`` judges it
    whatever its annotations say)."""
    found: dict[str, str] = {}
    if (subject.group, subject.kind) == (envelope_exceptions.GROUP, envelope_exceptions.KIND):
        return found
    for i, exception in enumerate(policy.exceptions):
        if _matches(exception, subject, view):
            why = f"policy exceptions[{i}]" + (f": {exception.reason}" if exception.reason else "")
            for rule_id in exception.rules:
                found.setdefault(rule_id, why)
    _delegated(subject, view, policy, found)
    if policy.allow_object_exemptions:
        for rule_id in _annotated(subject, policy):
            found.setdefault(rule_id, f"annotation {policy.exempt_annotation}")
    return found


def unreached(subject: Subject, policy: Policy) -> list[Finding]:
    """A warning for each rule a workload's own exemption annotation names but its pod
    template's does not: only the template's metadata reaches the Pods its controller
    makes (app/k8s/podmodel.py), so those Pods are judged by the rule when they are created
    although the workload itself was not (issue #28, class 3)."""
    if not policy.allow_object_exemptions or subject.obj is None:
        return []
    mine = _annotated(subject, policy)
    if not mine or (subject.group, subject.kind) not in POD_SPEC_PATHS or subject.kind == "Pod":
        return []
    template = pod_template(subject, subject.obj)
    reaching = set(_exempted_by(template.get("metadata") if template else None, policy))
    return [Finding("warning", rule_id, "metadata.annotations",
                    f"{policy.exempt_annotation} exempts this {subject.kind} from {rule_id}, but its "
                    f"Pods only get the annotations of its pod template: {rule_id} still judges every "
                    f"Pod it makes; put {policy.exempt_annotation}: \"{rule_id}\" on the template's "
                    f"metadata.annotations too")
            for rule_id in mine if rule_id not in reaching]
