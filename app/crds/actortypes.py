"""Typed views of agent-substrate's ``ate.dev/v1alpha1`` ActorTemplate and WorkerPool.

Only the fields Envelope reads are modelled; every other field is kept
(``extra="allow"``) and never judged, so a newer upstream schema passes through.
Quantities stay as written: :mod:`app.k8s.quantity` parses them where a rule can name
the path, so "not a quantity" is reported by a rule, never by the model.

Field names follow upstream ``pkg/api/v1alpha1`` (``actortemplate_types.go``,
``workerpool_types.go``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Annotated, Any, TypeVar, cast

import orjson
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from app.crds.substrate import pool_sandbox_classes
from app.k8s.quantity import QuantityError, format_bytes, format_cpu, parse_quantity
from app.k8s.selectors import LabelSelector
from app.k8s.util import Memo

__all__ = [
    "ACTOR_RESOURCES",
    "DEFAULT_SANDBOX_CLASS",
    "GPU",
    "GROUP",
    "GVISOR",
    "GVISOR_ONLY",
    "MICROVM",
    "ActorPlacement",
    "ActorTemplate",
    "LabelSelector",
    "MemoryFloor",
    "ResourceRequirements",
    "Size",
    "WorkerPool",
    "actor_size",
    "decode",
    "no_fit_message",
    "offered",
    "place_actor",
    "sandbox_class_of",
    "selects",
    "shortfall",
    "show",
    "show_all",
    "show_bytes",
    "worker_capacity",
]

GROUP = "ate.dev"
GVISOR = "gvisor"
MICROVM = "microvm"
DEFAULT_SANDBOX_CLASS = GVISOR
"""What the CRD defaults ``spec.sandboxClass`` to, on both kinds."""
GPU = "nvidia.com/gpu"
GVISOR_ONLY = frozenset({GPU})
ACTOR_RESOURCES = ("cpu", "memory", GPU)
"""What an actor may declare; GPU only on gVisor (micro-VMs have no passthrough)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)


class ResourceRequirements(_Model):
    """A ``corev1.ResourceRequirements``; values are quantities as written."""

    limits: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None
    claims: list[Any] | None = None


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

    @cached_property
    def sandbox_classes(self) -> frozenset[str]:
        """The classes the pool runs, from either upstream shape: ``spec.sandboxClasses``
        (current, kept as an extra field) or ``spec.sandboxClass`` (CRD era, default
        gvisor). See :func:`app.crds.substrate.read_pool_classes`."""
        spec = self.spec
        raw = dict(spec.model_extra or {})
        if "sandbox_class" in spec.model_fields_set:
            raw["sandboxClass"] = spec.sandbox_class
        return pool_sandbox_classes({"spec": raw})


# --------------------------------------------------------------------------- decoding

_M = TypeVar("_M", bound=_Model)
_NOT_DECODED = object()
DECODED_BUDGET = 16 * 2**20
_DECODED: Memo[tuple[str, bytes], Any] = Memo(4096, DECODED_BUDGET)
"""Decoded objects by the digest of their JSON, at most 16 MiB of them (measured):
every rule that reads the ActorTemplate of a review, and every review that reads the
same WorkerPool of the view, shares one decoding."""


def _validate(model: type[_M], obj: object) -> _M | ValidationError:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        return exc.with_traceback(None)  # kept in the memo: no frames with it


def decode(model: type[_M], obj: Mapping[str, Any]) -> _M | ValidationError:
    """``model.model_validate(obj)``, or why it does not validate, once per distinct
    object. The model is decoded from the JSON it is remembered by (not from ``obj``),
    so it shares nothing with an object a caller may change later. Objects orjson
    cannot write (non-string keys from a YAML file, nesting past its 255 levels) are
    decoded every time."""
    try:
        raw = orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError):
        return _validate(model, obj)
    key = (model.__name__, hashlib.blake2b(raw, digest_size=16).digest())
    found: object = _DECODED.get(key, _NOT_DECODED)
    if found is _NOT_DECODED:
        found = _validate(model, orjson.loads(raw))
        # A ValidationError keeps parts of the input where footprint cannot see: count them.
        _DECODED.put(key, found, extra=len(raw) if isinstance(found, ValidationError) else 0)
    # keyed by the model's name: what the memo holds for this key is a ``model`` or why not
    return cast("_M | ValidationError", found)


def sandbox_class_of(obj: Mapping[str, Any]) -> str:
    """``spec.sandboxClass`` of a raw object, defaulted; for indexes, which must not
    fail on malformed objects the models would reject."""
    spec = obj.get("spec")
    value = spec.get("sandboxClass") if isinstance(spec, Mapping) else None
    return value if isinstance(value, str) and value else DEFAULT_SANDBOX_CLASS


# --------------------------------------------------------------------------- sizes

Size = dict[str, Decimal]
"""Amounts by resource name (cpu in cores, memory in bytes); a name that is absent
was not declared, or was zero, and so constrains nothing."""


def positive(values: Mapping[str, Any] | None) -> Size:
    out: Size = {}
    for name in ACTOR_RESOURCES:
        if values and name in values:
            try:
                amount = parse_quantity(values[name])
            except QuantityError:
                continue  # reported by actor-limits / actor-pool-resources
            if amount > 0:
                out[name] = amount
    return out


