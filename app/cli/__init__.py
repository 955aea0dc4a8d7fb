"""``envelope serve`` and ``envelope check``."""

from __future__ import annotations

import argparse
import gc
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import orjson

from app.cluster.static import Manifest, load
from app.cluster.view import StaticView
from app.config import ConfigError, Policy, did_you_mean, load_policy
from app.engine import check_object
from app.exemptions import needs_namespaces
from app.httplimits import add_arguments as add_limit_arguments
from app.httplimits import limits_from_args, uvicorn_options
from app.quotaview.command import add_parser as quotaview_parser
from app.quotaview.command import run as run_quotaview
from app.render import FORMATS, render, render_input_errors
from app.reports import FailOn, ObjectResult, Report, not_evaluated
from app.rules.base import Finding, Severity, Subject
from app.ruleset import RuleSet, default_ruleset
from app.substrate import as_crd_template, is_current_template, read_current_template

__all__ = ["main"]


class _Help(argparse.HelpFormatter):
    """Every flag's help ends with its default, unless the text already gives it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (not action.option_strings or "default" in text or action.default is None
                or action.default is argparse.SUPPRESS or action.default in (False, [], "")):
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for mistyped subcommands and choices."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        match = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if match:
            message += did_you_mean(match[1], re.findall(r"'([^']*)'", match[2]))
        super().error(message)


def _refuse_unknown(parser: argparse.ArgumentParser, args: argparse.Namespace,
                    extra: list[str]) -> NoReturn:
    """Unknown arguments, refused with the usage of the subcommand they were given to (not
    the top level's) and the closest flag that subcommand has."""
    sub = _subcommands(parser).get(args.command, parser)
    flags = [o for action in sub._actions for o in action.option_strings]
    first = next((a.split("=", 1)[0] for a in extra if a.startswith("-")), extra[0])
    sub.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(first, flags)}")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="envelope", description=(
        "Envelope: a Kubernetes admission webhook that strips CPU limits while keeping memory "
        "request = limit, and rejects GPU quota trees and actor sandboxes that cannot hold. "
        "`envelope serve` runs the webhook; `envelope check` runs the same rules over files; "
        "`envelope audit` judges what a cluster holds; `envelope fix` writes the webhook's "
        "mutations into manifest files (`envelope krm-fn` inside kustomize or kpt); "
        "`envelope webhook-config` prints the "
        "webhook configuration a policy needs; `envelope rules` and `envelope explain RULE` "
        "are the rule reference."))
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, title="commands")

    serve = sub.add_parser("serve", help="run the admission webhook over HTTPS",
                           description="Run the admission webhook: POST /mutate and /validate "
                                       "over HTTPS, /healthz and /readyz, metrics on a "
                                       "separate plain-HTTP port (docs/deploy.md).")
    serve.add_argument("--host", default=os.environ.get("ENVELOPE_HOST", "0.0.0.0"),
                       help='address to serve HTTPS on (env ENVELOPE_HOST)')
    serve.add_argument("--port", type=int, default=int(os.environ.get("ENVELOPE_PORT", 8443)),
                       help='HTTPS port for /mutate, /validate, /healthz, /readyz (env ENVELOPE_PORT)')
    serve.add_argument("--cert-file", default=os.environ.get("ENVELOPE_CERT_FILE"),
                       help='serving certificate (PEM), reloaded when it changes (env ENVELOPE_CERT_FILE)')
    serve.add_argument("--key-file", default=os.environ.get("ENVELOPE_KEY_FILE"),
                       help='its private key (PEM) (env ENVELOPE_KEY_FILE)')
    serve.add_argument("--self-signed", action="store_true",
                       help="make a CA and serving certificate for localhost/127.0.0.1")
    serve.add_argument("--self-signed-dir", default=os.environ.get(
        "ENVELOPE_SELF_SIGNED_DIR", str(Path.home() / ".cache" / "envelope" / "self-signed")),
        help="where --self-signed keeps its CA and pair")
    serve.add_argument("--metrics-host", default=os.environ.get("ENVELOPE_METRICS_HOST"),
                       help="address for the metrics listener (default: --host)")
    serve.add_argument("--metrics-port", type=int,
                       default=int(os.environ.get("ENVELOPE_METRICS_PORT", 9090)),
                       help="plain-HTTP Prometheus port; 0 disables it")
    serve.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                       help='policy file (docs/configuration.md) (env ENVELOPE_CONFIG)')
    serve.add_argument("--log-level", default=os.environ.get("ENVELOPE_LOG_LEVEL", "info"),
                       help="debug, info, warning or error; below info the per-review line is "
                            "off (env ENVELOPE_LOG_LEVEL)")
    env = os.environ.get
    serve.add_argument("--tls-mode", choices=("files", "self"), default=env("ENVELOPE_TLS_MODE", "files"),
                       help="files: --cert-file/--key-file, reloaded on change; self: own CA in a "
                            "Secret, injected into the webhook configurations")
    serve.add_argument("--namespace", default=env("POD_NAMESPACE"),
                       help="Envelope's namespace, for --tls-mode self (env POD_NAMESPACE)")
    serve.add_argument("--service-name", default=env("ENVELOPE_SERVICE_NAME"),
                       help="the Service in front of Envelope, for the certificate's names "
                            "(env ENVELOPE_SERVICE_NAME)")
    serve.add_argument("--tls-secret", default=env("ENVELOPE_TLS_SECRET", "envelope-tls"),
                       help='Secret holding the CA and serving pair in --tls-mode self')
    serve.add_argument("--tls-extra-san", action="append",
                       default=[s for s in env("ENVELOPE_TLS_EXTRA_SANS", "").split(",") if s],
                       help="another DNS name or IP for the certificate (repeatable)")
    serve.add_argument("--mutating-webhook-configuration", dest="mutating_config",
                       default=env("ENVELOPE_MUTATING_WEBHOOK_CONFIGURATION"),
                       help="MutatingWebhookConfiguration whose caBundle --tls-mode self keeps")
    serve.add_argument("--validating-webhook-configuration", dest="validating_config",
                       default=env("ENVELOPE_VALIDATING_WEBHOOK_CONFIGURATION"),
                       help="ValidatingWebhookConfiguration whose caBundle --tls-mode self keeps")
    serve.add_argument("--lease-name", default=env("ENVELOPE_LEASE_NAME", "envelope-leader"),
                       help='Lease the replicas elect the certificate manager with')
    serve.add_argument("--cert-validity-days", type=int, default=365,
                       help='serving certificate lifetime (--tls-mode self)')
    serve.add_argument("--ca-validity-days", type=int, default=3650,
                       help='CA lifetime (--tls-mode self)')
    serve.add_argument("--renew-before-days", type=float, default=30,
                       help='renew this many days before expiry (--tls-mode self)')
    serve.add_argument("--tls-interval", type=float, default=5.0,
                       help="seconds between certificate checks (self mode)")
    serve.add_argument("--ca-overlap-seconds", type=float, default=300.0,
                       help="after a CA rotation switched the serving certificate, keep the "
                            "old CA in the caBundle this long, then drop it (at least 4x "
                            "--tls-interval; a replica that has not read the Secret for half "
                            "of it reports not ready) (--tls-mode self)")
    serve.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                       help="read the cluster through this kubeconfig (default: in-cluster)")
    serve.add_argument("--cluster-view", choices=("auto", "live", "none"),
                       default=os.environ.get("ENVELOPE_CLUSTER_VIEW", "auto"),
                       help="live: watch the cluster (required in a pod); none: rules see an "
                            "empty cluster; auto: live when a cluster is reachable by config")
    serve.add_argument("--staleness", type=float, default=60.0,
                       help="seconds a lost watch is tolerated before readiness fails and "
                            "rules that read it answer per the failure mode")
    serve.add_argument("--shutdown-timeout", type=int, default=10,
                       help="seconds to let in-flight reviews finish on SIGTERM")
    serve.add_argument("--client-ca-file", default=env("ENVELOPE_CLIENT_CA_FILE"),
                       help="require a client certificate that chains to this PEM CA bundle "
                            "(mTLS; off by default). Read at start")
    serve.add_argument("--client-names", default=env("ENVELOPE_CLIENT_NAMES", ""),
                       help="with --client-ca-file: comma-separated names (subject CN or "
                            "DNS/URI/IP SAN) a client certificate must carry, e.g. "
                            "kube-apiserver; empty: any certificate from the CA")
    serve.add_argument("--caller-token", choices=("off", "warn", "enforce"),
                       default=env("ENVELOPE_CALLER_TOKEN", "off"),
                       help="KEP-6060 caller tokens (Kubernetes >= 1.37): check the Bearer token "
                            "of every review against the API server's keys and the webhook "
                            "configurations named by --validating/--mutating-webhook-configuration; "
                            "warn: count and log only; enforce: 401 without a good one "
                            "(env ENVELOPE_CALLER_TOKEN; docs/security.md)")
    add_limit_arguments(serve)

    check = sub.add_parser(
        "check", help="run the rules over manifest files, offline",
        description="Run Envelope's rules over manifests, read as kubectl reads them. Exit 0: "
                    "nothing at or above --fail-on; 1: findings at or above it; 2: unreadable "
                    "input or no Kubernetes objects found.")
    check.add_argument("paths", nargs="*", metavar="PATH",
                       help="file or directory to check, like -f")
    check.add_argument("-f", "--filename", action="append", default=[], dest="filenames",
                       metavar="PATH", help="file, directory (walked recursively) or - for "
                                            "stdin; repeatable")
    check.add_argument("-o", "--output", choices=FORMATS, default="text",
                       help="text (alias human), json, sarif (SARIF 2.1.0), junit (one testcase "
                            "per object) or github (workflow-command annotations)")
    check.add_argument("--fail-on", choices=("error", "warning", "change"), default="error",
                       help="lowest severity that makes the exit status 1 (default: error); "
                            "change: also any object the webhook would mutate (the files are "
                            "not what the cluster stores; `envelope fix` writes the changes)")
    check.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                       help="leave out files and directories whose path (relative to a walked "
                            "directory, or as given) or name matches GLOB; repeatable")
    check.add_argument("--allow-empty", action="store_true",
                       help="exit 0 instead of 2 when no Kubernetes objects are found")
    check.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                       help="policy file (rule modes, settings); default $ENVELOPE_CONFIG")
    check.add_argument("--kubeconfig", metavar="PATH",
                       help="also read Nodes, LimitRanges, ResourceQuotas, KAI trees and "
                            "WorkerPools from this cluster (one LIST each; api.ate.dev "
                            "ActorTemplates are placed against its WorkerPools); the files' "
                            "objects replace the cluster's of the same name")
    check.add_argument("--validate", choices=("strict", "warn", "ignore", "true", "false"),
                       default="strict",
                       help="field validation as kubectl apply --validate does it, from the "
                            "schemas of the Kubernetes version in app/data: strict (or true) "
                            "refuses an object with an unknown field, warn warns and judges it "
                            "without the field, ignore (or false) drops it silently; an unknown "
                            "kind of a built-in API group is refused in every mode")
    _audit_parser(sub)
    _fix_parsers(sub)
    quotaview_parser(sub)
    config = sub.add_parser(
        "webhook-config",
        help="print the mutating webhook's matchConditions for a policy",
        description="Print the mutating webhook's matchConditions for a policy, as a "
                    "strategic-merge patch for the chart's MutatingWebhookConfiguration: the "
                    "API server then sends only the writes some enabled rule could change.")
    config.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                        help="policy file whose modes decide the conditions (env ENVELOPE_CONFIG)")
    config.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                        help="yaml or json")
    _reference_parsers(sub)
    from app.gitops import add_parser as add_gitops_parser  # envelope gitops-config

    add_gitops_parser(sub)
    return parser


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


