"""The rule reference: ``envelope rules``, ``envelope explain RULE`` and ``envelope
webhook-config`` (the matchConditions a policy needs)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from app.core.config import Policy, did_you_mean
from app.core.ruleset import RuleSet


def _reference_parsers(sub: Any) -> None:
    from app.ruledocs import FAMILIES

    listing = sub.add_parser(
        "rules", help="list every rule with its family, phase and default mode",
        description="List Envelope's rules: id, family, phase (mutate or validate), default "
                    "mode and what each checks. Each has a page in docs/rules/ and `envelope "
                    "explain RULE`.")
    listing.add_argument("-o", "--output", choices=("text", "json"), default="text",
                         help="text (a table) or json (with a schemaVersion)")
    listing.add_argument("--family", choices=sorted(set(FAMILIES.values())),
                         help="only the rules of this family (default: all)")
    explain = sub.add_parser(
        "explain", help="print a rule's page: what, why, an example and its fix, modes",
        description="Print the reference page of one rule (docs/rules/RULE.md): what it "
                    "checks, why, an example that fails and its fix with Envelope's answers, "
                    "its modes and what it reads. Exit 2 for an unknown rule id.")
    explain.add_argument("rule", metavar="RULE", help="a rule id, as `envelope rules` lists them")


RULES_SCHEMA_VERSION = 1
"""Version of ``envelope rules -o json``: raised when a field changes meaning or goes."""


def run_rules(rules: RuleSet, output: str, family_name: str | None) -> int:
    from app.ruledocs import family, help_uri

    listed = sorted((r for r in rules.values() if family_name in (None, family(r))),
                    key=lambda r: (family(r), r.phase, r.id))
    if output == "json":
        sys.stdout.write(orjson.dumps({"schemaVersion": RULES_SCHEMA_VERSION, "rules": [
            {"id": r.id, "family": family(r), "phase": r.phase, "defaultMode": r.default_mode.value,
             "summary": r.summary, "operations": sorted(r.operations),
             "kinds": [{"group": g, "kind": k} for g, k in sorted(r.kinds)],
             "reads": sorted(r.reads), "helpUri": help_uri(r.id)} for r in listed]},
            option=orjson.OPT_INDENT_2).decode() + "\n")
        return 0
    header = ("RULE", "FAMILY", "PHASE", "DEFAULT", "SUMMARY")
    rows = [(r.id, family(r), r.phase, r.default_mode.value, r.summary) for r in listed]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(4)]
    for row in (header, *rows):
        cells = [c.ljust(w) for c, w in zip(row[:4], widths, strict=True)]
        sys.stdout.write("  ".join([*cells, row[4]]) + "\n")
    sys.stdout.write(f"{len(rows)} rules; `envelope explain RULE` prints a rule's page\n")
    return 0


FIELDS_PAGE = """\
# fields — strict field validation (envelope check only; not a rule of the policy)

What: an object has a field its kind does not have (`resource:` for `resources:`,
`gaurantee:`), a field of the wrong type in its metadata, or a kind or version a built-in
API group does not serve. The API server refuses such a write with `kubectl apply`
(`strict decoding error: unknown field ...`), before any admission webhook runs.

Why: `envelope check` reads files, so without this a typo passes the pull request and
fails at apply time, or (with --validate=false) is silently dropped. Built-in kinds are
checked against the API server's own field structure (app/cluster/data/fieldschema.json.gz);
the custom resources Envelope judges (KAI NodePool, Department, Project, Queue;
agent-substrate ActorTemplate, WorkerPool) against their published CRD schemas
(app/cluster/data/crdschema.json.gz). Other custom resources are not checked.

Fix: correct or remove the field the finding names (it suggests the nearest known name).

Modes: --validate strict (default; the object is refused and not judged), warn (a warning,
the object judged without the field, as the server stores it), ignore (dropped silently).
Metadata of the wrong type and unknown kinds are refused in every mode.
"""
"""``envelope explain fields``: what check's ``fields`` findings are (app/cluster/fieldschema.py)."""


def run_explain(rules: RuleSet, rule_id: str) -> int:
    from app.cluster.fieldschema import FIELDS_RULE
    from app.ruledocs import page

    if rule_id == FIELDS_RULE:
        sys.stdout.write(FIELDS_PAGE)
        return 0
    if rule_id not in rules:
        print(f"envelope explain: unknown rule id {rule_id!r}{did_you_mean(rule_id, rules)}; "
              f"`envelope rules` lists them", file=sys.stderr)
        return 2
    sys.stdout.write(page(rules[rule_id], rules))
    return 0


VALIDATING_WEBHOOK = "workloads.validate.envelope.io"
"""The chart's validating webhook for workloads (templates/webhooks.yaml), the first entry
of its ValidatingWebhookConfiguration."""


def run_webhook_config(rules: RuleSet, policy: Policy, output: str, *, in_tree: bool = False,
                       excluded: Sequence[str] = (), split_patch: str | None = None) -> int:
    from app.chart.matchconditions import UnknownRule, webhook_config_patch
    docs: list[dict[str, Any]]
    try:
        if in_tree:
            from app.intree import NotCompilable, compile_in_tree
            from app.intree.validating import compile_validating, webhook_json_patch
            try:
                compiled = compile_in_tree(rules, policy,
                                           excluded_namespaces=["kube-system", *excluded])
            except NotCompilable as exc:
                print(f"envelope: {exc}", file=sys.stderr)
                return 2
            validating = compile_validating(rules, policy,
                                            excluded_namespaces=["kube-system", *excluded])
            docs = [*compiled.manifests, *validating.manifests, compiled.webhook_patch()]
            split = webhook_json_patch(validating, VALIDATING_WEBHOOK)
            if split and split_patch is None:
                print(f"envelope: {', '.join(validating.warned)} in warn mode: the validating "
                      f"webhook must be split so that it does not warn again where the policy "
                      f"warns; pass --split-patch PATH to write that patch (kubectl patch "
                      f"validatingwebhookconfiguration <name> --type=json --patch-file PATH)",
                      file=sys.stderr)
                return 2
            if split_patch is not None:
                Path(split_patch).write_bytes(orjson.dumps(split, option=orjson.OPT_INDENT_2) + b"\n")
            for rule_id, why in {**compiled.not_compiled, **validating.not_compiled}.items():
                print(f"envelope: {rule_id} stays in the webhook: {why}", file=sys.stderr)
        else:
            docs = [webhook_config_patch(rules, policy)]
    except UnknownRule as exc:
        print(f"envelope: {exc}", file=sys.stderr)
        return 2
    if output == "json":
        body: Any = docs[0] if len(docs) == 1 else {"apiVersion": "v1", "kind": "List",
                                                    "items": docs}
        sys.stdout.write(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        import yaml
        sys.stdout.write(yaml.safe_dump_all(docs, sort_keys=False, width=1 << 20))
    return 0
