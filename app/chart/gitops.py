"""``envelope gitops-config``: the Argo CD and Flux settings a GitOps cluster needs with
Envelope in the path, generated from the rule set so they stay true.

Which fields Envelope's mutating rules change is found by running the rule set's
enforced mutate phase on probe workloads of every kind the mutating rules judge and
reading the JSON patch it answers. A path the patch *removes* or *replaces* is one git
holds and the cluster does not: Argo CD's default (three-way) diff shows it as drift for
ever; a path it only *adds* is not in git, and no Argo CD diff mode counts it. The
Application that installs Envelope also ignores ``.webhooks[].failurePolicy`` (with
``RespectIgnoreDifferences=true``), and Flux the same fields, since a re-apply of the
rendered ``Ignore`` would lower what a ready replica raised (``app.serve.failurepolicy``).

What each diff mode shows, measured on the real API server (``e2e/test_gitops_drift.py``,
``e2e/test_gitops_failurepolicy.py``), and the settings to use: docs/gitops.md.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from typing import Any

import yaml

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import evaluate
from app.core.ruleset import RuleSet
from app.k8s.jsonpatch import tokens as pointer_tokens
from app.k8s.podspec import POD_SPEC_PATHS
from app.rules.base import Subject

__all__ = ["WEBHOOKS", "Touched", "add_parser", "argocd_config", "flux_config", "run_gitops_config",
           "touched_paths"]

WEBHOOKS: dict[str, tuple[str, ...]] = {
    "MutatingWebhookConfiguration": ("workloads.mutate.envelope.io",),
    "ValidatingWebhookConfiguration": ("workloads.validate.envelope.io",
                                       "quotas.validate.envelope.io",
                                       "actors.validate.envelope.io"),
}
"""The chart's webhooks per configuration, in the order ``templates/webhooks.yaml``
renders them with every family on (tests/chart/test_gitops_config.py checks it against
``helm template``): Flux's ignore rules are JSON pointers, which have no wildcard."""

_API = {"": "v1", "apps": "apps/v1", "batch": "batch/v1"}


@dataclass(frozen=True)
class Touched:
    """One field Envelope's mutating rules change, for one kind."""

    group: str
    kind: str
    path: str
    """jq-style: ``.spec.template.spec.containers[]?.resources.limits.cpu``."""
    op: str
    """``remove``/``replace`` (git holds a value the cluster does not) or ``add``."""
    rules: tuple[str, ...]


def _container(name: str, resources: dict[str, Any], env: list[dict[str, str]] | None = None
               ) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "probe", "resources": resources}
    if env:
        out["env"] = env
    return out


def _probe_specs(policy: Policy) -> list[dict[str, Any]]:
    """Pod specs on which every mutating rule has something to do: container, init
    container and restartable sidecar resources, a string envelope in each, and
    (separately) pod-level resources."""
    envelope = [{"name": policy.envelope_env.limits, "value": "cpu=1,memory=1Gi"}]
    sidecar = {**_container("s", {"limits": {"cpu": "1", "memory": "1Gi"}}, envelope),
               "restartPolicy": "Always"}
    return [
        {"containers": [_container("c", {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}},
                                   envelope)],
         # the string envelope is rewritten in init containers and restartable sidecars
         # too (issue 37: their env was missing from the ignore rules)
         "initContainers": [_container("i", {"limits": {"cpu": "1", "memory": "1Gi"},
                                             "requests": {"cpu": "1", "memory": "1Gi"}},
                                       envelope), sidecar]},
        {"containers": [_container("c", {})],
         "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1"}}},
        # a memory request below its limit (memory-below-limit, with memoryBelowLimit)
        {"containers": [_container("c", {"limits": {"memory": "2Gi"},
                                         "requests": {"memory": "1Gi"}})],
         "initContainers": [_container("i", {"limits": {"memory": "2Gi"},
                                             "requests": {"memory": "1Gi"}})],
         "resources": {"limits": {"memory": "2Gi"}, "requests": {"memory": "1Gi"}}},
    ]


