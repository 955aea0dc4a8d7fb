"""The mutation gate (``check --fail-on change``), in every format: a run fails when any
object would be mutated by the webhook, and each format says which and how."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from app.k8s.util import cut
from app.render.reports import FailOn, Located, ObjectResult, Report

__all__ = ["FIX_HINT", "change_gate_failures", "change_gate_github", "change_gate_level",
           "change_gate_text"]

FIX_HINT = "run `envelope fix` on the file to write the change, so git holds what the cluster stores"
PATCH_SHOWN = 2048
"""Characters of the JSON patch an annotation shows (a patch carries the object's values:
a megabyte env value must not make a megabyte annotation; ``-o json`` has it whole)."""


def change_gate_level(severity: str, fail_on: FailOn, levels: dict[str, str]) -> str:
    """A finding's SARIF level; a change is an error when the run fails on changes."""
    return "error" if severity == "change" and fail_on == "change" else levels[severity]


def change_gate_text(report: Report, fail_on: FailOn) -> str:
    if fail_on != "change" or not report.mutated:
        return ""
    return (f"fail-on change: {report.mutated} object(s) would be mutated by the webhook, so "
            f"the cluster would store something other than the files; {FIX_HINT}\n")


def change_gate_failures(o: ObjectResult, fail_on: FailOn) -> list[Located]:
    """JUnit failures for an object's mutations when the run fails on changes."""
    if fail_on != "change" or not o.patch:
        return []
    return [Located("change", c.rule, c.path, f"{c.message} (would be mutated; {FIX_HINT})", c.line)
            for c in o.changes]


def change_gate_github(o: ObjectResult, file: str, fail_on: FailOn, data: Callable[[str], str],
                       prop: Callable[[str], str]) -> list[str]:
    """One annotation on the object's line with what the webhook would change and its
    JSON patch: a notice, or an error when the run fails on changes (``data`` and ``prop``
    escape a workflow command's message and properties)."""
    if not o.patch:
        return []
    level = "error" if fail_on == "change" else "notice"
    what = cut("; ".join(c.message for c in o.changes) or "the webhook changes it", PATCH_SHOWN)
    patch = cut(orjson.dumps(o.patch).decode(), PATCH_SHOWN)
    rules = ",".join(dict.fromkeys(c.rule for c in o.changes)) or "change"
    message = f"{o.title}: {what}\npatch: {patch}\n{FIX_HINT}"
    return [f"::{level} file={file},line={o.line},title={prop('envelope[' + rules + '] would mutate')}::"
            f"{data(message)}"]
