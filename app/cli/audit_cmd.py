"""``envelope audit``: its flags and the command (the audit itself is app/audit.py)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import orjson

from app.core.config import Policy
from app.core.ruleset import RuleSet


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

        from app.serve.logs import setup_logging

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
