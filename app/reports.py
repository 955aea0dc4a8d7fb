"""`envelope check` results as people and CI systems read them.

Formats: ``text`` (``human`` is an alias), ``json``, ``sarif`` (SARIF 2.1.0, for GitHub
code scanning and other SARIF viewers), ``junit`` (one testcase per object) and
``github`` (GitHub Actions workflow commands, shown as annotations on the pull request).

Everything here is a pure function of a :class:`Report`; the rules come in as a
parameter (any objects with ``.id`` and ``.summary``, optionally ``.kinds``,
``.reads`` and ``.needs``), so the rule registry can change shape freely. A rule's help
(SARIF ``help``, ``helpUri``, the per-family hint) and the "why and how to fix" line come
from the rule reference, :mod:`app.ruledocs`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol
from xml.etree import ElementTree as ET

import orjson

from app.ruleset import NEEDS

__all__ = ["FORMATS", "NEEDS", "NotEvaluated", "ObjectResult", "Report", "RuleInfo",
           "not_evaluated", "render"]

FORMATS = ("text", "human", "json", "sarif", "junit", "github")
FailOn = Literal["error", "warning", "change"]
"""The lowest severity that fails a run; ``change`` (below warning) also fails on any
object the webhook would mutate."""
SARIF_SCHEMA = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
                "sarif-schema-2.1.0.json")


class RuleInfo(Protocol):
    id: str
    summary: str


@dataclass(frozen=True)
class NotEvaluated:
    rule: str
    missing: tuple[str, ...]
    """Kinds the input lacks."""
    objects: int
    """How many objects in the input the rule would have judged."""

    @property
    def message(self) -> str:
        kinds = " or ".join(self.missing)
        return (f"not evaluated: the input has no {kinds} objects, so {self.rule} could not "
                f"judge {self.objects} object(s); add the {kinds} manifests to evaluate it")


def not_evaluated(rules: Iterable[Any], objects: Iterable[tuple[str, str]],
                  needs: Mapping[str, Collection[str]] = NEEDS,
                  present: Collection[str] = ()) -> list[NotEvaluated]:
    """Rules that judge some object of the input but lack a kind they need.

    ``objects`` are the (API group, kind) of every loaded object. A rule's needs are its
    own ``needs`` attribute when it has one, else ``needs[rule.id]``; a rule without a
    ``kinds`` attribute is taken to judge every object. ``present`` adds kinds the rules
    see besides the judged objects (a live cluster's, with ``--kubeconfig``).
    """
    seen = Counter(objects)
    present = {kind for _, kind in seen} | set(present)
    out = []
    for rule in rules:
        wanted = tuple(getattr(rule, "needs", None) or needs.get(rule.id, ()))
        missing = tuple(k for k in wanted if k not in present)
        if not missing:
            continue
        kinds = getattr(rule, "kinds", None)
        judged = sum(n for key, n in seen.items() if kinds is None or key in kinds)
        if judged:
            out.append(NotEvaluated(rule.id, missing, judged))
    return out


@dataclass
class ObjectResult:
    kind: str
    api_version: str
    namespace: str
    name: str
    file: str
    document: int
    line: int
    findings: list[dict[str, Any]] = field(default_factory=list)
    """``severity`` (error/warning), ``rule``, ``path``, ``message``, ``line``."""
    changes: list[dict[str, Any]] = field(default_factory=list)
    """Mutations the webhook would make: ``rule``, ``path``, ``message``, ``line``."""
    patch: list[dict[str, Any]] = field(default_factory=list)
    exempt: list[dict[str, str]] = field(default_factory=list)
    """Rules not run on the object because a policy exception or annotation exempts it:
    ``rule``, ``reason``."""

    @property
    def title(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"


@dataclass
class Report:
    objects: list[ObjectResult]
    rules: list[Any]
    """The rules run (``.id``, ``.summary``): SARIF's rule metadata."""
    not_evaluated: list[NotEvaluated] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    """(path, reason) of files and directories left out."""
    version: str = "0"

    def count(self, severity: str) -> int:
        return sum(f["severity"] == severity for o in self.objects for f in o.findings)

    def failed(self, fail_on: FailOn = "error") -> bool:
        return bool(self.count("error") or (fail_on in ("warning", "change") and self.count("warning"))
                    or (fail_on == "change" and self.mutated))

    @property
    def mutated(self) -> int:
        return sum(bool(o.patch) for o in self.objects)

    def summary(self) -> str:
        exempt = sum(len(o.exempt) for o in self.objects)
        return (f"{len(self.objects)} objects: {self.count('error')} errors, "
                f"{self.count('warning')} warnings, {self.mutated} would be mutated"
                + (f", {exempt} rules skipped as exempt" if exempt else ""))

    def skipped_summary(self) -> str:
        if not self.skipped:
            return ""
        reasons = Counter(reason for _, reason in self.skipped)
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        return f"skipped {len(self.skipped)} path(s): {parts}"


def render(report: Report, fmt: str, fail_on: FailOn = "error") -> str:
    """The report in ``fmt`` (one of :data:`FORMATS`), ending with a newline."""
    if fmt in ("text", "human"):
        return text(report) + change_gate_text(report, fail_on)
    if fmt == "json":
        doc = {**as_json(report), "failOn": fail_on, "failed": report.failed(fail_on)}
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "sarif":
        return orjson.dumps(sarif(report, fail_on), option=orjson.OPT_INDENT_2).decode() + "\n"
    if fmt == "junit":
        return junit(report, fail_on)
    if fmt == "github":
        return github(report, fail_on)
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")


# --- text -------------------------------------------------------------------------------

def text(report: Report) -> str:
    lines = []
    for o in report.objects:
        if not o.findings and not o.changes and not o.exempt:
            continue
        lines.append(f"{o.title} ({o.file}:{o.line}, document {o.document})")
        for f in o.findings:
            at = f" [line {f['line']}]" if f.get("line") and f["line"] != o.line else ""
            lines.append(f"  {f['severity']:<7} {f['rule']}: {f['message']}{at}")
        lines.extend(f"  skip    {e['rule']}: exempt ({e['reason']})" for e in o.exempt)
        lines.extend(f"  change  {c['message']}" for c in o.changes)
    lines.extend(n.message for n in report.not_evaluated)
    if report.skipped:
        lines.append(report.skipped_summary())
    reported = sorted({f["rule"] for o in report.objects for f in (*o.findings, *o.changes)}
                      - {"internal"})
    if reported:
        lines.append(explain_line(reported))
    lines.append(report.summary())
    return "\n".join(lines) + "\n"


def explain_line(rule_ids: Collection[str]) -> str:
    """Where the rules that reported are explained: their pages and ``envelope explain``."""
    from app.ruledocs import docs_url

    return (f"why and how to fix: envelope explain RULE, or {docs_url()}rules/RULE.md, for "
            f"{', '.join(rule_ids)}")


# --- json -------------------------------------------------------------------------------

CHECK_SCHEMA = "check/v1"
"""``schemaVersion`` of ``check -o json`` (docs/schemas/check-output.v1.json): fields are
only added within a version; anything else is a new version and a CHANGELOG entry."""


def as_json(report: Report) -> dict[str, Any]:
    return {
        "schemaVersion": CHECK_SCHEMA,
        "objects": [{"kind": o.kind, "apiVersion": o.api_version, "namespace": o.namespace,
                     "name": o.name, "source": f"{o.file}#{o.document}", "file": o.file,
                     "document": o.document, "line": o.line, "findings": o.findings,
                     "changes": o.changes, "patch": o.patch, "skipped": o.exempt}
                    for o in report.objects],
        "notEvaluated": [{"rule": n.rule, "missing": list(n.missing), "objects": n.objects,
                          "message": n.message} for n in report.not_evaluated],
        "skipped": [{"path": p, "reason": r} for p, r in report.skipped],
        "summary": {"objects": len(report.objects), "errors": report.count("error"),
                    "warnings": report.count("warning"), "mutated": report.mutated},
    }


# --- SARIF 2.1.0 ------------------------------------------------------------------------

_LEVELS = {"error": "error", "warning": "warning", "change": "note"}


def _uri(path: str) -> tuple[str, str | None]:
    """A relative URI against %SRCROOT% (the working directory) when the file is under
    it, as code scanning needs to place annotations; an absolute file URI otherwise."""
    if path.startswith("<"):
        return "stdin", None
    p = Path(path)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix(), "%SRCROOT%"
    except ValueError:
        return p.resolve().as_uri(), None


def _help(rule: Any) -> dict[str, str]:
    """The rule's help, with its family's hint and its page (``app.ruledocs``)."""
    from app.ruledocs import help_for

    return help_for(rule)


def sarif(report: Report, fail_on: FailOn = "error") -> dict[str, Any]:
    rules = sorted(report.rules, key=lambda r: r.id)
    index = {r.id: i for i, r in enumerate(rules)}
    descriptors = []
    for r in rules:
        mode = getattr(getattr(r, "default_mode", None), "value", "enforce")
        help_ = _help(r)
        descriptors.append({
            "id": r.id, "name": "".join(w.capitalize() for w in re.split(r"[^a-zA-Z0-9]+", r.id)),
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": r.summary},
            "helpUri": help_["uri"],
            "help": {"text": help_["text"], "markdown": help_["markdown"]},
            "defaultConfiguration": {"level": "warning" if mode == "warn" else "error",
                                     "enabled": mode != "off"},
            "properties": {"tags": ["kubernetes", "admission"]},
        })
    results = []
    for o in report.objects:
        uri, base = _uri(o.file)
        artifact = {"uri": uri, **({"uriBaseId": base} if base else {})}
        for f in [*o.findings, *({**c, "severity": "change"} for c in o.changes)]:
            result: dict[str, Any] = {
                "ruleId": f["rule"],
                "level": change_gate_level(f["severity"], fail_on),
                "message": {"text": f"{o.title}: {f['message']}"},
                "locations": [{
                    "physicalLocation": {"artifactLocation": artifact,
                                         "region": {"startLine": max(1, f.get("line") or o.line)}},
                    "logicalLocations": [{"fullyQualifiedName": f"{o.api_version}/{o.title}"
                                                                f"#{f['path']}",
                                          "kind": "object"}],
                }],
            }
            if f["rule"] in index:
                result["ruleIndex"] = index[f["rule"]]
            results.append(result)
    notes = [{"level": "note", "message": {"text": n.message},
              "associatedRule": {"id": n.rule,
                                 **({"index": index[n.rule]} if n.rule in index else {})}}
             for n in report.not_evaluated]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "envelope", "version": report.version,
                                "rules": descriptors}},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": Path.cwd().resolve().as_uri() + "/"}},
            "invocations": [{"executionSuccessful": True,
                             "exitCode": 1 if report.failed(fail_on) else 0,
                             "toolConfigurationNotifications": notes}],
            "results": results,
        }],
    }


