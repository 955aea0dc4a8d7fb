"""``check -o junit``: JUnit XML, one testcase per object; a testcase fails on a finding
at or above ``--fail-on``."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from app.k8s.util import visible
from app.render.gate import change_gate_failures
from app.render.reports import FailOn, Report

__all__ = ["render"]


def render(report: Report, fail_on: FailOn = "error") -> str:
    failing = ("error", "warning") if fail_on in ("warning", "change") else ("error",)
    suites = ET.Element("testsuites", name="envelope check")
    suite = ET.SubElement(suites, "testsuite", name="envelope check")
    props = ET.SubElement(suite, "properties")
    for n in report.not_evaluated:
        ET.SubElement(props, "property", name=f"not-evaluated.{n.rule}", value=n.message)
    failures = 0
    for o in report.objects:
        case = ET.SubElement(suite, "testcase", classname=o.file, name=o.title,
                             file=o.file, line=str(o.line))
        bad = [f for f in o.findings if f.severity in failing] + change_gate_failures(o, fail_on)
        if bad:
            failures += 1
            node = ET.SubElement(case, "failure", type=bad[0].rule,
                                 message="; ".join(f"{f.rule}: {f.message}" for f in bad))
            node.text = "\n".join(f"{f.severity} {f.rule} ({o.file}:{f.line or o.line}"
                                  f" {f.path}): {f.message}" for f in bad)
        rest = [f for f in o.findings if f.severity not in failing]
        out = [f"{f.severity} {f.rule}: {f.message}" for f in rest]
        if fail_on != "change":
            out += [f"change {c.rule}: {c.message}" for c in o.changes]
        if out:
            ET.SubElement(case, "system-out").text = "\n".join(out)
    suite.set("tests", str(len(report.objects)))
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", "0")
    suites.set("tests", str(len(report.objects)))
    suites.set("failures", str(failures))
    if report.not_evaluated or report.skipped:
        lines = [n.message for n in report.not_evaluated]
        if report.skipped:
            lines.append(report.skipped_summary())
        ET.SubElement(suite, "system-out").text = "\n".join(lines)
    for element in suites.iter():  # XML 1.0 cannot hold most control characters at all
        element.text = visible(element.text, keep="\n") if element.text else element.text
        for key, value in element.attrib.items():
            element.set(key, visible(value))
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"
