"""What a cluster runs with the chart's ``inTree.enabled`` (docs/in-tree.md), set up on the
bench's API server: the rounds ``intree-map`` and ``envelope-intree`` of bench/apiserver.py.

- the MutatingAdmissionPolicy and binding ``app.intree.compile_in_tree`` makes of the
  default rule set and the default policy (the chart's ``files/intree.yaml`` is the same
  compilation, ``python -m app.intree.chartfile``), with the namespaceSelector the chart
  gives them (``templates/intree.yaml``: its webhooks' own selector, and the binding's
  namespace requirements — the fact label — added);
- ``envelope-intree`` only: Envelope ``serve`` with the chart's webhook configurations,
  the mutating webhook's matchCondition replaced by ``Compiled.webhook_condition`` (the
  chart does the same with ``files/intree.yaml``'s ``webhookCondition``); the validating
  webhook as the chart has it;
- the namespace fact: :func:`label_namespaces` runs ``app.intree.facts.FactKeeper`` once
  against the API server (as ``python -m app.intree.facts --once`` does), so the bench
  namespaces carry ``in-tree.envelope.io/cpu-limit-guards=clear`` because they hold no
  LimitRange and no ResourceQuota, not because the bench wrote the label; and the
  keeper's Lease the binding reads as its param (``paramRef``, ``app.intree.compile``
  ``DEFAULT_FACT_LEASE``), renewed by that round with a duration that outlasts the
  bench's rounds (without it the binding does nothing and the webhook answers).

The helpers above :class:`InTreeSetup` are pure (tests/intree/test_intree_bench.py).
"""

from __future__ import annotations

import copy
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.cluster.kube import ApiError, KubeClient, kube_configuration  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.core.ruleset import default_ruleset  # noqa: E402
from app.intree import Compiled, compile_in_tree  # noqa: E402
from app.intree.compile import DEFAULT_FACT_LEASE  # noqa: E402
from app.intree.facts import FactKeeper, FactLease  # noqa: E402

INTREE_ROUNDS = ("intree-map", "envelope-intree")
MUTATING = "MutatingWebhookConfiguration"
VALIDATING = "ValidatingWebhookConfiguration"
_NAME = "kubernetes.io/metadata.name"


def compiled_default(excluded_namespaces: Sequence[str]) -> Compiled:
    """The chart's in-tree compilation: the default rule set and policy."""
    compiled = compile_in_tree(default_ruleset(), Policy(), excluded_namespaces=excluded_namespaces)
    if not compiled.rules:
        raise RuntimeError("the default policy compiles no rule in-tree: nothing to measure")
    return compiled


def excluded_namespaces(selector: Mapping[str, Any]) -> list[str]:
    """The namespaces a chart-rendered namespaceSelector leaves out (its ``NotIn`` on
    ``kubernetes.io/metadata.name``)."""
    for expression in selector.get("matchExpressions") or []:
        if expression.get("key") == _NAME and expression.get("operator") == "NotIn":
            return list(expression.get("values") or [])
    return []


def webhook_selector(docs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The namespaceSelector of the chart's mutating webhook (the one templates/intree.yaml
    gives the policy)."""
    for doc in docs:
        if doc.get("kind") == MUTATING:
            hooks = doc.get("webhooks") or []
            if len(hooks) != 1:
                raise ValueError(f"expected one mutating webhook, the chart rendered {len(hooks)}")
            return copy.deepcopy(hooks[0].get("namespaceSelector") or {})
    raise ValueError("the chart rendered no MutatingWebhookConfiguration")


def chart_manifests(compiled: Compiled, selector: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The policy and binding as templates/intree.yaml renders them: both select the
    webhooks' namespaces (``selector``), the binding also requires
    ``compiled.namespace_requirements``. The compiled NotIn list must be the selector's
    (same excluded namespaces), or the compilation was asked the wrong question."""
    policy_selector = compiled.manifests[0]["spec"]["matchConstraints"]["namespaceSelector"]
    if excluded_namespaces(policy_selector) != excluded_namespaces(selector):
        raise ValueError(f"compiled for namespaces {excluded_namespaces(policy_selector)} left out, "
                         f"the chart leaves out {excluded_namespaces(selector)}")
    out = copy.deepcopy(compiled.manifests)
    for manifest in out:
        chosen = copy.deepcopy(dict(selector))
        if manifest["kind"] == "MutatingAdmissionPolicy":
            manifest["spec"]["matchConstraints"]["namespaceSelector"] = chosen
        else:
            chosen["matchExpressions"] = [*chosen.get("matchExpressions", []),
                                          *copy.deepcopy(compiled.namespace_requirements)]
            manifest["spec"]["matchResources"]["namespaceSelector"] = chosen
    return out