def _probe(group: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": _API.get(group, f"{group}/v1"), "kind": kind,
                           "metadata": {"name": "probe", "namespace": "probe"}}
    node = obj
    path = POD_SPEC_PATHS[(group, kind)]
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = spec
    return obj


def _leaves(path: list[str], value: Any) -> list[list[str]]:
    """An ``add`` of a map adds each of its leaves (``/metadata/annotations`` with one key)."""
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaves([*path, key], item)]
    return [path]


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _jq(tokens: list[str], obj: dict[str, Any]) -> str:
    """A JSON pointer of the probe as a jq path over every object of its kind: list
    items by position become ``[]?`` (every container), env entries ``select`` by name."""
    out, node = "", obj  # type: tuple[str, Any]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if isinstance(node, list):
            item = node[int(token)]
            if isinstance(item, dict) and "value" in item and "name" in item and \
                    "image" not in item:
                out += f'[]? | select(.name == "{item["name"]}") | '
            else:
                out += "[]?"
            node = item
        else:
            out += f".{token}" if _IDENT.match(token) else f'["{token}"]'
            node = node.get(token) if isinstance(node, dict) else None
        i += 1
    return out


def touched_paths(rules: RuleSet, policy: Policy) -> list[Touched]:
    """Every field the enforced mutating rules change, per kind, from their own patches."""
    view = StaticView(indexes=rules.indexes)
    choice = policy.memory_below_limit
    if choice is not None:  # the probes' namespace stands for every namespace it selects
        policy = policy.model_copy(update={"memory_below_limit": choice.model_copy(
            update={"namespaces": ["*"], "namespace_selector": None})})
    found: dict[tuple[str, str, str], tuple[str, set[str]]] = {}
    kinds = sorted({k for rule in rules.values() if rule.phase == "mutate" for k in rule.kinds
                    if k in POD_SPEC_PATHS})
    for group, kind in kinds:
        for spec in _probe_specs(policy):
            obj = _probe(group, kind, spec)
            subject = Subject(group, _API.get(group, "v1").rsplit("/", 1)[-1], kind, "CREATE",
                              "probe", "probe", obj)
            result = evaluate(rules, subject, view, policy, "mutate")
            by_path = {c.path: c.rule for c in result.changes}
            for op in result.patch:
                tokens = pointer_tokens(op["path"])
                for leaf in _leaves(tokens, op.get("value")) if op["op"] == "add" else [tokens]:
                    path = _jq(leaf, obj)
                    dotted = ".".join(f"[{t}]" if t.isdigit() else t for t in leaf).replace(".[", "[")
                    rule = next((r for p, r in by_path.items() if dotted.startswith(p)
                                 or p.startswith(dotted)), "")
                    key = (group, kind, path)
                    kept = found.setdefault(key, (op["op"], set()))
                    if rule:
                        kept[1].add(rule)
    return [Touched(g, k, p, op, tuple(sorted(r))) for (g, k, p), (op, r) in sorted(found.items())]


def _dump(data: dict[str, Any], **kwargs: Any) -> str:
    return str(yaml.safe_dump(data, **kwargs))


def _prefix(t: Touched) -> str:
    return "".join(f".{key}" for key in POD_SPEC_PATHS[(t.group, t.kind)])


def _fullname(release: str) -> str:
    """The chart's fullname for a release (Helm's convention: a release whose name holds
    the chart's name is used as it is)."""
    return release if "envelope" in release else f"{release}-envelope"


def _header(flag: str) -> str:
    return (f"# Generated by `envelope gitops-config {flag}` from Envelope's rule set and policy\n"
            "# (docs/gitops.md; do not edit by hand).\n")


