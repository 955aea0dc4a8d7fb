"""``check -o text`` (alias ``human``): one block per object with something to say,
then what was not evaluated, the rules' pages and the totals."""

from __future__ import annotations

from collections.abc import Collection

from app.cluster.fieldschema import FIELDS_RULE
from app.k8s.util import visible
from app.render.gate import change_gate_text
from app.render.reports import FailOn, Report

__all__ = ["explain_line", "render"]


def render(report: Report, fail_on: FailOn = "error") -> str:
    lines = []
    for o in report.objects:
        if not o.findings and not o.changes and not o.exempt:
            continue
        lines.append(f"{o.title} ({o.file}:{o.line}, document {o.document})")
        for f in o.findings:
            at = f" [line {f.line}]" if f.line and f.line != o.line else ""
            lines.append(f"  {f.severity:<7} {f.rule}: {f.message}{at}")
        lines.extend(f"  skip    {e['rule']}: exempt ({e['reason']})" for e in o.exempt)
        lines.extend(f"  change  {c.message}" for c in o.changes)
    lines.extend(n.message for n in report.not_evaluated)
    if report.skipped:
        lines.append(report.skipped_summary())
    reported = sorted({f.rule for o in report.objects for f in (*o.findings, *o.changes)}
                      - {"internal"})
    if reported:
        lines.append(explain_line(reported))
    lines.append(report.summary())
    # Names and values are the user's: a control character in one is shown as its
    # escape, so no name drives the terminal or starts a line (a forged "::error::"
    # workflow command in a CI log). Issue 38, class 7.
    return "".join(visible(line) + "\n" for line in lines) + visible(
        change_gate_text(report, fail_on), keep="\n")


def explain_line(rule_ids: Collection[str]) -> str:
    """Where the rules that reported are explained: their pages and ``envelope explain``."""
    from app.ruledocs import docs_url

    pages = [r for r in rule_ids if r != FIELDS_RULE]
    line = (f"why and how to fix: envelope explain RULE, or {docs_url()}rules/RULE.md, for "
            f"{', '.join(pages)}") if pages else ""
    if FIELDS_RULE in rule_ids:  # strict field validation: explained, but not a rule page
        line += ("; " if line else "why and how to fix: ") + f"envelope explain {FIELDS_RULE}"
    return line
