"""``check -o github``: GitHub Actions workflow commands, shown as annotations on the
pull request."""

from __future__ import annotations

import os
from collections.abc import Iterable

from app.cluster.static import LoadError
from app.k8s.util import visible
from app.render.gate import change_gate_github
from app.render.reports import FailOn, Report

__all__ = ["input_errors", "render"]


def _data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF as the runner decodes them
    (toolkit ``escapeData``), every other control character as its escape."""
    return visible(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def _prop(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def _gh_path(path: str) -> str:
    """Annotations need the path relative to the repository (the working directory)."""
    try:
        return os.path.relpath(path) if not path.startswith("<") else path
    except ValueError:
        return path


def render(report: Report, fail_on: FailOn = "error") -> str:
    lines = []
    for o in report.objects:
        file = _prop(_gh_path(o.file))
        for f in o.findings:
            lines.append(f"::{f.severity} file={file},line={f.line or o.line},"
                         f"title={_prop('envelope[' + f.rule + ']')}::"
                         f"{_data(o.title + ': ' + f.message)}")
        lines.extend(change_gate_github(o, file, fail_on, _data, _prop))
    for n in report.not_evaluated:
        lines.append(f"::notice title={_prop('envelope[' + n.rule + ']')}::{_data(n.message)}")
    if report.skipped:
        lines.append(f"::notice title=envelope::{_data(report.skipped_summary())}")
    lines.append(visible(report.summary()))
    return "\n".join(lines) + "\n"


def input_errors(errors: Iterable[LoadError]) -> str:
    """An error annotation per file or document that could not be read (nothing was
    checked then), on the line it names (else line 1)."""
    return "".join(f"::error file={_prop(e.source)},line={e.line or 1},"
                   f"title=envelope[parse]::{_data(e.problem)}\n" for e in errors)
