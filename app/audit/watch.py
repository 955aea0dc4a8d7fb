"""``envelope audit --watch``: the audit kept running in the cluster, on start, on change
(debounced) and periodically, writing its reports and metrics each time."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from app.audit.judging import Audit, audit, judged_for, read_kinds
from app.audit.metrics import AuditMetrics
from app.audit.reports import policy_reports, write_reports
from app.cluster.kube import KubeClient
from app.cluster.live import Informer, Resource, resources_for
from app.cluster.view import Store
from app.core.config import Policy
from app.core.ruleset import RuleSet

log = logging.getLogger("envelope.audit")


def _fingerprint(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What the change trigger keeps of a judged object: its key and a hash of all but
    status and bookkeeping metadata, so a status heartbeat is not a change."""

    def trim(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        body = {k: v for k, v in obj.items() if k not in ("status", "metadata")}
        body["labels"] = meta.get("labels")
        body["annotations"] = meta.get("annotations")
        body["owners"] = meta.get("ownerReferences")
        try:
            h = hash(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
        except TypeError:
            # Nested past orjson's 1,024 levels (the API server keeps custom resources up
            # to 10,000): the generation, which the API server moves on every change but
            # to metadata and status, stands for the body. Raising here failed the whole
            # watch of the kind, so the audit never synced.
            h = hash(("generation", meta.get("generation"), meta.get("resourceVersion")
                      if meta.get("generation") is None else None,
                      orjson.dumps([body["labels"], body["annotations"], body["owners"]],
                                   option=orjson.OPT_SORT_KEYS)))
        return {"kind": kind, "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta},
                "h": h}

    return trim


class Auditor:
    """Runs the audit on start, on change (debounced) and every ``interval`` seconds,
    writing the reports and metrics each time.

    Changes come from watches of every kind the rules read or judge (client-go style
    list + watch, :class:`~app.cluster.live.Informer`) into a store that keeps, per
    object, only a hash of what a rule could judge: the store's versions move only
    on a real change. The kinds the rules read are kept trimmed in a second store,
    which is the audit's view (no re-LIST of them per audit)."""

    def __init__(self, client: KubeClient, rules: RuleSet, policy: Policy,
                 metrics: AuditMetrics, *, interval: float = 600.0, debounce: float = 10.0,
                 include_owned: bool = False) -> None:
        self.client, self.rules, self.policy, self.metrics = client, rules, policy, metrics
        self.interval, self.debounce, self.include_owned = interval, debounce, include_owned
        self.view = Store(indexes=rules.indexes)
        self.changes = Store()
        read = resources_for(read_kinds(rules, policy))
        judged = [Resource(j.name, j.path, _fingerprint(j.kind), j.optional)
                  for j in judged_for(rules)]
        self.informers = [Informer(r, self.view, client) for r in read] + \
                         [Informer(r, self.changes, client) for r in judged]
        self._stop = threading.Event()
        self.last: Audit | None = None

    def _versions(self) -> tuple[int, ...]:
        kinds = [i.resource.kind for i in self.informers]
        return (*(self.view.version(k) for k in kinds), *(self.changes.version(k) for k in kinds))

    def synced(self) -> bool:
        return all(i.synced for i in self.informers)

    def run_once(self) -> Audit:
        try:
            found = audit(self.client, self.rules, self.policy, view=self.view,
                          include_owned=self.include_owned)
            found.absent = [i.resource.kind for i in self.informers if i.absent]
            applied, deleted = write_reports(self.client, policy_reports(found))
        except Exception as exc:
            self.metrics.failures.inc()
            log.warning("audit failed", extra={"fields": {
                "error": f"{type(exc).__name__}: {exc}"[:300]}})
            raise
        self.metrics.observe(found)
        self.metrics.quotas.observe(self.view)
        self.last = found
        log.info("audit done", extra={"fields": {
            "objects": found.objects, "results": len(found.results), "reports": applied,
            "deletedReports": deleted, "seconds": round(found.seconds, 3)}})
        return found

    def run(self) -> None:
        for informer in self.informers:
            threading.Thread(target=informer.run, daemon=True,
                             name=f"audit-watch-{informer.resource.kind}").start()
        while not self.synced() and not self._stop.wait(0.5):
            pass
        seen = self._versions()
        periodic = 0.0  # audit at once on start
        settled: float | None = None  # when a change has settled
        pending = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            versions = self._versions()
            if versions != seen:
                # A change: audit once nothing changed for `debounce` seconds, and at
                # the latest 6 debounces after the first change.
                seen = versions
                pending = now if settled is None else pending
                settled = min(now + self.debounce, pending + 6 * self.debounce)
            if now >= periodic or (settled is not None and now >= settled):
                settled = None
                try:
                    self.run_once()
                    periodic = time.monotonic() + self.interval
                except Exception:
                    periodic = time.monotonic() + min(self.interval, 30.0)
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()

