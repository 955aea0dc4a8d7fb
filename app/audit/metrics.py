"""The audit's gauges (``envelope_audit_*``), set from each successful audit, and the
quota-tree gauges beside them (:mod:`app.audit.quotametrics`)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Gauge

from app.audit.judging import Audit


class AuditMetrics:
    """Gauges of the last successful audit. Registered on ``registry`` (the server's
    ``Metrics.registry`` when the audit runs inside ``envelope serve``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.violations = Gauge(
            "envelope_audit_violations",
            "Results other than pass of the last audit, by rule, namespace and result",
            ("rule", "namespace", "result"), registry=self.registry)
        self.objects = Gauge("envelope_audit_objects", "Objects judged by the last audit",
                             registry=self.registry)
        self.last_success = Gauge("envelope_audit_last_success_timestamp_seconds",
                                  "When the last audit that wrote its reports finished "
                                  "(Unix time)", registry=self.registry)
        self.duration = Gauge("envelope_audit_duration_seconds",
                              "How long the last successful audit took",
                              registry=self.registry)
        self.failures = Gauge("envelope_audit_consecutive_failures",
                              "Audits that failed since the last success",
                              registry=self.registry)
        self._series: set[tuple[str, str, str]] = set()
        from app.audit.quotametrics import QuotaMetrics  # the quota-tree gauges (app/audit/quotametrics.py)

        self.quotas = QuotaMetrics(self.registry)

    def observe(self, found: Audit) -> None:
        now = {k: n for k, n in found.counts().items() if k[2] != "pass"}
        series = {(rule_id, ns, res) for ns, rule_id, res in now}
        for gone in self._series - series:  # fixed or deleted: the series leaves
            self.violations.remove(*gone)
        for (ns, rule_id, res), n in now.items():
            self.violations.labels(rule_id, ns, res).set(n)
        self._series = series
        self.objects.set(found.objects)
        self.duration.set(found.seconds)
        self.last_success.set(time.time())
        self.failures.set(0)
