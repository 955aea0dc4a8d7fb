"""``metav1.LabelSelector``: matching, kubectl's text form, and what the API server
refuses (``LabelSelectorAsSelector``). Used for WorkerPool selection and for policy
exceptions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LabelSelector", "LabelSelectorRequirement", "StrictLabelSelector"]


class _Selector(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class LabelSelectorRequirement(_Selector):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] | None = None

    def problem(self) -> str | None:
        """What ``metav1.LabelSelectorAsSelector`` would reject, if anything."""
        has_values = bool(self.values)
        if self.operator in ("In", "NotIn") and not has_values:
            return f"{self.key} {self.operator} needs values"
        if self.operator in ("Exists", "DoesNotExist") and has_values:
            return f"{self.key} {self.operator} takes no values"
        return None

    def matches(self, labels: Mapping[str, str]) -> bool:
        values = self.values or []
        if self.operator == "In":
            return self.key in labels and labels[self.key] in values
        if self.operator == "NotIn":
            return self.key not in labels or labels[self.key] not in values
        if self.operator == "Exists":
            return self.key in labels
        return self.key not in labels

    def describe(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return self.key if self.operator == "Exists" else f"!{self.key}"
        word = "in" if self.operator == "In" else "notin"
        return f"{self.key} {word} ({','.join(self.values or [])})"


class LabelSelector(_Selector):
    """A ``metav1.LabelSelector``: every matchLabels pair and every expression must
    hold. An empty selector selects everything, as upstream's scheduler reads it."""

    match_labels: dict[str, str] | None = Field(None, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] | None = Field(None, alias="matchExpressions")

    def problems(self) -> list[str]:
        found = (req.problem() for req in self.match_expressions or [])
        return [p for p in found if p is not None]

    def matches(self, labels: Mapping[str, str]) -> bool:
        pairs = self.match_labels or {}
        if any(labels.get(key) != value for key, value in pairs.items()):
            return False
        return all(req.matches(labels) for req in self.match_expressions or [])

    def describe(self) -> str:
        """``kubectl``'s selector syntax: ``tier=gpu,zone in (a,b)``."""
        parts = [f"{k}={v}" for k, v in sorted((self.match_labels or {}).items())]
        parts += [req.describe() for req in self.match_expressions or []]
        return ",".join(parts) or "(everything)"


class _StrictRequirement(LabelSelectorRequirement):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class StrictLabelSelector(LabelSelector):
    """A selector in Envelope's own configuration: an unknown key (``matchLabel``) is an
    error, not a selector that silently selects everything."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    match_expressions: list[_StrictRequirement] | None = Field(  # type: ignore[assignment]
        None, alias="matchExpressions")