def with_condition(docs: Sequence[Mapping[str, Any]], condition: str) -> list[dict[str, Any]]:
    """The chart's webhook configurations with the mutating webhook's matchConditions
    replaced by ``condition`` (the chart's in-tree ``webhookCondition``); the validating
    webhook untouched."""
    out = copy.deepcopy([dict(d) for d in docs])
    found = False
    for doc in out:
        if doc.get("kind") == MUTATING:
            for hook in doc.get("webhooks") or []:
                hook["matchConditions"] = [{"name": "envelope-may-mutate", "expression": condition}]
                found = True
    if not found:
        raise ValueError("no mutating webhook to give the reduced condition")
    return out


_SAMPLE = re.compile(r"^apiserver_admission_(?P<family>\w+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
#: metric family (after ``apiserver_admission_``) -> the label the counter is kept by
#: (``k8s.io/apiserver/pkg/admission/metrics/metrics.go``)
COUNTERS = {
    "webhook_request_total": ("calls", "type"),  # requests sent to webhooks: admit / validating
    "controller_admission_duration_seconds_sum": ("plugin", "name"),  # seconds in a built-in plugin
    "match_condition_evaluation_seconds_sum": ("match", "kind"),  # seconds of matchConditions CEL
}


def admission_counters(metrics: str) -> dict[str, float]:
    """The API server's admission counters, summed by what a bench round tells apart:
    ``calls:admit`` / ``calls:validating`` (webhook requests, every code),
    ``plugin:<admission plugin>`` (seconds spent in it, e.g. ``MutatingAdmissionPolicy``,
    ``MutatingAdmissionWebhook``), ``match:<webhook|policy>`` (seconds evaluating
    matchConditions)."""
    out: dict[str, float] = {}
    for line in metrics.splitlines():
        match = _SAMPLE.match(line)
        if match is None or match["family"] not in COUNTERS:
            continue
        prefix, by = COUNTERS[match["family"]]
        key = f"{prefix}:{dict(_LABEL.findall(match['labels'])).get(by, '')}"
        out[key] = out.get(key, 0.0) + float(match["value"])
    return out


def per_create(before: Mapping[str, float], after: Mapping[str, float], count: int) -> dict[str, float]:
    """Counter increase per create: calls as calls, seconds as milliseconds."""
    out = {}
    for key, value in after.items():
        grown = value - before.get(key, 0.0)
        if grown > 0:
            out[key] = grown / count * (1 if key.startswith("calls:") else 1000)
    return out


def _resources(obj: Mapping[str, Any]) -> list[Any]:
    spec = (obj.get("spec") or {}).get("template", {}).get("spec", {})
    return [c.get("resources") for f in ("initContainers", "containers") for c in spec.get(f) or []]


def domain_verdict(envelope: Mapping[str, Any], policy_alone: Mapping[str, Any],
                   written: Mapping[str, Any]) -> str:
    """What the compiled policy alone (``intree-map``) did to a Deployment: stored it as
    Envelope did (``envelope``, a strict comparable: the object is in the domain) or
    left it as ``written`` (outside the domain: the webhook answers it). Raises on
    anything else (a policy that answers part of a write would be a compiler bug)."""
    def without_warnings(answer: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in answer.items() if k != "warnings"}

    if without_warnings(envelope) == without_warnings(policy_alone):
        return "in the domain (stored as Envelope stores it)"
    written_annotations = (written.get("metadata") or {}).get("annotations") or None
    if policy_alone.get("annotations") == written_annotations and \
            _resources(policy_alone) == _resources(written):
        return ("outside the domain (left as written: the policy's matchCondition is false, "
                "the webhook answers it)")
    raise RuntimeError("the compiled policy alone stored neither Envelope's answer nor the object "
                       f"as written: resources {_resources(policy_alone)}")


#: Issue 22's targets for the in-tree rounds: (objects, numerator round, denominator round,
#: the most the ratio of their added p50s may be; None: reported only).
TARGETS: tuple[tuple[tuple[str, ...], str, str, float | None], ...] = (
    (("mutated", "burstable"), "envelope-intree", "map", 1.1),
    (("mutated", "burstable"), "intree-map", "map", None),
    (("compliant",), "envelope-intree", "go-h2", 1.0),
)


def target_ratios(median: Mapping[tuple[str, str, int], Mapping[str, float]],
                  targets: Sequence[tuple[tuple[str, ...], str, str, float | None]] = TARGETS,
                  ) -> list[dict[str, Any]]:
    """Per target (default :data:`TARGETS`), object and concurrency present in ``median``
    ((round, object, concurrency) -> medians, with the ``none`` round): both added p50s
    (over ``none``), their ratio (None when the denominator added nothing) and whether
    the target is met, with both rounds' API-server CPU per create."""
    rows = []
    for objects, top, bottom, goal in targets:
        for (label, obj, c), base in median.items():
            if label != "none" or obj not in objects:
                continue
            a, b = median.get((top, obj, c)), median.get((bottom, obj, c))
            if a is None or b is None:
                continue
            added_a, added_b = a["p50"] - base["p50"], b["p50"] - base["p50"]
            ratio = added_a / added_b if added_b > 0 else None
            rows.append({"object": obj, "concurrency": c, "round": top, "against": bottom,
                         "added": added_a, "added_against": added_b, "ratio": ratio, "goal": goal,
                         "met": None if goal is None else (added_a <= goal * added_b),
                         "cpu": a.get("cpu:kube-apiserver", 0.0),
                         "cpu_against": b.get("cpu:kube-apiserver", 0.0)})
    return rows


class InTreeSetup:
    """Applies and removes one in-tree round's objects; ``docs`` are the chart's webhook
    configurations (rendered for the round's Envelope process, or for any URL when the
    round runs no webhook: only their namespaceSelector is used then)."""

    def __init__(self, label: str, docs: Sequence[Mapping[str, Any]]) -> None:
        if label not in INTREE_ROUNDS:
            raise ValueError(f"unknown in-tree round {label!r}")
        self.label = label
        selector = webhook_selector(docs)
        self.compiled = compiled_default(excluded_namespaces(selector))
        self.manifests = chart_manifests(self.compiled, selector)
        self.webhooks = (with_condition(docs, self.compiled.webhook_condition)
                         if label == "envelope-intree" else [])


def label_namespaces(kubeconfig: Path) -> dict[str, str | None]:
    """One round of the namespace-fact keeper against the bench's API server: the changes
    it wrote."""
    client = KubeClient(kube_configuration(str(kubeconfig)))
    namespace, name = DEFAULT_FACT_LEASE
    try:
        client.request("POST", "/api/v1/namespaces", {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    except ApiError as exc:
        if exc.status != 409:  # already there
            raise
    lease = FactLease(client, namespace, name, "envelope-bench", duration=LEASE_SECONDS)
    return FactKeeper(client, lease=lease).run_once()


LEASE_SECONDS = 6 * 3600
"""The bench's Lease outlasts its rounds (``make bench-peers`` takes ~40 minutes): no
keeper renews it while they run."""
