"""An install that cannot lock the cluster: webhooks start as ``Ignore`` and are raised
to the ``failurePolicy`` the chart wants only once Envelope answers behind them.

The chart renders every webhook whose wanted policy is ``Fail`` as ``Ignore`` and records
the wanted policies in the configuration's ``envelope.io/failure-policies`` annotation.
Each ready replica checks, for each webhook still below its wanted policy, that ``GET
/readyz`` through the webhook's own ``clientConfig`` answers 200 — the path the API
server will take — and only then updates the configuration (idempotent: no leader).
It watches the two configurations and raises again what ``helm upgrade``, Argo CD or
Flux lowered, and says so in ``envelope_webhook_failure_policy_lowered`` and
``envelope_webhook_failure_policy_resets_total``: docs/deploy.md and docs/gitops.md.
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
from prometheus_client import CollectorRegistry, Counter, Gauge

from app.cluster.kube import ApiError, KubeClient

__all__ = ["ANNOTATION", "PolicyMetrics", "PolicyRaiser", "lowered", "probe_client_config", "raised"]

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


def _wanted(config: dict[str, Any]) -> dict[str, Any]:
    meta = config.get("metadata") or {}
    try:
        wanted = orjson.loads((meta.get("annotations") or {}).get(ANNOTATION) or "{}")
    except orjson.JSONDecodeError:
        return {}
    return wanted if isinstance(wanted, dict) else {}


def lowered(config: dict[str, Any]) -> list[str]:
    """The webhooks whose live policy is not the one the annotation wants."""
    wanted = _wanted(config)
    out = []
    for webhook in config.get("webhooks") or []:
        name = webhook.get("name") if isinstance(webhook, dict) else None
        if isinstance(name, str) and wanted.get(name) in ("Fail", "Ignore") \
                and webhook.get("failurePolicy") != wanted[name]:
            out.append(name)
    return out


class PolicyMetrics:
    """What the raiser sees, exported on the metrics port (docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lowered = Gauge(
            "envelope_webhook_failure_policy_lowered",
            "1 while the webhook's live failurePolicy is not the one the chart wants",
            ("configuration", "webhook"), registry=registry)
        self.resets = Counter(
            "envelope_webhook_failure_policy_resets",
            "Times a configuration whose webhooks were seen at their wanted failurePolicy "
            "was found with one lowered again (a re-apply of the rendered chart)",
            ("configuration",), registry=registry)


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
                 interval: float = 5.0, metrics: PolicyMetrics | None = None,
                 watch: bool = True) -> None:
        self.client = client
        self.configs = configs
        self.ready = ready
        self.probe = probe
        self.interval = interval
        self.metrics = metrics
        self.watch = watch
        self.problems: list[str] = []
        self.resets = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._seen_raised: set[tuple[str, str]] = set()

    def _account(self, name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        """Count lowerings of webhooks seen raised; export which stay below."""
        below_before = set(lowered(before))
        below_after = set(lowered(after))
        again = sorted(w for w in below_before if (name, w) in self._seen_raised)
        if again:  # one re-apply of the configuration: one reset, however many webhooks
            self.resets += 1
            if self.metrics is not None:
                self.metrics.resets.labels(name).inc()
            log.warning("failurePolicy lowered again (a helm upgrade or a GitOps sync "
                        "re-applied the rendered value)%s",
                        "; raised" if not below_after & set(again) else "; cannot raise it yet",
                        extra={"fields": {"configuration": name, "webhooks": ",".join(again)}})
        for webhook in [str(w.get("name")) for w in before.get("webhooks") or []
                        if isinstance(w, dict) and w.get("name") in _wanted(before)]:
            key = (name, webhook)
            self._seen_raised.discard(key)
            if webhook not in below_after:
                self._seen_raised.add(key)
            if self.metrics is not None:
                self.metrics.lowered.labels(name, webhook).set(1 if webhook in below_after else 0)

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
                self._account(name, config, update if update is not None else config)
            except ApiError as exc:
                if exc.status != 409:  # a concurrent update: the next step sees it
                    problems.append(f"{resource}/{name}: {exc}")
        self.problems = problems

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.step()
            except Exception:  # never let the thread die; say why
                log.exception("raising failure policies failed")

    def _watch(self, resource: str, name: str) -> None:
        """Wake the loop on every change of one configuration (a watch by name, which
        RBAC authorises with ``resourceNames``); on any error fall back to the interval."""
        fields = {"watch": "true", "fieldSelector": f"metadata.name={name}",
                  "timeoutSeconds": "300"}
        while not self._stop.is_set():
            try:
                response = self.client.get(PATHS[resource], fields, timeout=330, stream=True)
                try:
                    for _chunk in response.stream(65536, decode_content=True):
                        self._wake.set()
                        if self._stop.is_set():
                            return
                finally:
                    response.release_conn()
            except ApiError as exc:
                if exc.status == 403:  # RBAC without watch (an older chart): the interval only
                    log.info("cannot watch the webhook configuration; checking every %.0f s",
                             self.interval, extra={"fields": {"configuration": name}})
                    return
                log.debug("watch of %s/%s failed: %s", resource, name, exc)
                self._stop.wait(self.interval)
            except Exception as exc:  # the interval still raises
                log.debug("watch of %s/%s failed: %s", resource, name, exc)
                self._stop.wait(self.interval)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="failure-policy", daemon=True).start()
        if self.watch:
            for resource, name in self.configs:
                threading.Thread(target=self._watch, args=(resource, name),
                                 name=f"failure-policy-watch-{resource[:8]}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
