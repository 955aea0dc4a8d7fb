"""``envelope audit``: judge what already runs, and write PolicyReports.

The code is in :mod:`app.audit.judging` for now; its public names are re-exported
here: ``from app.audit import audit`` is the API.
"""

from __future__ import annotations

from app.audit.judging import (
    AUDIT_SCHEMA,
    JUDGED,
    POLICY,
    REPORT_BYTES,
    Audit,
    AuditMetrics,
    Auditor,
    Judged,
    Result,
    audit,
    judge,
    judged_for,
    load_view,
    policy_of,
    policy_reports,
    read_kinds,
    summary_text,
    write_reports,
)

__all__ = ["AUDIT_SCHEMA", "JUDGED", "POLICY", "REPORT_BYTES", "Audit", "AuditMetrics", "Auditor", "Judged",
           "Result", "audit", "judge", "judged_for", "load_view", "policy_of", "policy_reports", "read_kinds",
           "summary_text", "write_reports"]