# --- JUnit XML --------------------------------------------------------------------------

def junit(report: Report, fail_on: FailOn = "error") -> str:
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
        bad = [f for f in o.findings if f["severity"] in failing] + change_gate_failures(o, fail_on)
        if bad:
            failures += 1
            node = ET.SubElement(case, "failure", type=bad[0]["rule"],
                                 message="; ".join(f"{f['rule']}: {f['message']}" for f in bad))
            node.text = "\n".join(f"{f['severity']} {f['rule']} ({o.file}:{f.get('line') or o.line}"
                                  f" {f['path']}): {f['message']}" for f in bad)
        rest = [f for f in o.findings if f["severity"] not in failing]
        out = [f"{f['severity']} {f['rule']}: {f['message']}" for f in rest]
        if fail_on != "change":
            out += [f"change {c['rule']}: {c['message']}" for c in o.changes]
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
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


# --- GitHub Actions workflow commands ---------------------------------------------------

def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _gh_path(path: str) -> str:
    """Annotations need the path relative to the repository (the working directory)."""
    try:
        return os.path.relpath(path) if not path.startswith("<") else path
    except ValueError:
        return path


def github(report: Report, fail_on: FailOn = "error") -> str:
    lines = []
    for o in report.objects:
        file = _prop(_gh_path(o.file))
        for f in o.findings:
            lines.append(f"::{f['severity']} file={file},line={f.get('line') or o.line},"
                         f"title={_prop('envelope[' + f['rule'] + ']')}::"
                         f"{_data(o.title + ': ' + f['message'])}")
        lines.extend(change_gate_github(o, file, fail_on))
    for n in report.not_evaluated:
        lines.append(f"::notice title={_prop('envelope[' + n.rule + ']')}::{_data(n.message)}")
    if report.skipped:
        lines.append(f"::notice title=envelope::{_data(report.skipped_summary())}")
    lines.append(report.summary())
    return "\n".join(lines) + "\n"


