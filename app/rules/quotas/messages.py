"""How quota findings are worded: amounts in their own units, names shortened, and a
warn-mode form that fits a Warning header."""

from __future__ import annotations

from decimal import Decimal

from app.crds.kai import (
    UNLIMITED,
    Resource,
    describe,
    effective,
    shortfall,
)
from app.k8s.util import brief
from app.rules.base import Finding, error
from app.rules.quotas.tree import Slot


def plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def names_list(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" +{len(names) - limit} more" if len(names) > limit else "")


def excess(resource: Resource, demand: Decimal, cap: Decimal) -> str:
    if effective(demand) == UNLIMITED:
        return f"an unlimited guarantee cannot fit in {describe(resource, cap)}"
    return f"{describe(resource, shortfall(demand, cap))} cannot be met"


def holders_text(resource: Resource, found: list[Slot]) -> str:
    ranked = sorted((s for s in found if effective(s.guarantee(resource)) != 0),
                    key=lambda s: (effective(s.guarantee(resource)) != UNLIMITED,
                                   -effective(s.guarantee(resource))))
    return names_list([f"{s.owner} {describe(resource, s.guarantee(resource))}" for s in ranked])


def quota_error(path: str, text: str) -> Finding:
    """An error whose warn-mode form fits a Warning header."""
    return error(path, text, as_warning=brief(text))


NUMBER_HINT = " (KAI quotas are plain numbers: gpu in cards, cpu in mCPU, memory in MB)"


def tree_warning(path: str, text: str) -> Finding:
    # "error" so that enforce mode can deny it; the rule's default mode (warn) shows it.
    return error(path, brief(text))
