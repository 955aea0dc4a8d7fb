"""The planner's page: one HTML document, inline CSS and script, nothing fetched but this
server's ``/api/judge`` and ``/api/export`` (``planserve.py``). Segments carry their
names as text (not only hover titles), numbers are in cards, cores and GiB, the search
box filters pools, departments and projects by name, and the export button stays
disabled while the planner reports an error."""

from __future__ import annotations

from pathlib import Path

__all__ = ["page"]

PAGE = Path(__file__).with_name("planner.html")
"""The page's source (package data: pyproject.toml ``[tool.setuptools.package-data]``)."""


def page() -> str:
    return PAGE.read_text(encoding="utf-8")