def actor_size(template: ActorTemplate) -> Size:
    """The actor's declared limits: the size of its sandbox."""
    return positive(template.limits)


def worker_capacity(pool: WorkerPool) -> Size:
    """Per-worker capacity: the limits of the worker (``ateom``) container."""
    return positive(pool.resources.limits)


def offered(capacity: Size, name: str) -> Decimal | None:
    """What a worker offers of ``name``; ``None`` is unconstrained. Absent CPU or
    memory is unconstrained (the worker pod has no limit), an absent GPU is none."""
    if name == GPU:
        return capacity.get(GPU, Decimal(0))
    return capacity.get(name)


def shortfall(size: Size, capacity: Size) -> list[str]:
    """Resource names on which an actor of ``size`` does not fit a worker."""
    short = []
    for name, amount in size.items():
        most = offered(capacity, name)
        if most is not None and amount > most:
            short.append(name)
    return short


def largest_offer(capacities: list[Size], name: str) -> Decimal | None:
    offers = [offered(c, name) for c in capacities]
    if any(o is None for o in offers):
        return None
    return max((o for o in offers if o is not None), default=Decimal(0))


_DECIMAL_BYTES = (("T", Decimal(10) ** 12), ("G", Decimal(10) ** 9), ("M", Decimal(10) ** 6),
                  ("k", Decimal(10) ** 3))


def show_bytes(amount: Decimal) -> str:
    """``512Mi``, or a decimal unit when that is shorter: ``1G``, not ``1000000000``."""
    binary = format_bytes(amount)
    decimal = next((f"{amount // unit}{suffix}" for suffix, unit in _DECIMAL_BYTES
                    if amount and amount % unit == 0), binary)
    return decimal if len(decimal) < len(binary) else binary


def show(name: str, amount: Decimal, *, unit: bool = True) -> str:
    """``2 cpu``, ``512Mi memory``, ``1 GPU`` (``unit=False``: ``512Mi``)."""
    text = show_bytes(amount) if name == "memory" else format_cpu(amount)
    word = "GPU" if name == GPU else name
    return f"{text} {word}" if unit else text


def show_all(size: Size, names: list[str]) -> str:
    return ", ".join(show(name, size[name]) for name in names)


@dataclass(frozen=True)
class MemoryFloor:
    """The least memory a micro-VM actor can declare: VMM reserve + guest minimum."""

    reserve: Decimal
    guest_minimum: Decimal

    @property
    def total(self) -> Decimal:
        return self.reserve + self.guest_minimum

    def describe(self) -> str:
        return (f"{show_bytes(self.total)} ({show_bytes(self.reserve)} VMM reserve + "
                f"{show_bytes(self.guest_minimum)} guest minimum)")


# --------------------------------------------------------------------------- placement

def selects(selector: LabelSelector | None, pool: WorkerPool) -> bool:
    """Upstream's scheduler matches ``workerSelector`` against the Worker's labels,
    which the worker syncer copies from the WorkerPool's ``metadata.labels``."""
    return selector is None or selector.matches(pool.labels)


@dataclass(frozen=True)
class ActorPlacement:
    """Where an actor could go, narrowed step by step as upstream's scheduler does."""

    namespace: str
    sandbox_class: str
    selector: LabelSelector | None
    size: Size
    candidates: list[WorkerPool]
    """Same namespace and sandbox class."""
    eligible: list[WorkerPool]
    """... and selected by the template's ``workerSelector``."""
    fitting: list[WorkerPool]
    """... and with capacity >= the actor's size on every dimension."""

    @property
    def where(self) -> str:
        return self.namespace or "(no namespace)"

    def pools_phrase(self) -> str:
        """``microvm WorkerPool in team-a`` (+ ``matching workerSelector``)."""
        text = f"{self.sandbox_class} WorkerPool in {self.where}"
        return f"{text} matching workerSelector" if self.selector is not None else text


def place_actor(template: ActorTemplate, namespace: str, pools: list[WorkerPool]) -> ActorPlacement:
    size = actor_size(template)
    selector = template.spec.worker_selector
    eligible = [p for p in pools if selects(selector, p)]
    fitting = [p for p in eligible if not shortfall(size, worker_capacity(p))]
    return ActorPlacement(namespace, template.spec.sandbox_class, selector, size, pools, eligible, fitting)


def no_fit_message(found: ActorPlacement) -> str:
    capacities = [worker_capacity(p) for p in found.eligible]
    largest = {name: largest_offer(capacities, name) for name in found.size}
    short = [n for n, amount in found.size.items() if (most := largest[n]) is not None and amount > most]
    if not short:
        return (f"needs {show_all(found.size, list(found.size))} on one worker; "
                f"no {found.pools_phrase()} offers all of it")
    offers = [show(n, largest[n] or Decimal(0), unit=len(short) > 1 or n == GPU) for n in short]
    return (f"needs {show_all(found.size, short)}; the largest {found.pools_phrase()} "
            f"offers {', '.join(offers)}")
