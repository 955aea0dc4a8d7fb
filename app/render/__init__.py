"""``envelope check``'s output formats, one module each, chosen through one registry.

A renderer is a pure function of a :class:`~app.render.reports.Report` (and ``--fail-on``, for
the formats that carry an exit status) to the text written to stdout. It reads the
structured results: each object's located findings and changes, its exemptions, the
RFC 6902 patch the mutating webhook would answer with, and the engine's
:class:`~app.core.engine.Evaluation` itself (``ObjectResult.evaluation``), so a format that
reports mutations has them. A new format is a module here and a line in
:data:`RENDERERS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from app.cluster.static import LoadError
from app.render import github, json, junit, sarif, text
from app.render.reports import FailOn, Report

__all__ = ["FORMATS", "INPUT_ERRORS", "RENDERERS", "Renderer", "render", "render_input_errors"]

Renderer = Callable[[Report, FailOn], str]

RENDERERS: dict[str, Renderer] = {
    "text": text.render,
    "human": text.render,
    "json": json.render,
    "sarif": sarif.render,
    "junit": junit.render,
    "github": github.render,
}
"""``-o`` value -> renderer (``human`` is an alias of ``text``)."""

FORMATS = tuple(RENDERERS)

INPUT_ERRORS: dict[str, Callable[[Iterable[LoadError]], str]] = {"github": github.input_errors}
"""Formats that also say, on stdout, which input could not be read (every format says
it on stderr, and nothing is checked)."""


def render(report: Report, fmt: str, fail_on: FailOn = "error") -> str:
    """The report in ``fmt`` (one of :data:`FORMATS`), ending with a newline."""
    renderer = RENDERERS.get(fmt)
    if renderer is None:
        raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return renderer(report, fail_on)


def render_input_errors(fmt: str, errors: Iterable[LoadError]) -> str:
    """What ``fmt`` writes to stdout about unreadable input ("" for most formats)."""
    renderer = INPUT_ERRORS.get(fmt)
    return renderer(errors) if renderer is not None else ""