def argocd_config(rules: RuleSet, policy: Policy, release: str = "envelope") -> str:
    """Two Application fragments: for every Application that deploys workloads, and for
    the one that installs Envelope (chart release ``release``)."""
    touched = touched_paths(rules, policy)
    drift = [t for t in touched if t.op != "add"]
    by_kind: dict[tuple[str, str], list[str]] = {}
    for t in drift:
        by_kind.setdefault((t.group, t.kind), []).append(t.path)
    workloads = {"spec": {
        "ignoreDifferences": [{"group": g, "kind": k, "jqPathExpressions": paths}
                              for (g, k), paths in sorted(by_kind.items())],
        "syncPolicy": {"syncOptions": ["RespectIgnoreDifferences=true"]}}}
    name = _fullname(release)
    webhooks = {"spec": {
        "ignoreDifferences": [{"group": "admissionregistration.k8s.io", "kind": kind,
                               "name": name, "jqPathExpressions": [".webhooks[]?.failurePolicy"]}
                              for kind in WEBHOOKS],
        "syncPolicy": {"syncOptions": ["RespectIgnoreDifferences=true"]}}}
    fields = sorted({f"{t.path[len(_prefix(t)):]} ({', '.join(t.rules)})" for t in drift})
    return (_header("--argocd")
            + "#\n# 1. Every Application whose manifests hold fields Envelope removes or rewrites\n"
            "#    (under the pod spec: " + "; ".join(fields) + ").\n"
            "#    Argo CD's default diff shows them OutOfSync for ever; these entries leave them\n"
            "#    out of the diff, and RespectIgnoreDifferences=true leaves them out of a sync.\n"
            "#    Alternative without ignoreDifferences: the annotation\n"
            "#    argocd.argoproj.io/compare-options: ServerSideDiff=true (Server-Side Diff\n"
            "#    dry-runs through the webhook; in sync with or without IncludeMutationWebhook=true,\n"
            "#    as measured in docs/gitops.md).\n"
            "#    Fields Envelope only adds are never drift and are not listed.\n"
            + _dump(workloads, sort_keys=False, width=100)
            + "---\n# 2. The Application that installs Envelope's chart (release "
            f"{release!r}): the\n#    failurePolicy a ready replica raises is not reset by "
            "self-heal or a sync.\n"
            + _dump(webhooks, sort_keys=False, width=100))


def flux_config(release: str = "envelope") -> str:
    """The HelmRelease drift-detection rules for the chart's webhook configurations."""
    name = _fullname(release)
    ignore = [{"paths": [f"/webhooks/{i}/failurePolicy" for i in range(len(hooks))],
               "target": {"group": "admissionregistration.k8s.io", "kind": kind, "name": name}}
              for kind, hooks in WEBHOOKS.items()]
    release_spec = {"spec": {"driftDetection": {"mode": "enabled", "ignore": ignore}}}
    return (_header("--flux")
            + "#\n# Workloads: nothing to configure. kustomize-controller and helm-controller\n"
            "# compare a dry-run server-side apply with the live object, and the dry run goes\n"
            "# through Envelope's webhook like the real write, so a manifest Envelope mutates\n"
            "# is not drift (the mechanism `kubectl diff --server-side` uses).\n"
            "#\n# The HelmRelease that installs Envelope's chart (release "
            f"{release!r}), when drift\n# detection is on: it would put the rendered "
            "failurePolicy (Ignore) back.\n"
            + _dump(release_spec, sort_keys=False, width=100))


def add_parser(sub: Any) -> None:
    """``envelope gitops-config`` (registered by ``app.cli``)."""
    parser = sub.add_parser(
        "gitops-config", help="print the Argo CD or Flux settings for a cluster with Envelope",
        description="Print what Argo CD (ignoreDifferences, RespectIgnoreDifferences) or Flux "
                    "(HelmRelease driftDetection) needs so that the fields Envelope's mutating "
                    "rules change, and the failurePolicy a ready replica raises, are not "
                    "drift. Generated from the rule set and the policy (docs/gitops.md).")
    tool = parser.add_mutually_exclusive_group(required=True)
    tool.add_argument("--argocd", action="store_true", help="Argo CD Application fragments")
    tool.add_argument("--flux", action="store_true", help="a Flux HelmRelease fragment")
    parser.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                        help="policy file whose modes and names decide the fields "
                             "(env ENVELOPE_CONFIG)")
    parser.add_argument("--release", default="envelope",
                        help="the Helm release that installs Envelope (default: envelope)")


def run_gitops_config(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    print(argocd_config(rules, policy, args.release) if args.argocd else flux_config(args.release),
          end="")
    return 0