def _fix_parsers(sub: Any) -> None:
    """``envelope fix`` and ``envelope krm-fn`` (app/fix.py, app/krmfn.py)."""
    fix = sub.add_parser(
        "fix", help="rewrite manifests in place so they are what Envelope would store",
        description="Write the mutations `envelope check` reports into the manifest files "
                    "(only the changed values' bytes and the lines removed or added; "
                    "comments, order, quoting and layout kept), so the files in git are what "
                    "the cluster stores. Exit 0: written, or nothing to change; 1: with "
                    "--diff/--check, some file would change; 2: a file refused (Helm "
                    "template, unreadable, or a change that cannot be written in place).")
    fix.add_argument("paths", nargs="*", metavar="PATH",
                     help="file or directory (walked recursively); - reads stdin and writes "
                          "the fixed stream to stdout")
    fix.add_argument("-f", "--filename", action="append", default=[], dest="filenames",
                     metavar="PATH", help="file, directory or -; repeatable")
    shown = fix.add_mutually_exclusive_group()
    shown.add_argument("--diff", action="store_true",
                       help="print a unified diff of what would change; write nothing")
    shown.add_argument("--check", action="store_true",
                       help="write nothing; exit 1 when some file would change")
    fix.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                     help="leave out files and directories matching GLOB; repeatable")
    fix.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                     help="policy file (rule modes, settings); default $ENVELOPE_CONFIG")
    krm = sub.add_parser(
        "krm-fn", help="a KRM function (kustomize/kpt) applying Envelope's mutations",
        description="Read a KRM ResourceList on stdin (kustomize exec function, kpt fn), "
                    "write Envelope's mutations into its items and write the ResourceList, "
                    "with results, to stdout. Exit 1 when an item cannot be fixed.")
    krm.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"),
                     help="policy file (rule modes, settings); default $ENVELOPE_CONFIG")


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


