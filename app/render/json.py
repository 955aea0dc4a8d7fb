"""``check -o json``: the schema is docs/schemas/check-output.v1.json."""

from __future__ import annotations

from typing import Any

import orjson

from app.render.reports import FailOn, Report

__all__ = ["CHECK_SCHEMA", "as_json", "render"]

CHECK_SCHEMA = "check/v1"
"""``schemaVersion`` of ``check -o json`` (docs/schemas/check-output.v1.json): fields are
only added within a version; anything else is a new version and a CHANGELOG entry."""


def as_json(report: Report) -> dict[str, Any]:
    return {
        "schemaVersion": CHECK_SCHEMA,
        "objects": [{"kind": o.kind, "apiVersion": o.api_version, "namespace": o.namespace,
                     "name": o.name, "source": f"{o.file}#{o.document}", "file": o.file,
                     "document": o.document, "line": o.line,
                     "findings": [f.as_finding() for f in o.findings],
                     "changes": [c.as_change() for c in o.changes], "patch": o.patch,
                     "skipped": o.exempt}
                    for o in report.objects],
        "notEvaluated": [{"rule": n.rule, "missing": list(n.missing), "objects": n.objects,
                          "message": n.message} for n in report.not_evaluated],
        "skipped": [{"path": p, "reason": r} for p, r in report.skipped],
        "summary": {"objects": len(report.objects), "errors": report.count("error"),
                    "warnings": report.count("warning"), "mutated": report.mutated},
    }


def render(report: Report, fail_on: FailOn = "error") -> str:
    doc = {**as_json(report), "failOn": fail_on, "failed": report.failed(fail_on)}
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
