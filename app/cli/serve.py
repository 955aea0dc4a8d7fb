"""``envelope serve``: its flags, the checks made before anything starts, and the start
(cluster configuration, cluster view, failure policies, uvicorn; TLS and caller tokens in
app/cli/serve_tls.py).

Why one module of ~436 lines: the flags, the checks made before anything starts and the
start itself read the same options in the same order (``_serve_problem`` refuses what
``run_serve`` could not start); TLS and caller tokens are already apart.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from app.cli.serve_tls import _caller_check, _tls, lease_elector
from app.cluster.view import StaticView
from app.core.config import ConfigError, Policy
from app.core.exemptions import EXCEPTION_KIND, needs_exceptions, needs_namespaces, watched_for
from app.core.ruleset import RuleSet
from app.serve.httplimits import add_arguments as add_limit_arguments
from app.serve.httplimits import limits_from_args, uvicorn_options


def _serve_parser(sub: Any) -> None:
    """``envelope serve``'s flags.

    Why one function of ~119 lines: the flag table, one ``add_argument`` each, read as the
    ``--help`` it prints (docs/deploy.md); the HTTP limits add theirs
    (``app/serve/httplimits.py``).
    """
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
    serve.add_argument("--policy-reload-interval", type=float,
                       default=float(os.environ.get("ENVELOPE_POLICY_RELOAD_INTERVAL", 2.0)),
                       help="seconds between checks of the --config file; a changed file "
                            "that loads replaces the policy for new reviews, a bad one is "
                            "refused with a log line and the old policy keeps serving "
                            "(env ENVELOPE_POLICY_RELOAD_INTERVAL)")
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
                       help='Lease electing the one writer (certificates, namespace facts)')
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
    serve.add_argument("--in-tree-facts", action="store_true",
                       default=env("ENVELOPE_IN_TREE_FACTS", "").lower() in ("1", "true", "yes"),
                       help="keep the namespace fact label in-tree.envelope.io/cpu-limit-guards "
                            "the in-tree policy's binding selects on (docs/in-tree.md): the "
                            "replica holding --lease-name writes it on namespaces without "
                            "LimitRanges and ResourceQuotas, from the live view's watches; "
                            "needs --namespace (env ENVELOPE_IN_TREE_FACTS=true)")
    serve.add_argument("--in-tree-facts-selector", default=env("ENVELOPE_IN_TREE_FACTS_SELECTOR", ""),
                       help="with --in-tree-facts: only namespaces with these labels "
                            "(key=value,...; default every namespace) "
                            "(env ENVELOPE_IN_TREE_FACTS_SELECTOR)")
    serve.add_argument("--in-tree-facts-lease-seconds", type=int,
                       default=int(env("ENVELOPE_IN_TREE_FACTS_LEASE_SECONDS", "30")),
                       help="with --in-tree-facts: how long the in-tree policy trusts the facts "
                            "after the keeper last renewed the Lease --lease-name plus -facts "
                            "(the policy binding's param; renewed every third of it while the "
                            "facts are current); after that the webhook answers in labelled "
                            "namespaces (env ENVELOPE_IN_TREE_FACTS_LEASE_SECONDS)")
    add_limit_arguments(serve)


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
    kinds = rules.reads | watched_for(policy)
    if args.in_tree_facts:
        from app.intree.facts import FACT_KINDS

        kinds |= set(FACT_KINDS)
    view = LiveView(configuration, resources_for(kinds), staleness=args.staleness,
                    indexes=rules.indexes)
    view.start()
    log.info("watching the cluster", extra={"fields": {"host": configuration.host,
                                                       "from": where}})
    return view, {"cluster view": view.problems}


def _raise_failure_policies(args: argparse.Namespace, checks: dict[str, Any],
                            configuration: Any, where: str, registry: Any = None) -> None:
    """With the webhook configurations named, raise their webhooks to the failurePolicy
    the chart recorded once this replica is ready and reachable through them
    (``app.serve.failurepolicy``)."""
    configs = [(r, n) for r, n in (("mutatingwebhookconfigurations", args.mutating_config),
                                   ("validatingwebhookconfigurations", args.validating_config))
               if n]
    if not configs:
        return
    from app.cluster.kube import KubeClient
    from app.serve.failurepolicy import PolicyMetrics, PolicyRaiser

    if configuration is None:  # no cluster: nothing to raise
        print(f"envelope serve: cannot raise failure policies: {where}", file=sys.stderr)
        return
    client = KubeClient(configuration)
    PolicyRaiser(client, configs, lambda: not any(check() for check in checks.values()),
                 metrics=PolicyMetrics(registry) if registry is not None else None).start()


def _start_fact_keeper(args: argparse.Namespace, view: Any, elector: Any,
                       configuration: Any, where: str, metrics: Any) -> bool:
    """``--in-tree-facts``: the namespace fact keeper (app/intree/facts.py) on its own
    thread, writing while this replica holds the Lease; never on the admission path,
    never in the readiness checks. False: it cannot run (said on stderr)."""
    import logging

    from app.cluster.kube import KubeClient
    from app.cluster.live import LiveView
    from app.intree.facts import (
        FactLease,
        FactMetrics,
        Leadership,
        ViewFactKeeper,
        parse_selector,
    )

    if configuration is None or not isinstance(view, LiveView):
        print(f"envelope serve: --in-tree-facts reads Namespaces, LimitRanges and "
              f"ResourceQuotas from the live view, and there is none: {where}", file=sys.stderr)
        return False
    leadership = Leadership(elector)
    client = KubeClient(configuration)
    lease = FactLease(client, args.namespace, f"{args.lease_name}-facts", elector.identity,
                      max(3, args.in_tree_facts_lease_seconds))
    keeper = ViewFactKeeper(client, view, leadership.leading,
                            FactMetrics(metrics.registry),
                            parse_selector(args.in_tree_facts_selector), lease=lease)
    leadership.start()
    keeper.start()
    if args.tls_mode != "self":  # else the certificate manager's view of the same Lease
        metrics.leader.set_function(lambda: 1.0 if leadership.leading() else 0.0)
    logging.getLogger("envelope").info("keeping the in-tree namespace fact while leading",
                                       extra={"fields": {"lease": f"{args.namespace}/{args.lease_name}"}})
    return True


def _policy_reloader(args: argparse.Namespace, rules: RuleSet, view: Any,
                     metrics: Any) -> Any:
    """The reloader of ``--config`` (app/serve/policyreload.py), its metrics registered. A new
    policy whose exceptions select namespaces by label is refused when this start's
    live view does not watch Namespaces (none of the policy read at start did)."""
    from app.serve.policyreload import PolicyReloader, ReloadMetrics

    watched = {i.resource.kind for i in getattr(view, "informers", ())}
    live = bool(getattr(view, "informers", ()))

    def accept(new: Policy) -> str | None:
        if live and "Namespace" not in watched and needs_namespaces(new):
            return ("an exception's namespaceSelector needs the Namespace watch, which this "
                    "replica started without (no exception of the policy it started with "
                    "selected namespaces): restart the pods to apply this policy")
        if live and EXCEPTION_KIND not in watched and needs_exceptions(new):
            return ("delegatedExceptions needs the EnvelopeException watch, which this replica "
                    "started without (the policy it started with delegated none): restart "
                    "the pods to apply this policy")
        return None

    reloader = PolicyReloader(args.config, rules, lambda new: None, accept=accept,
                              interval=args.policy_reload_interval)
    ReloadMetrics(reloader, metrics.registry)
    return reloader


def _cluster_configuration(args: argparse.Namespace) -> tuple[Any, str]:
    """The cluster configuration every part of ``serve`` uses, decided once
    (``app.cluster.kube.serve_configuration``); raises ClusterConfigError."""
    from app.cluster.kube import serve_configuration

    uses = (args.cluster_view != "none" or args.tls_mode == "self" or args.in_tree_facts
            or args.caller_token != "off" or args.mutating_config or args.validating_config)
    if not uses:
        return None, "nothing in this start reads the cluster (--cluster-view none)"
    return serve_configuration(args.kubeconfig or None)


#: The packages whose versions the start line names: the server's own internals
#: (app/serve/httplimits.py subclasses uvicorn's and uvloop's private classes), so a log says
#: whether what runs is what requirements.lock pins (issue 35).
SERVING_PACKAGES = ("envelope", "uvicorn", "uvloop", "httptools", "fastapi", "starlette")


def _log_versions() -> None:
    import logging
    import platform
    from importlib import metadata

    versions: dict[str, str] = {}
    for name in SERVING_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    logging.getLogger("envelope").info(
        "starting envelope " + ", ".join(f"{n} {v}" for n, v in versions.items() if n != "envelope"),
        extra={"fields": {"versions": {**versions, "python": platform.python_version()}}})


def run_serve(args: argparse.Namespace, rules: RuleSet, policy: Policy) -> int:
    """Start the webhook; the exit status.

    Why one function of ~86 lines: the start in the order it must happen (logging, cluster
    configuration, TLS, cluster view, namespace facts, caller tokens, failure policies,
    policy reload, metrics, uvicorn); a step that fails returns 2 after its message, and
    parts would hand a dozen locals to each other.
    """
    import uvicorn

    from app.cluster.kube import ClusterConfigError
    from app.serve.logs import setup_logging
    from app.serve.metrics_server import MetricsServer
    from app.serve.server import Metrics, create_app
    from app.serve.serving import Server

    setup_logging(args.log_level)
    _log_versions()
    try:
        configuration, where = _cluster_configuration(args)
    except ClusterConfigError as exc:
        print(f"envelope serve: {exc}; refusing to start rather than run without the "
              f"cluster it was given (rules would see an empty cluster)", file=sys.stderr)
        return 2
    metrics = Metrics()
    after_start: list[Any] = []
    elector = None
    if args.in_tree_facts:
        if configuration is None:
            print(f"envelope serve: --in-tree-facts writes Namespace labels through the API "
                  f"server, and there is no cluster configuration: {where}", file=sys.stderr)
            return 2
        from app.cluster.kube import KubeClient

        elector = lease_elector(args, KubeClient(configuration))
    tls = _tls(args, metrics, configuration, where, after_start, elector)
    if tls is None:
        return 2
    state, checks = tls
    view, view_checks = _cluster_view(args, rules, policy, configuration, where)
    if view is None:
        return 2
    metrics.watches.view = view
    if args.in_tree_facts and not _start_fact_keeper(args, view, elector, configuration,
                                                     where, metrics):
        return 2
    all_checks = {**checks, **view_checks}
    caller = None
    if args.caller_token != "off":
        made = _caller_check(args, metrics, configuration, where)
        if made is None:
            return 2
        caller, caller_checks = made
        all_checks.update(caller_checks)
    _raise_failure_policies(args, all_checks, configuration, where, metrics.registry)
    reloader = None
    if args.config:
        reloader = _policy_reloader(args, rules, view, metrics)
    app = create_app(rules, policy, view, ready_checks=all_checks, metrics=metrics, caller=caller,
                     serving=reloader.describe if reloader is not None else None)
    if reloader is not None:
        handler = app.state.handler
        reloader.apply = lambda new: setattr(handler, "policy", new)
        try:
            handler.policy = reloader.load_initial()  # the same file, read as it is now
        except ConfigError as exc:
            print(f"envelope: invalid configuration: {exc}", file=sys.stderr)
            return 2
        reloader.start()
    if args.metrics_port:
        def failing() -> list[str]:
            return [f"{name}: {problem}" for name, check in all_checks.items() for problem in check()]

        MetricsServer(metrics.registry, args.metrics_host or args.host, args.metrics_port,
                      ready=failing,
                      serving=reloader.describe if reloader is not None else None).start()
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
    if not args.policy_reload_interval > 0:
        return (f"--policy-reload-interval {args.policy_reload_interval:g}: give a number of "
                f"seconds above 0")
    if args.tls_mode == "self" and args.ca_overlap_seconds < 4 * args.tls_interval:
        return (f"--ca-overlap-seconds {args.ca_overlap_seconds:g} is shorter than 4x "
                f"--tls-interval ({4 * args.tls_interval:g} s): replicas reload the Secret "
                f"every --tls-interval and must have done so before the old CA is dropped")
    if args.in_tree_facts:
        if not args.namespace:
            return ("--in-tree-facts needs --namespace (env POD_NAMESPACE): the Lease "
                    "--lease-name the replicas elect the fact's writer with lives there")
        if args.cluster_view == "none":
            return ("--in-tree-facts reads the live view (Namespaces, LimitRanges, "
                    "ResourceQuotas): drop --cluster-view none")
        from app.intree.facts import parse_selector

        try:
            parse_selector(args.in_tree_facts_selector)
        except ValueError as exc:
            return f"--in-tree-facts-selector {args.in_tree_facts_selector!r}: {exc}"
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
