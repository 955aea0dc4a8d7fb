"""Who may call ``envelope serve``: its TLS state per ``--tls-mode`` (files, self-signed,
self-managed in a Secret), mTLS, and the KEP-6060 caller-token check."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any


def lease_elector(args: argparse.Namespace, client: Any) -> Any:
    """The one LeaseElector of this replica (``--lease-name`` in ``--namespace``), shared
    by the certificate manager (``--tls-mode self``) and the namespace fact keeper
    (``--in-tree-facts``): one identity, one Lease, one leader for both."""
    import socket

    from app.serve.certs import LeaseElector

    identity = os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    return LeaseElector(client, args.namespace, args.lease_name, identity)


def _tls(args: argparse.Namespace, metrics: Any, configuration: Any, where: str,  # noqa: PLR0915
         after_start: list[Any], elector: Any = None) -> tuple[Any, dict[str, Any]] | None:
    """The server's TLS state and its readiness check, per ``--tls-mode``. What must
    wait until the server is listening (writing new ``--self-signed`` files, watching
    them) is appended to ``after_start``: a start that fails before leaves the files it
    found as they were. ``elector``: the replica's LeaseElector when serve made one
    already (else ``--tls-mode self`` makes its own).

    Why one function of ~121 lines: each ``--tls-mode``'s wiring in one place, in the
    order serve starts them; a split by mode is the next step (issue 34).
    """
    import datetime as dt
    import logging

    from app.cluster.kube import KubeClient
    from app.serve.certs import SelfManaged
    from app.serve.tls import (
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
    manager = SelfManaged(
        client, state, ns, args.tls_secret, names, configs,
        elector if elector is not None else lease_elector(args, client),
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


def _caller_check(args: argparse.Namespace, metrics: Any, configuration: Any,
                  where: str) -> tuple[Any, dict[str, Any]] | None:
    """The KEP-6060 token check and its readiness check (None: cannot start it)."""
    from app.cluster.kube import KubeClient
    from app.serve.callerauth import CallerCheck, KeySource

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
