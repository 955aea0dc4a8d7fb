"""Typed views of agent-substrate's ``ate.dev/v1alpha1`` ActorTemplate and WorkerPool.

Only the fields Envelope reads are modelled; every other field is kept
(``extra="allow"``) and never judged, so a newer upstream schema passes through.
Quantities stay as written: :mod:`app.quantity` parses them where a rule can name
the path, so "not a quantity" is reported by a rule, never by the model.

Field names follow upstream ``pkg/api/v1alpha1`` (``actortemplate_types.go``,
``workerpool_types.go``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = [
    "DEFAULT_SANDBOX_CLASS",
    "GPU",
    "GROUP",
    "GVISOR",
    "MICROVM",
    "ActorTemplate",
    "LabelSelector",
    "ResourceRequirements",
    "WorkerPool",
    "sandbox_class_of",
]

GROUP = "ate.dev"
GVISOR = "gvisor"
MICROVM = "microvm"
DEFAULT_SANDBOX_CLASS = GVISOR
"""What the CRD defaults ``spec.sandboxClass`` to, on both kinds."""
GPU = "nvidia.com/gpu"


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class ResourceRequirements(_Model):
    """A ``corev1.ResourceRequirements``; values are quantities as written."""

    limits: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None
    claims: list[Any] | None = None


class LabelSelectorRequirement(_Model):
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


class LabelSelector(_Model):
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


class ObjectMeta(_Model):
    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None


def _default_class(value: object) -> object:
    return DEFAULT_SANDBOX_CLASS if value in (None, "") else value


SandboxClass = Annotated[str, BeforeValidator(_default_class)]
"""``gvisor`` or ``microvm``; absent or empty means the CRD default."""


class ActorTemplateSpec(_Model):
    sandbox_class: SandboxClass = Field(DEFAULT_SANDBOX_CLASS, alias="sandboxClass")
    worker_selector: LabelSelector | None = Field(None, alias="workerSelector")
    resources: ResourceRequirements | None = None


class ActorTemplate(_Model):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: ActorTemplateSpec = Field(default_factory=ActorTemplateSpec)

    @property
    def limits(self) -> dict[str, Any]:
        resources = self.spec.resources
        return dict(resources.limits or {}) if resources is not None else {}


class WorkerPoolPodTemplate(_Model):
    resources: ResourceRequirements | None = None


class WorkerPoolSpec(_Model):
    sandbox_class: SandboxClass = Field(DEFAULT_SANDBOX_CLASS, alias="sandboxClass")
    template: WorkerPoolPodTemplate | None = None


class WorkerPool(_Model):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: WorkerPoolSpec = Field(default_factory=WorkerPoolSpec)

    @property
    def resources(self) -> ResourceRequirements:
        template = self.spec.template
        if template is None or template.resources is None:
            return ResourceRequirements()
        return template.resources

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.metadata.labels or {})


def sandbox_class_of(obj: Mapping[str, Any]) -> str:
    """``spec.sandboxClass`` of a raw object, defaulted; for indexes, which must not
    fail on malformed objects the models would reject."""
    spec = obj.get("spec")
    value = spec.get("sandboxClass") if isinstance(spec, Mapping) else None
    return value if isinstance(value, str) and value else DEFAULT_SANDBOX_CLASS
