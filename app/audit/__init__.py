"""``envelope audit``: judge what already runs, and write PolicyReports.

One module per job:

- :mod:`app.audit.judging`: list what the rules judge and turn the engine's results
  into audit results (:class:`Audit`), with its text and JSON outputs;
- :mod:`app.audit.reports`: the PolicyReports and ClusterPolicyReports of an audit,
  and their writing;
- :mod:`app.audit.metrics`: the gauges of the last audit (:class:`AuditMetrics`);
- :mod:`app.audit.watch`: the continuous audit (:class:`Auditor`, ``audit --watch``).

Their public names are re-exported here: ``from app.audit import audit`` is the API.
"""

from __future__ import annotations

from app.audit.judging import (
    AUDIT_SCHEMA,
    JUDGED,
    Audit,
    Judged,
    Result,
    audit,
    judge,
    judged_for,
    load_view,
    read_kinds,
    summary_text,
)
from app.audit.metrics import AuditMetrics
from app.audit.reports import POLICY, REPORT_BYTES, policy_of, policy_reports, write_reports
from app.audit.watch import Auditor

__all__ = ["AUDIT_SCHEMA", "JUDGED", "POLICY", "REPORT_BYTES", "Audit", "AuditMetrics", "Auditor", "Judged",
           "Result", "audit", "judge", "judged_for", "load_view", "policy_of", "policy_reports", "read_kinds",
           "summary_text", "write_reports"]
