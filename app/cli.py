"""``envelope serve`` and ``envelope check``."""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from app.cluster.static import LoadError, Manifest, load_manifests
from app.cluster.view import StaticView
from app.config import ConfigError, Policy, load_policy
from app.engine import Evaluation, check_object
from app.rules.base import Subject
from app.ruleset import RuleSet, default_ruleset

__all__ = ["main"]

KEEP_ALIVE_SECONDS = 120
"""How long an idle keep-alive connection stays open. Longer than the API server's webhook
client keeps one (90 s: k8s.io/client-go transport/cache.go takes http.DefaultTransport's
IdleConnTimeout), so the client always closes first. With uvicorn's default of 5 s the
server closed connections the API server was about to reuse, and a write failed with
"failed calling webhook: EOF" / "use of closed network connection" (seen 2 in ~600
creates at concurrency 20 in bench/apiserver.py)."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="envelope", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the admission webhook over HTTPS")
    serve.add_argument("--host", default=os.environ.get("ENVELOPE_HOST", "0.0.0.0"))
    serve.add_argument("--port", type=int, default=int(os.environ.get("ENVELOPE_PORT", 8443)))
    serve.add_argument("--cert-file", default=os.environ.get("ENVELOPE_CERT_FILE"))
    serve.add_argument("--key-file", default=os.environ.get("ENVELOPE_KEY_FILE"))
    serve.add_argument("--self-signed", action="store_true",
                       help="make a CA and serving certificate for localhost/127.0.0.1")
    serve.add_argument("--self-signed-dir", default=os.environ.get(
        "ENVELOPE_SELF_SIGNED_DIR", str(Path.home() / ".cache" / "envelope" / "self-signed")))
    serve.add_argument("--metrics-host", default=os.environ.get("ENVELOPE_METRICS_HOST"),
                       help="address for the metrics listener (default: --host)")
    serve.add_argument("--metrics-port", type=int,
                       default=int(os.environ.get("ENVELOPE_METRICS_PORT", 9090)),
                       help="plain-HTTP Prometheus port; 0 disables it")
    serve.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"))
    serve.add_argument("--log-level", default=os.environ.get("ENVELOPE_LOG_LEVEL", "info"))
    env = os.environ.get
    serve.add_argument("--tls-mode", choices=("files", "self"), default=env("ENVELOPE_TLS_MODE", "files"),
                       help="files: --cert-file/--key-file, reloaded on change; self: own CA in a "
                            "Secret, injected into the webhook configurations")
    serve.add_argument("--namespace", default=env("POD_NAMESPACE"))
    serve.add_argument("--service-name", default=env("ENVELOPE_SERVICE_NAME"))
    serve.add_argument("--tls-secret", default=env("ENVELOPE_TLS_SECRET", "envelope-tls"))
    serve.add_argument("--tls-extra-san", action="append",
                       default=[s for s in env("ENVELOPE_TLS_EXTRA_SANS", "").split(",") if s])
    serve.add_argument("--mutating-webhook-configuration", dest="mutating_config",
                       default=env("ENVELOPE_MUTATING_WEBHOOK_CONFIGURATION"))
    serve.add_argument("--validating-webhook-configuration", dest="validating_config",
                       default=env("ENVELOPE_VALIDATING_WEBHOOK_CONFIGURATION"))
    serve.add_argument("--lease-name", default=env("ENVELOPE_LEASE_NAME", "envelope-leader"))
    serve.add_argument("--cert-validity-days", type=int, default=365)
    serve.add_argument("--ca-validity-days", type=int, default=3650)
    serve.add_argument("--renew-before-days", type=float, default=30)
    serve.add_argument("--tls-interval", type=float, default=5.0,
                       help="seconds between certificate checks (self mode)")
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

    check = sub.add_parser("check", help="run the rules over manifest files, offline")
    check.add_argument("-f", "--filename", action="append", required=True, dest="paths",
                       help="file, directory or - for stdin (repeatable)")
    check.add_argument("-o", "--output", choices=("human", "json"), default="human")
    check.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"))
    config = sub.add_parser("webhook-config",
                            help="print the mutating webhook's matchConditions for a policy "
                                 "(a strategic-merge patch for the chart's configuration)")
    config.add_argument("--config", default=os.environ.get("ENVELOPE_CONFIG"))
    config.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    return parser


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


def subject_of(obj: dict[str, Any]) -> Subject:
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    return Subject(group, version, str(obj.get("kind", "")), "CREATE",
                   str(meta.get("namespace") or ""), str(meta.get("name") or ""), obj)


def _entry(m: Manifest, subject: Subject, result: Evaluation) -> dict[str, Any]:
    return {"kind": subject.kind, "apiVersion": subject.api_version,
            "namespace": subject.namespace, "name": subject.name,
            "source": f"{m.source}#{m.document}",
            "findings": [f.as_dict() for f in result.findings],
            "patch": result.patch}


def run_check(paths: list[str], rules: RuleSet, policy: Policy, output: str) -> int:
    try:
        manifests = load_manifests(paths)
    except LoadError as exc:
        print(f"envelope check: {exc}", file=sys.stderr)
        return 2
    view = StaticView((m.obj for m in manifests), rules.indexes)
    gc.freeze()  # the parsed tenancy lives to the end: keep the collector from rescanning it
    entries = []
    failed = False
    for m in manifests:
        subject = subject_of(m.obj)
        result = check_object(rules, subject, view, policy)
        entry = _entry(m, subject, result)
        if result.internal_errors:
            entry["findings"].extend({"severity": "error", "rule": "internal", "path": "",
                                      "message": e} for e in result.internal_errors)
        failed = failed or any(f["severity"] == "error" for f in entry["findings"])
        entry["changes"] = [f.message for f in result.changes]
        entries.append(entry)
    if output == "json":
        for e in entries:
            e.pop("changes")
        sys.stdout.write(orjson.dumps(entries, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print_human(entries)
    return 1 if failed else 0


def _print_human(entries: list[dict[str, Any]]) -> None:
    errors = warnings = mutated = 0
    for e in entries:
        if not e["findings"] and not e["changes"]:
            continue
        where = f"{e['namespace']}/{e['name']}" if e["namespace"] else e["name"]
        print(f"{e['kind']} {where} ({e['source']})")
        for f in e["findings"]:
            print(f"  {f['severity']:<7} {f['rule']}: {f['message']}")
            errors += f["severity"] == "error"
            warnings += f["severity"] == "warning"
        for change in e["changes"]:
            print(f"  change  {change}")
        mutated += bool(e["patch"])
    print(f"{len(entries)} objects: {errors} errors, {warnings} warnings, "
          f"{mutated} would be mutated")


def _cluster_view(args: argparse.Namespace, rules: RuleSet) -> tuple[Any, dict[str, Any]]:
    """The live view (started) of what the rules read, and its readiness check, or an
    empty static view."""
    import logging

    from app.cluster.kube import kube_configuration
    from app.cluster.live import LiveView, resources_for

    log = logging.getLogger("envelope")
    if args.cluster_view == "none":
        return StaticView(indexes=rules.indexes), {}
    try:
        configuration = kube_configuration(args.kubeconfig)
    except Exception as exc:
        if args.cluster_view == "live":
            print(f"envelope serve: no cluster configuration: {exc}", file=sys.stderr)
            return None, {}
        log.warning("no cluster configuration; rules see an empty cluster",
                    extra={"fields": {"reason": str(exc)[:200]}})
        return StaticView(indexes=rules.indexes), {}
    view = LiveView(configuration, resources_for(rules.reads), staleness=args.staleness,
                    indexes=rules.indexes)
    view.start()
    log.info("watching the cluster", extra={"fields": {"host": configuration.host}})
    return view, {"cluster view": view.problems}


def _tls(args: argparse.Namespace, metrics: Any) -> tuple[Any, dict[str, Any]] | None:
    """The server's TLS state and its readiness check, per ``--tls-mode``."""
    import datetime as dt
    import socket

    from app.certs import LeaseElector, SelfManaged
    from app.cluster.kube import KubeClient, kube_configuration
    from app.tls import FileWatcher, KeyPair, TlsState, write_self_signed

    state = TlsState(on_load=lambda when: metrics.cert_expiry.set(when.timestamp()))
    if args.self_signed:
        paths = write_self_signed(Path(args.self_signed_dir))
        print(f"CA certificate: {paths.ca}", flush=True)
        args.cert_file, args.key_file = str(paths.cert), str(paths.key)
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
    client = KubeClient(kube_configuration(args.kubeconfig))
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
        renew_before=dt.timedelta(days=args.renew_before_days), interval=args.tls_interval)
    for _ in range(30):  # a certificate before serving, if the API server lets us
        manager.step()
        if state.cert_pem is not None:
            break
        time.sleep(2)
    manager.start()
    return state, {"certificate": manager.problems}


def run_serve(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    import uvicorn
    from prometheus_client import start_http_server

    from app.logs import setup_logging
    from app.server import Metrics, create_app

    setup_logging(args.log_level)
    metrics = Metrics()
    tls = _tls(args, metrics)
    if tls is None:
        return 2
    state, checks = tls
    view, view_checks = _cluster_view(args, rules)
    if view is None:
        return 2
    app = create_app(rules, policy, view, ready_checks={**checks, **view_checks}, metrics=metrics)
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.metrics_host or args.host,
                          registry=metrics.registry)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_config=None,
                            access_log=False, server_header=False,
                            timeout_keep_alive=KEEP_ALIVE_SECONDS,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    config.load()
    config.ssl = state.context
    uvicorn.Server(config).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    rules = default_ruleset()
    try:
        policy = load_policy(args.config, None, rules)
    except ConfigError as exc:
        print(f"envelope: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "check":
        return run_check(args.paths, rules, policy, args.output)
    if args.command == "webhook-config":
        return run_webhook_config(rules, policy, args.output)
    return run_serve(args, rules, policy)


if __name__ == "__main__":
    sys.exit(main())