def run_explain(rules: RuleSet, rule_id: str) -> int:
    from app.ruledocs import page

    if rule_id not in rules:
        print(f"envelope explain: unknown rule id {rule_id!r}{did_you_mean(rule_id, rules)}; "
              f"`envelope rules` lists them", file=sys.stderr)
        return 2
    sys.stdout.write(page(rules[rule_id], rules))
    return 0


def run_webhook_config(rules: RuleSet, policy: Policy, output: str) -> int:
    from app.matchconditions import UnknownRule, webhook_config_patch
    try:
        patch = webhook_config_patch(rules, policy)
    except UnknownRule as exc:
        print(f"envelope: {exc}", file=sys.stderr)
        return 2
    if output == "json":
        sys.stdout.write(orjson.dumps(patch, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        import yaml
        sys.stdout.write(yaml.safe_dump(patch, sort_keys=False, width=1 << 20))
    return 0


def _audit_parser(sub: Any) -> None:
    env = os.environ.get
    audit = sub.add_parser("audit", help="judge the objects in a cluster as they stand",
                           description="Judge the objects in a cluster as they stand (one LIST "
                                       "per kind): print the findings, or write PolicyReports "
                                       "(docs/audit.md). Exit 0 clean, 1 with findings, 2 when "
                                       "the cluster cannot be read.")
    audit.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                       help="the cluster to read (default: in-cluster)")
    audit.add_argument("-o", "--output", choices=("text", "json", "policyreport"),
                       default="text", help="text, json, or policyreport (the PolicyReport "
                                            "objects --write would apply, as YAML)")
    audit.add_argument("--config", default=env("ENVELOPE_CONFIG"),
                       help="policy file (rule modes, settings) (env ENVELOPE_CONFIG)")
    audit.add_argument("--include-owned", action="store_true",
                       help="also judge Pods, ReplicaSets and Jobs made by a controller")
    audit.add_argument("--write", action="store_true",
                       help="apply the PolicyReports to the cluster, delete outdated ones")
    audit.add_argument("--watch", action="store_true",
                       help="keep auditing: on start, on change and every --interval "
                            "(writes reports, serves metrics)")
    audit.add_argument("--interval", type=float, default=float(env("ENVELOPE_AUDIT_INTERVAL", 600)),
                       help="seconds between audits with --watch")
    audit.add_argument("--debounce", type=float, default=float(env("ENVELOPE_AUDIT_DEBOUNCE", 10)),
                       help="seconds without change before a change is audited")
    audit.add_argument("--metrics-host", default=env("ENVELOPE_METRICS_HOST", "0.0.0.0"),
                       help="address for the metrics listener with --watch (env "
                            "ENVELOPE_METRICS_HOST)")
    audit.add_argument("--metrics-port", type=int, default=int(env("ENVELOPE_METRICS_PORT", 9090)),
                       help="Prometheus port with --watch; 0 disables it")
    audit.add_argument("--log-level", default=env("ENVELOPE_LOG_LEVEL", "info"),
                       help="debug, info, warning or error (env ENVELOPE_LOG_LEVEL)")


def run_audit(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    from app.audit import AuditMetrics, Auditor, audit, policy_reports, summary_text, write_reports
    from app.cluster.kube import ApiError, KubeClient, kube_configuration

    try:
        client = KubeClient(kube_configuration(args.kubeconfig))
    except Exception as exc:
        print(f"envelope audit: no cluster configuration: {exc}", file=sys.stderr)
        return 2
    if args.watch:
        from prometheus_client import start_http_server

        from app.logs import setup_logging

        setup_logging(args.log_level)
        metrics = AuditMetrics()
        if args.metrics_port:
            start_http_server(args.metrics_port, addr=args.metrics_host,
                              registry=metrics.registry)
        Auditor(client, rules, policy, metrics, interval=args.interval,
                debounce=args.debounce, include_owned=args.include_owned).run()
        return 0
    try:
        found = audit(client, rules, policy, include_owned=args.include_owned)
        reports = policy_reports(found)
        if args.write:
            applied, deleted = write_reports(client, reports)
            print(f"envelope audit: {applied} reports applied, {deleted} deleted",
                  file=sys.stderr)
    except (ApiError, OSError, urllib3_errors()) as exc:
        print(f"envelope audit: the cluster refused or could not be reached: {exc}", file=sys.stderr)
        return 2
    if args.output == "policyreport":
        import yaml

        sys.stdout.write(yaml.safe_dump_all(reports, sort_keys=False))
    elif args.output == "json":
        sys.stdout.write(orjson.dumps(found.as_json(), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write(summary_text(found))
    return 1 if any(r.result in ("fail", "error") for r in found.results) else 0


def urllib3_errors() -> type[Exception]:
    import urllib3

    return urllib3.exceptions.HTTPError


def subject_of(obj: dict[str, Any]) -> Subject:
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return Subject(group, version, str(obj.get("kind", "")), "CREATE",
                   str(meta.get("namespace") or ""), str(meta.get("name") or ""), obj)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("envelope")
    except PackageNotFoundError:  # run from a source tree that was never installed
        import tomllib

        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


def _judged(m: Manifest, rules: RuleSet, view: StaticView, policy: Policy,
            before: list[Finding]) -> ObjectResult:
    """One manifest judged as a CREATE (mutate, then validate), with the findings
    strict field validation made before."""
    subject = subject_of(m.obj)
    return ObjectResult(subject.kind, subject.api_version, subject.namespace, subject.name,
                        m.source, m.document, m.line, check_object(rules, subject, view, policy),
                        before, m.line_of)


FIELDS_RULE = "fields"
"""The rule id of strict field validation's findings (not a rule of the rule set: the API
server decides it before admission, see app/fieldschema.py)."""


def _validate_fields(manifests: list[Manifest], validate: str
                     ) -> list[tuple[Manifest | ObjectResult, list[Finding]]]:
    """``kubectl apply --validate`` offline, per manifest in input order: the manifest to
    judge and its field warnings, or the refusal that replaces judging it. strict: an
    object with an unknown field is refused whole, as the API server refuses it, and is
    neither judged nor part of the cluster the rules see; warn: a warning per field and the
    object judged without them (what the server stores); ignore: dropped silently. An
    unknown kind or version of a built-in group is refused in every mode (kubectl cannot
    map it)."""
    from app.fieldschema import default_schema, prune

    schema = default_schema()
    out: list[tuple[Manifest | ObjectResult, list[Finding]]] = []
    for m in manifests:
        problems = schema.check(m.obj)
        fields_only = all(p.unknown_field for p in problems)
        if not problems or (validate == "ignore" and fields_only):
            out.append((replace(m, obj=prune(m.obj, problems)) if problems else m, []))
            continue
        severity: Severity = "warning" if validate == "warn" and fields_only else "error"
        advice = ("the API server drops it (--validate=warn)" if severity == "warning" else
                  "kubectl apply refuses the object (strict field validation); fix or remove "
                  "the field")
        findings = [Finding(severity, FIELDS_RULE, p.path,
                            f"{p.message}; {advice}" if p.unknown_field else p.message)
                    for p in problems]
        if severity == "warning":
            out.append((replace(m, obj=prune(m.obj, problems)), findings))
            continue
        raw_meta = m.obj.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        out.append((ObjectResult(str(m.obj.get("kind", "")), str(m.obj.get("apiVersion", "")),
                                 str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                                 m.source, m.document, m.line, before=findings,
                                 line_of=m.line_of), []))
    return out


ANY_NAMESPACE = "any namespace"
"""Where a substrate-API ActorTemplate is placed: it lives in an atespace, not a
namespace, and upstream's scheduler matches workers of every namespace."""


def _pools_anywhere(objects: list[dict[str, Any]], rules: RuleSet) -> StaticView:
    """Every ate.dev WorkerPool given in one namespace, named ``<ns>/<name>``; a later
    one replaces an earlier one of the same namespace and name (files over the cluster)."""
    pools = []
    for obj in objects:
        if obj.get("kind") != "WorkerPool" or not str(obj.get("apiVersion", "")).startswith("ate.dev/"):
            continue
        raw_meta = obj.get("metadata")
        meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
        name = f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
        pools.append({**obj, "metadata": {**meta, "namespace": ANY_NAMESPACE, "name": name}})
    return StaticView(pools, rules.indexes)


def _current_template_result(m: Manifest, manifests: list[Manifest], pools: StaticView,
                             rules: RuleSet, policy: Policy) -> ObjectResult:
    """An ``api.ate.dev`` ActorTemplate (or ActorTemplateVersion), converted before the
    engine runs into the ``ate.dev`` ActorTemplate the rules judge (``app.substrate``):
    what the conversion could not read becomes ``actor-limits`` findings given to the
    engine, so that rule's mode and the exemptions apply to them as to its own. The
    document's labels and annotations are kept, for exceptions and the exemption
    annotation."""
    obj = m.obj
    selector_from = None
    if obj.get("kind") == "ActorTemplateVersion":
        parent = obj.get("actorTemplate")
        wanted = parent.get("name") if isinstance(parent, dict) else None
        selector_from = next((o.obj for o in manifests if is_current_template(o.obj)
                              and o.obj.get("kind") == "ActorTemplate"
                              and (o.obj.get("metadata") or {}).get("name") == wanted), None)
    template = read_current_template(obj, selector_from)
    crd = as_crd_template(template, ANY_NAMESPACE)
    meta = obj.get("metadata")
    for key in ("labels", "annotations"):
        found = meta.get(key) if isinstance(meta, dict) else None
        if isinstance(found, dict):
            crd["metadata"][key] = dict(found)
    subject = Subject("ate.dev", "v1alpha1", "ActorTemplate", "CREATE", ANY_NAMESPACE,
                      template.name, crd)
    unread = [Finding("error", ACTOR_LIMITS, p.split(":", 1)[0], p) for p in template.problems]
    return ObjectResult(template.kind, str(obj.get("apiVersion")), template.atespace,
                        template.name, m.source, m.document, m.line,
                        check_object(rules, subject, pools, policy, unread), line_of=m.line_of)


ACTOR_LIMITS = "actor-limits"
"""The rule a current-format template's unreadable envelope is reported under."""


def _kinds(objects: list[dict[str, Any]]) -> set[str]:
    """The view names (``app.kinds``) of the kinds among ``objects``: a Karpenter
    NodePool is not KAI's."""
    from app.kinds import name_of, ref_of

    return {name_of(*ref_of(o)) for o in objects}


VALIDATE_ALIASES = {"true": "strict", "false": "ignore"}


def run_check(paths: list[str], rules: RuleSet, policy: Policy, output: str, *,
              fail_on: FailOn = "error",
              exclude: list[str] | None = None, allow_empty: bool = False,
              kubeconfig: str | None = None, validate: str = "strict") -> int:
    loaded = load(paths, exclude or ())
    if loaded.errors:
        errors = sorted(loaded.errors, key=lambda e: (e.source, e.document, e.line))
        for error in errors:
            print(f"envelope check: {error}", file=sys.stderr)
        sys.stdout.write(render_input_errors(output, errors))
        print(f"envelope check: {len(loaded.errors)} input problem(s); nothing was checked",
              file=sys.stderr)
        return 2
    manifests = loaded.manifests
    skipped = [(s.path, s.reason) for s in loaded.skipped]
    if not manifests:
        for path, reason in skipped[:20]:
            print(f"envelope check: skipped {path}: {reason}", file=sys.stderr)
        print(f"envelope check: no Kubernetes objects found in {' '.join(paths)}"
              + (f" ({len(skipped)} path(s) skipped)" if skipped else "")
              + ("" if allow_empty else "; exit 2 so that a wrong path does not pass"),
              file=sys.stderr)
        return 0 if allow_empty else 2
    fielded = _validate_fields(manifests, validate)
    manifests = [m for m, _ in fielded if isinstance(m, Manifest)]
    context: list[dict[str, Any]] = []
    if kubeconfig:
        from app.cluster.kube import KubeClient, kube_configuration
        from app.cluster.snapshot import context_kinds, merge, snapshot

        try:
            client = KubeClient(kube_configuration(kubeconfig))
        except Exception as exc:
            print(f"envelope check: cannot use --kubeconfig {kubeconfig}: {exc}", file=sys.stderr)
            return 2
        # What the webhook watches: the kinds the rules read (and Namespaces when the
        # policy's exceptions select namespaces by label).
        live = snapshot(client, context_kinds(
            rules.reads | ({"Namespace"} if needs_namespaces(policy) else set())))
        if live.problems:
            for problem in live.problems:
                print(f"envelope check: {problem}", file=sys.stderr)
            return 2
        context = merge(live.objects, (m.obj for m in manifests))
    view = StaticView(context or (m.obj for m in manifests), rules.indexes)
    gc.freeze()  # the parsed tenancy lives to the end: keep the collector from rescanning it
    objects = []
    pools: StaticView | None = None
    for m, field_findings in fielded:
        if isinstance(m, ObjectResult):  # refused by strict field validation
            objects.append(m)
            continue
        if is_current_template(m.obj):  # api.ate.dev: placed against every namespace's pools
            if pools is None:
                pools = _pools_anywhere([*context, *(o.obj for o in manifests)], rules)
            objects.append(_current_template_result(m, manifests, pools, rules, policy))
            continue
        objects.append(_judged(m, rules, view, policy, field_findings))
    declared = list(rules.values())
    report = Report(objects, declared,
                    not_evaluated(declared, ((o.api_version.rpartition("/")[0], o.kind)
                                          for o in objects),
                                  present=_kinds(context)),
                    skipped, _version())
    return _report(report, output, fail_on)


def _report(report: Report, output: str, fail_on: FailOn) -> int:
    """Write the report in ``output`` (a renderer of ``app.render``) and return the exit
    status ``--fail-on`` gives it: the seam for what is reported and what fails."""
    sys.stdout.write(render(report, output, fail_on))
    return 1 if report.failed(fail_on) else 0


def _cluster_view(args: argparse.Namespace, rules: RuleSet, policy: Policy,
                  configuration: Any, where: str) -> tuple[Any, dict[str, Any]]:
    """The live view (started) of what the rules read, and its readiness check, or an
    empty static view (``none``, or ``auto`` with no cluster configuration at all —
    said in a WARNING line). (None, {}) when ``live`` has no cluster to watch."""
    import logging

    from app.cluster.live import LiveView, resources_for

    log = logging.getLogger("envelope")
    if args.cluster_view == "none":
        return StaticView(indexes=rules.indexes), {}
    if configuration is None:
        if args.cluster_view == "live":
            print(f"envelope serve: --cluster-view live needs a cluster configuration: {where}",
                  file=sys.stderr)
            return None, {}
        log.warning("--cluster-view auto found no cluster configuration: the rules see an "
                    "EMPTY cluster (as --cluster-view none), so checks that read quotas, "
                    "LimitRanges, Nodes or queues allow what they cannot see; give "
                    "--kubeconfig or run in a pod for a live view, or say --cluster-view none",
                    extra={"fields": {"clusterView": "none", "reason": where}})
        return StaticView(indexes=rules.indexes), {}
    kinds = rules.reads | ({"Namespace"} if needs_namespaces(policy) else set())
    view = LiveView(configuration, resources_for(kinds), staleness=args.staleness,
                    indexes=rules.indexes)
    view.start()
    log.info("watching the cluster", extra={"fields": {"host": configuration.host,
                                                       "from": where}})
    return view, {"cluster view": view.problems}


def _tls(args: argparse.Namespace, metrics: Any, configuration: Any, where: str,
         after_start: list[Any]) -> tuple[Any, dict[str, Any]] | None:
    """The server's TLS state and its readiness check, per ``--tls-mode``. What must
    wait until the server is listening (writing new ``--self-signed`` files, watching
    them) is appended to ``after_start``: a start that fails before leaves the files it
    found as they were."""
    import datetime as dt
    import logging
    import socket

    from app.certs import LeaseElector, SelfManaged
    from app.cluster.kube import KubeClient
    from app.tls import (
        SELF_SIGNED_NAMES,
        FileWatcher,
        KeyPair,
        TlsState,
        client_ca_problem,
        issue_serving,
        make_ca,
        reusable_self_signed,
        save_self_signed,
    )

    client_ca: bytes | None = None
    client_names = frozenset(n.strip() for n in (args.client_names or "").split(",") if n.strip())
    if args.client_ca_file:
        try:
            client_ca = Path(args.client_ca_file).read_bytes()
        except OSError as exc:
            print(f"envelope serve: cannot read --client-ca-file {exc.filename}: {exc.strerror}",
                  file=sys.stderr)
            return None
        problem = client_ca_problem(client_ca)
        if problem:
            print(f"envelope serve: --client-ca-file {args.client_ca_file}: {problem}",
                  file=sys.stderr)
            return None
    elif client_names:
        print("envelope serve: --client-names needs --client-ca-file (the names are checked "
              "on a verified client certificate)", file=sys.stderr)
        return None
    state = TlsState(on_load=lambda when: metrics.cert_expiry.set(when.timestamp()),
                     client_ca=client_ca, client_names=client_names)
    if args.self_signed:
        directory = Path(args.self_signed_dir)
        found = reusable_self_signed(directory)
        if isinstance(found, str):
            logging.getLogger("envelope").info(
                "making a new self-signed CA and serving certificate; written once the "
                "server listens", extra={"fields": {"directory": str(directory),
                                                    "reason": found}})
            ca = make_ca()
            serving = issue_serving(ca, SELF_SIGNED_NAMES)
            if not state.load(serving):
                print("envelope serve: cannot load the new self-signed certificate (see the "
                      "log line above)", file=sys.stderr)
                return None

            def save() -> None:
                paths = save_self_signed(directory, ca, serving)
                print(f"CA certificate: {paths.ca}", flush=True)
                watcher = FileWatcher(state, paths.cert, paths.key)
                watcher.check()
                watcher.start()

            after_start.append(save)
            return state, {"certificate": state.problems}
        print(f"CA certificate: {found.ca}", flush=True)
        args.cert_file, args.key_file = str(found.cert), str(found.key)
    if args.tls_mode == "files" or args.self_signed:
        if not (args.cert_file and args.key_file):
            print("envelope serve: give --cert-file and --key-file, --self-signed, or "
                  "--tls-mode self (the webhook serves HTTPS only)", file=sys.stderr)
            return None
        cert, key = Path(args.cert_file), Path(args.key_file)
        try:
            loaded = state.load(KeyPair(cert.read_bytes(), key.read_bytes()))
        except OSError as exc:
            loaded = False
            print(f"envelope serve: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        if not loaded:
            print(f"envelope serve: cannot load certificate {cert} / {key}", file=sys.stderr)
            return None
        watcher = FileWatcher(state, cert, key)
        watcher.check()
        watcher.start()
        return state, {"certificate": state.problems}
    if not (args.namespace and args.service_name):
        print("envelope serve: --tls-mode self needs --namespace and --service-name",
              file=sys.stderr)
        return None
    if configuration is None:
        print(f"envelope serve: --tls-mode self keeps its Secret and caBundle through the "
              f"API server, and there is no cluster configuration: {where}", file=sys.stderr)
        return None
    client = KubeClient(configuration)
    svc, ns = args.service_name, args.namespace
    names = [f"{svc}.{ns}.svc", svc, f"{svc}.{ns}", f"{svc}.{ns}.svc.cluster.local",
             *args.tls_extra_san]
    configs = [(r, n) for r, n in (("mutatingwebhookconfigurations", args.mutating_config),
                                   ("validatingwebhookconfigurations", args.validating_config))
               if n]
    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    manager = SelfManaged(
        client, state, ns, args.tls_secret, names, configs,
        LeaseElector(client, ns, args.lease_name, identity),
        cert_days=args.cert_validity_days, ca_days=args.ca_validity_days,
        renew_before=dt.timedelta(days=args.renew_before_days), interval=args.tls_interval,
        overlap=dt.timedelta(seconds=args.ca_overlap_seconds))
    for _ in range(30):  # a certificate before serving, if the API server lets us
        manager.step()
        if state.cert_pem is not None:
            break
        time.sleep(2)
    manager.start()
    metrics.leader.set_function(lambda: 1.0 if manager.leader else 0.0)
    return state, {"certificate": manager.problems}


def _raise_failure_policies(args: argparse.Namespace, checks: dict[str, Any],
                            configuration: Any, where: str, registry: Any = None) -> None:
    """With the webhook configurations named, raise their webhooks to the failurePolicy
    the chart recorded once this replica is ready and reachable through them
    (``app.failurepolicy``)."""
    configs = [(r, n) for r, n in (("mutatingwebhookconfigurations", args.mutating_config),
                                   ("validatingwebhookconfigurations", args.validating_config))
               if n]
    if not configs:
        return
    from app.cluster.kube import KubeClient
    from app.failurepolicy import PolicyMetrics, PolicyRaiser

    if configuration is None:  # no cluster: nothing to raise
        print(f"envelope serve: cannot raise failure policies: {where}", file=sys.stderr)
        return
    client = KubeClient(configuration)
    PolicyRaiser(client, configs, lambda: not any(check() for check in checks.values()),
                 metrics=PolicyMetrics(registry) if registry is not None else None).start()


def _caller_check(args: argparse.Namespace, metrics: Any, configuration: Any,
                  where: str) -> tuple[Any, dict[str, Any]] | None:
    """The KEP-6060 token check and its readiness check (None: cannot start it)."""
    from app.callerauth import CallerCheck, KeySource
    from app.cluster.kube import KubeClient

    configs = [(r, n) for r, n in (("mutatingwebhookconfigurations", args.mutating_config),
                                   ("validatingwebhookconfigurations", args.validating_config))
               if n]
    if configuration is None:
        print(f"envelope serve: --caller-token needs the API server (its keys): {where}",
              file=sys.stderr)
        return None
    client = KubeClient(configuration)
    source = KeySource(lambda path, accept: client.request("GET", path, timeout=5, accept=accept),
                       configs)
    source.start()
    metrics.caller_keys_read.set_function(lambda: source.trust.loaded if source.trust else 0.0)
    # Not ready without keys when enforcing (every review would get 401); warn mode never
    # costs availability.
    ready = {"caller tokens": source.problems} if args.caller_token == "enforce" else {}
    return CallerCheck(args.caller_token, source), ready


def _cluster_configuration(args: argparse.Namespace) -> tuple[Any, str]:
    """The cluster configuration every part of ``serve`` uses, decided once
    (``app.cluster.kube.serve_configuration``); raises ClusterConfigError."""
    from app.cluster.kube import serve_configuration

    uses = (args.cluster_view != "none" or args.tls_mode == "self"
            or args.caller_token != "off" or args.mutating_config or args.validating_config)
    if not uses:
        return None, "nothing in this start reads the cluster (--cluster-view none)"
    return serve_configuration(args.kubeconfig or None)


def run_serve(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    import uvicorn

    from app.cluster.kube import ClusterConfigError
    from app.logs import setup_logging
    from app.metrics_server import MetricsServer
    from app.server import Metrics, create_app
    from app.serving import Server

    setup_logging(args.log_level)
    try:
        configuration, where = _cluster_configuration(args)
    except ClusterConfigError as exc:
        print(f"envelope serve: {exc}; refusing to start rather than run without the "
              f"cluster it was given (rules would see an empty cluster)", file=sys.stderr)
        return 2
    metrics = Metrics()
    after_start: list[Any] = []
    tls = _tls(args, metrics, configuration, where, after_start)
    if tls is None:
        return 2
    state, checks = tls
    view, view_checks = _cluster_view(args, rules, policy, configuration, where)
    if view is None:
        return 2
    metrics.watches.view = view
    all_checks = {**checks, **view_checks}
    caller = None
    if args.caller_token != "off":
        made = _caller_check(args, metrics, configuration, where)
        if made is None:
            return 2
        caller, caller_checks = made
        all_checks.update(caller_checks)
    _raise_failure_policies(args, all_checks, configuration, where, metrics.registry)
    app = create_app(rules, policy, view, ready_checks=all_checks, metrics=metrics, caller=caller)
    if args.metrics_port:
        def failing() -> list[str]:
            return [f"{name}: {problem}" for name, check in all_checks.items() for problem in check()]

        MetricsServer(metrics.registry, args.metrics_host or args.host, args.metrics_port,
                      ready=failing).start()
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                            access_log=False, server_header=False,
                            timeout_graceful_shutdown=args.shutdown_timeout,
                            **uvicorn_options(limits_from_args(args),
                                              state.peer_allowed if args.client_ca_file else None,
                                              tls=state.context))
    config.load()
    server = Server(config, after_start)
    server.run()
    return server.exit_code


def _serve_problem(args: argparse.Namespace) -> str | None:
    """What would make ``serve`` fail at start, said before anything starts."""
    import logging
    import socket

    if not isinstance(logging.getLevelName(str(args.log_level).upper()), int):
        return (f"unknown log level {args.log_level!r}; use one of debug, info, warning, "
                f"error, critical")
    if args.tls_mode == "self" and args.ca_overlap_seconds < 4 * args.tls_interval:
        return (f"--ca-overlap-seconds {args.ca_overlap_seconds:g} is shorter than 4x "
                f"--tls-interval ({4 * args.tls_interval:g} s): replicas reload the Secret "
                f"every --tls-interval and must have done so before the old CA is dropped")
    if args.caller_token != "off" and not (args.validating_config or args.mutating_config):
        return ("--caller-token needs --validating-webhook-configuration and/or "
                "--mutating-webhook-configuration (a token must be bound to one of them)")
    ports = [(args.host, args.port, "--port")]
    if args.metrics_port:
        ports.append((args.metrics_host or args.host, args.metrics_port, "--metrics-port"))
    for host, port, flag in ports:
        if not port:
            continue
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (OSError, UnicodeError) as exc:
            return f"cannot listen on {host}:{port} ({flag}): {exc}"
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                return (f"cannot listen on {host}:{port} ({flag}): {exc.strerror or exc}; "
                        f"is another envelope (or anything else) using it?")
    return None


def _run_fix(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    if args.command == "krm-fn":
        from app.krmfn import run_krm_fn

        return run_krm_fn(rules, policy)
    from app.fix import run_fix

    paths = [*args.paths, *args.filenames]
    if not paths:
        print("envelope fix: give at least one file or directory (PATH, -f PATH, or - for stdin)",
              file=sys.stderr)
        return 2
    mode = "diff" if args.diff else "check" if args.check else "write"
    return run_fix(paths, rules, policy, mode=mode, exclude=args.exclude)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_unknown(parser, args, extra)
    rules = default_ruleset()
    if args.command == "rules":  # the reference reads declarations only, never a policy
        return run_rules(rules, args.output, args.family)
    if args.command == "explain":
        return run_explain(rules, args.rule)
    try:
        policy = load_policy(args.config, None, rules)
    except ConfigError as exc:
        print(f"envelope: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        paths = [*args.paths, *args.filenames]
        if not paths:
            print("envelope check: give at least one file or directory (PATH or -f PATH)",
                  file=sys.stderr)
            return 2
        try:
            return run_check(paths, rules, policy, args.output, fail_on=args.fail_on,
                             exclude=args.exclude, allow_empty=args.allow_empty,
                             kubeconfig=args.kubeconfig,
                             validate=VALIDATE_ALIASES.get(args.validate, args.validate))
        except Exception as exc:  # a bug of ours: say so in one line, the details on request
            if os.environ.get("ENVELOPE_DEBUG"):
                raise
            print(f"envelope check: internal error {type(exc).__name__}: {str(exc)[:300]} "
                  f"(a bug; ENVELOPE_DEBUG=1 shows the traceback)", file=sys.stderr)
            return 2
    if args.command == "audit":
        return run_audit(args, rules, policy)
    if args.command in ("fix", "krm-fn"):
        return _run_fix(args, rules, policy)
    if args.command == "quotas":
        return run_quotaview(args, rules, policy)
    if args.command == "webhook-config":
        return run_webhook_config(rules, policy, args.output)
    if args.command == "gitops-config":
        from app.gitops import run_gitops_config

        return run_gitops_config(args, rules, policy)
    problem = _serve_problem(args)
    if problem:
        print(f"envelope serve: {problem}", file=sys.stderr)
        return 2
    try:
        return run_serve(args, rules, policy)
    except KeyboardInterrupt:
        return 130
    except OSError as exc:  # a port taken between the check and the bind, an unreadable file
        print(f"envelope serve: {exc.strerror or exc}"
              + (f": {exc.filename}" if exc.filename else ""), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