# --- the mutation gate (check --fail-on change) ------------------------------------------

FIX_HINT = "run `envelope fix` on the file to write the change, so git holds what the cluster stores"


def change_gate_level(severity: str, fail_on: FailOn) -> str:
    """A finding's SARIF level; a change is an error when the run fails on changes."""
    return "error" if severity == "change" and fail_on == "change" else _LEVELS[severity]


def change_gate_text(report: Report, fail_on: FailOn) -> str:
    if fail_on != "change" or not report.mutated:
        return ""
    return (f"fail-on change: {report.mutated} object(s) would be mutated by the webhook, so "
            f"the cluster would store something other than the files; {FIX_HINT}\n")


def change_gate_failures(o: ObjectResult, fail_on: FailOn) -> list[dict[str, Any]]:
    """JUnit failures for an object's mutations when the run fails on changes."""
    if fail_on != "change" or not o.patch:
        return []
    return [{"severity": "change", "rule": c["rule"], "path": c["path"],
             "message": f"{c['message']} (would be mutated; {FIX_HINT})", "line": c.get("line")}
            for c in o.changes]


def change_gate_github(o: ObjectResult, file: str, fail_on: FailOn) -> list[str]:
    """One annotation on the object's line with what the webhook would change and its
    JSON patch: a notice, or an error when the run fails on changes."""
    if not o.patch:
        return []
    level = "error" if fail_on == "change" else "notice"
    what = "; ".join(c["message"] for c in o.changes) or "the webhook changes it"
    patch = orjson.dumps(o.patch).decode()
    rules = ",".join(dict.fromkeys(c["rule"] for c in o.changes)) or "change"
    message = f"{o.title}: {what}\npatch: {patch}\n{FIX_HINT}"
    return [f"::{level} file={file},line={o.line},title={_prop('envelope[' + rules + '] would mutate')}::"
            f"{_data(message)}"]
