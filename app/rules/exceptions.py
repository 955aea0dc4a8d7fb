"""Delegated exceptions: an ``EnvelopeException`` (app/crds/exceptions.py) names only rules,
and lives only in namespaces, that the cluster policy's ``delegatedExceptions`` allows.

RBAC decides who may write one (the chart aggregates create/update/delete into the
namespace ``admin`` and ``edit`` roles); this rule decides what one may say, so a
namespace owner can never exempt more than the platform delegated. The engine honours
only what the policy allows when it reads them (app/core/exemptions.py), so an exception
that got in while this rule was off or the webhook was not called exempts nothing more.
"""

from __future__ import annotations

from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.crds import exceptions as envelope_exceptions
from app.k8s.util import dig
from app.rules.base import Finding, Ratchet, Subject, error, rule

__all__ = ["exception_allowed", "outside_delegation"]

EXCEPTION_KINDS = frozenset({(envelope_exceptions.GROUP, envelope_exceptions.KIND)})


def _namespace_labels(subject: Subject, view: ClusterView) -> dict[str, str] | None:
    namespace = view.get("Namespace", subject.namespace) if subject.namespace else None
    labels = dig(namespace, ("metadata", "labels")) if namespace is not None else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else None


def outside_delegation(subject: Subject, view: ClusterView, policy: Policy) -> bool:
    """Whether the EnvelopeException asks for more than ``delegatedExceptions`` allows (or
    is malformed): the rule runs only then and says what. Asked by the engine with the whole
    view, so the Namespace's labels are read for a ``namespaceSelector`` (watched because
    the policy needs them: ``exemptions.needs_namespaces``)."""
    delegated = policy.delegated_exceptions
    exception, problems = envelope_exceptions.parse(subject.obj)
    if delegated is None or exception is None or problems:
        return True
    if set(exception.rules) - set(delegated.allowed_rules):
        return True
    labels = _namespace_labels(subject, view) if delegated.namespace_selector is not None else None
    return not delegated.selects(subject.namespace, labels)


def _spec(subject: Subject, obj: dict[str, Any]) -> Any:
    return obj.get("spec")


@rule("exception-allowed", "validate", EXCEPTION_KINDS, Mode.ENFORCE,
      "an EnvelopeException names only rules, in namespaces, that the policy's "
      "delegatedExceptions allows",
      judges=_spec, ratchet=Ratchet.WARN, where=outside_delegation)
def exception_allowed(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """Refuses an EnvelopeException that is malformed, names a rule the platform does not
    delegate, or sits in a namespace it does not delegate to. Runs only where
    :func:`outside_delegation` holds (so, with the rules and the form allowed, what is
    left is the namespace)."""
    exception, problems = envelope_exceptions.parse(obj)
    if problems:
        return [error(p.partition(":")[0], f"{p}; see docs/configuration.md \"Delegated "
                                           f"exceptions\"") for p in problems]
    delegated = policy.delegated_exceptions
    if delegated is None:
        return [error("spec.rules",
                      "the cluster policy delegates no exceptions (it has no "
                      "delegatedExceptions): this EnvelopeException would exempt nothing; "
                      "ask the platform team to allow its rules in delegatedExceptions, or "
                      "delete it")]
    allowed = delegated.allowed_rules
    rules = exception.rules if exception is not None else ()
    refused = [r for r in rules if r not in allowed]
    if refused:
        return [error(f"spec.rules[{rules.index(r)}]",
                      f"{r} is not a rule the platform lets namespaces except from: "
                      f"delegatedExceptions.allowedRules allows {len(allowed)} "
                      f"({', '.join(allowed)}); remove {r} from spec.rules, or ask the "
                      f"platform team")
                for r in refused]
    return [error("metadata.namespace",
                  f"the cluster policy does not delegate exceptions to namespace "
                  f"{subject.namespace or '(none)'}: delegatedExceptions covers "
                  f"{delegated.where()}; ask the platform team")]
