"""``check -o sarif``: SARIF 2.1.0, for GitHub code scanning and other SARIF viewers. A
rule's help (``help``, ``helpUri``, the per-family hint) comes from the rule reference,
:mod:`app.ruledocs`; changes are ``note`` results on the line they change."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson

from app.render.gate import change_gate_level
from app.render.reports import FailOn, Report

__all__ = ["SARIF_SCHEMA", "as_sarif", "render"]

SARIF_SCHEMA = ("https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/"
                "sarif-schema-2.1.0.json")


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


def as_sarif(report: Report, fail_on: FailOn = "error") -> dict[str, Any]:
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
        for f in [*o.findings, *o.changes]:
            result: dict[str, Any] = {
                "ruleId": f.rule,
                "level": change_gate_level(f.severity, fail_on, _LEVELS),
                "message": {"text": f"{o.title}: {f.message}"},
                "locations": [{
                    "physicalLocation": {"artifactLocation": artifact,
                                         "region": {"startLine": max(1, f.line or o.line)}},
                    "logicalLocations": [{"fullyQualifiedName": f"{o.api_version}/{o.title}"
                                                                f"#{f.path}",
                                          "kind": "object"}],
                }],
            }
            if f.rule in index:
                result["ruleIndex"] = index[f.rule]
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


def render(report: Report, fail_on: FailOn = "error") -> str:
    return orjson.dumps(as_sarif(report, fail_on), option=orjson.OPT_INDENT_2).decode() + "\n"
