"""An install that cannot lock the cluster: webhooks start as ``Ignore`` and are raised
to the ``failurePolicy`` the chart wants only once Envelope answers behind them.

The chart renders every webhook whose wanted policy is ``Fail`` with
``failurePolicy: Ignore`` and records the wanted policies in the configuration's
``envelope.io/failure-policies`` annotation (JSON: webhook name -> policy). An image
that cannot be pulled, a policy that stops startup, a caBundle that does not match:
nothing answers, so writes pass, instead of every workload write in the cluster being
refused. Each ready replica then checks, for each webhook still below its wanted
policy, that ``GET /readyz`` through the webhook's own ``clientConfig`` (its URL or
its Service, verified with its ``caBundle``) answers 200 — the path the API server
will take — and only then updates the configuration. The update is idempotent, so
every replica may do it and no leader is needed. Helm's three-way merge keeps the
raised value on ``helm upgrade`` (the rendered value did not change), and nothing
lowers it again: ``helm uninstall`` deletes the configurations.
"""

from __future__ import annotations

import base64
import logging
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson

from app.cluster.kube import ApiError, KubeClient

__all__ = ["ANNOTATION", "PolicyRaiser", "probe_client_config", "raised"]

ANNOTATION = "envelope.io/failure-policies"
PATHS = {resource: f"/apis/admissionregistration.k8s.io/v1/{resource}"
         for resource in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")}

log = logging.getLogger("envelope.failurepolicy")

Probe = Callable[[dict[str, Any]], str | None]


def probe_client_config(client_config: dict[str, Any], timeout: float = 3.0) -> str | None:
    """``None`` when ``GET /readyz`` through this clientConfig answers 200 over TLS
    verified with its caBundle; otherwise why not."""
    bundle = client_config.get("caBundle")
    try:
        cadata = base64.b64decode(bundle).decode() if isinstance(bundle, str) and bundle else None
    except (ValueError, UnicodeDecodeError):
        return "caBundle is not base64 PEM"
    context = ssl.create_default_context(cadata=cadata) if cadata else ssl.create_default_context()
    url = client_config.get("url")
    service = client_config.get("service")
    if isinstance(url, str) and url:
        parts = urllib.parse.urlsplit(url)
        target = f"{parts.scheme}://{parts.netloc}/readyz"
    elif isinstance(service, dict) and service.get("name") and service.get("namespace"):
        target = f"https://{service['name']}.{service['namespace']}.svc:{service.get('port', 443)}/readyz"
    else:
        return "no url or service in clientConfig"
    try:
        with urllib.request.urlopen(target, timeout=timeout, context=context) as response:
            return None if response.status == 200 else f"{target}: HTTP {response.status}"
    except urllib.error.HTTPError as exc:
        return f"{target}: HTTP {exc.code}"
    except (OSError, ssl.SSLError) as exc:
        return f"{target}: {exc}"


def raised(config: dict[str, Any], probe: Probe) -> tuple[dict[str, Any] | None, list[str]]:
    """The configuration with each webhook that answers raised to its wanted policy
    (None when nothing changes), and why the others were not."""
    meta = config.get("metadata") or {}
    try:
        wanted = orjson.loads((meta.get("annotations") or {}).get(ANNOTATION) or "{}")
    except orjson.JSONDecodeError:
        return None, [f"{meta.get('name')}: annotation {ANNOTATION} is not JSON"]
    if not isinstance(wanted, dict):
        return None, [f"{meta.get('name')}: annotation {ANNOTATION} is not a map"]
    changed = False
    problems = []
    webhooks = []
    for webhook in config.get("webhooks") or []:
        want = wanted.get(webhook.get("name"))
        if want in ("Fail", "Ignore") and webhook.get("failurePolicy") != want:
            why = probe(webhook.get("clientConfig") or {})
            if why is None:
                webhook = {**webhook, "failurePolicy": want}
                changed = True
            else:
                problems.append(f"{webhook.get('name')} stays {webhook.get('failurePolicy')}: {why}")
        webhooks.append(webhook)
    return ({**config, "webhooks": webhooks} if changed else None), problems


class PolicyRaiser:
    """Raise the configurations' webhooks to their wanted policies once this replica is
    ready and reachable through them; then keep checking (a re-install renders Ignore)."""

    def __init__(self, client: KubeClient, configs: list[tuple[str, str]],
                 ready: Callable[[], bool], probe: Probe = probe_client_config,
                 interval: float = 5.0) -> None:
        self.client = client
        self.configs = configs
        self.ready = ready
        self.probe = probe
        self.interval = interval
        self.problems: list[str] = []
        self._stop = threading.Event()

    def step(self) -> None:
        if not self.ready():
            return  # our own readiness first: a replica that cannot judge raises nothing
        problems = []
        for resource, name in self.configs:
            path = f"{PATHS[resource]}/{name}"
            try:
                config = self.client.request("GET", path)
                update, why = raised(config, self.probe)
                problems += why
                if update is not None:
                    self.client.request("PUT", path, update)
                    log.info("webhooks raised to their failure policy",
                             extra={"fields": {"configuration": name}})
            except ApiError as exc:
                if exc.status != 409:  # a concurrent update: the next step sees it
                    problems.append(f"{resource}/{name}: {exc}")
        self.problems = problems

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.step()
            except Exception:  # never let the thread die; say why
                log.exception("raising failure policies failed")

    def start(self) -> None:
        threading.Thread(target=self._loop, name="failure-policy", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
