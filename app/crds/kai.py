"""KAI quota objects: typed models, exact arithmetic and the units they are written in.

Four cluster-scoped kinds: ``kai.resources/v1alpha1`` NodePool, Department and Project
(KAI Resource Management) and ``scheduling.run.ai/v2`` Queue (KAI Scheduler). Quotas are
plain JSON numbers: gpu in cards (0.5 is half a card), cpu in millicores, memory in MB of
10^6 bytes; ``-1`` is unlimited, ``0`` a real ceiling (docs/quotas.md, "The objects").
The models accept what the CRDs accept and nothing else; :func:`parse` turns a rejection
into :class:`SchemaError` values naming the field. Every number used in arithmetic goes
through :func:`exact` (a Decimal of its shortest text), so 0.1 + 0.2 cards fit in 0.3.

Why one module of ~436 lines: the typed models of the four kinds, their schema errors and
the exact arithmetic in their units are what every quota rule and the quota picture read
together; most of the length is the pydantic models and the error wording.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal, NamedTuple, TypeVar, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from app.k8s.quantity import QuantityError, parse_quantity, shown
from app.k8s.util import Memo, digest, plain_number

__all__ = [
    "DEFAULT_POOL",
    "KAI_GROUP",
    "KRM_GROUP",
    "RESOURCES",
    "UNLIMITED",
    "Amounts",
    "DepartmentSpec",
    "KaiQueueSpec",
    "NodePoolSpec",
    "ProjectSpec",
    "QueueEntry",
    "Resource",
    "SchemaError",
    "describe",
    "effective",
    "exact",
    "exceeds",
    "grew",
    "node_cards",
    "node_labels",
    "parse",
    "project_namespace",
    "queue_name",
    "shortfall",
    "status_resource",
    "total",
    "unknown_fields",
]

KRM_GROUP = "kai.resources"
KAI_GROUP = "scheduling.run.ai"
DEFAULT_POOL = "default"
"""The built-in pool: no labels, catches every node no other pool selects."""

Resource = Literal["gpu", "cpu", "memory"]
RESOURCES: tuple[Resource, ...] = ("gpu", "cpu", "memory")
UNLIMITED = Decimal(-1)
ZERO = Decimal(0)
INT32 = (-(2**31), 2**31 - 1)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"


# --- models ---------------------------------------------------------------------------

class _Model(BaseModel):
    # strict: "32Gi" is not a number and 5 is not a string, as in the API server.
    # Unknown fields are kept aside (not refused): the API server prunes them, and
    # ``unknown_fields`` lists them so a typo can be pointed out.
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="allow", frozen=True,
                              alias_generator=to_camel, populate_by_name=True)


class KrmResource(_Model):
    """``SystemResource`` of KRM: one resource of a queue entry."""

    deserved: float | None = None
    limit: float | None = None
    over_quota_weight: float | None = None


class KaiResource(_Model):
    """``QueueResource`` of a KAI ``Queue``: ``quota`` is KRM's ``deserved``."""

    quota: float | None = None
    limit: float | None = None
    over_quota_weight: float | None = None


class KrmResources(_Model):
    gpu: KrmResource | None = None
    cpu: KrmResource | None = None
    memory: KrmResource | None = None


class KaiResources(_Model):
    gpu: KaiResource | None = None
    cpu: KaiResource | None = None
    memory: KaiResource | None = None


class Amounts(NamedTuple):
    """One resource of one queue, exact, with the defaults applied (absent = 0)."""

    guarantee: Decimal
    """``deserved`` (KRM) or ``quota`` (KAI Queue)."""
    limit: Decimal
    weight: Decimal
    limit_set: bool
    """False when ``limit`` was left out: it is then 0, a ceiling of zero."""


_NO_AMOUNTS = Amounts(ZERO, ZERO, ZERO, False)


def _amounts(block: KrmResource | KaiResource | None) -> Amounts:
    if block is None:
        return _NO_AMOUNTS
    guarantee = block.deserved if isinstance(block, KrmResource) else block.quota
    return Amounts(exact(guarantee), exact(block.limit), exact(block.over_quota_weight),
                   block.limit is not None)


class QueueEntry(_Model):
    """An item of ``spec.queues`` on a Department or Project."""

    name: str
    nodepool: str
    priority: float | None = None
    """An int32 in the CRD; kept as a number so that rule ``kai-values`` can say why 1.5 fails."""
    resources: KrmResources | None = None

    def amounts(self, resource: Resource) -> Amounts:
        return _amounts(getattr(self.resources, resource) if self.resources else None)


class DepartmentSpec(_Model):
    queues: list[QueueEntry]


class ProjectSpec(_Model):
    parent: str | None = None
    queues: list[QueueEntry]
    default_node_pools: list[str] | None = None
    namespace: str | None = None
    enforce_kai_scheduler: bool | None = None
    deletion_type: str | None = None


class NodePoolSpec(_Model):
    label_key: str | None = None
    label_value: str | None = None
    preferred_network_topology_name: str | None = None
    scheduling_shard_config: dict[str, Any] | None = None
    """Scheduler settings; not read here, typed only as an object."""


class KaiQueueSpec(_Model):
    display_name: str | None = None
    parent_queue: str | None = None
    priority: float | None = None
    resources: KaiResources | None = None
    preempt_min_runtime: str | None = None
    reclaim_min_runtime: str | None = None

    def amounts(self, resource: Resource) -> Amounts:
        return _amounts(getattr(self.resources, resource) if self.resources else None)


SPEC_MODELS: dict[tuple[str, str], type[_Model]] = {
    (KRM_GROUP, "Department"): DepartmentSpec,
    (KRM_GROUP, "Project"): ProjectSpec,
    (KRM_GROUP, "NodePool"): NodePoolSpec,
    (KAI_GROUP, "Queue"): KaiQueueSpec,
}


# --- parsing --------------------------------------------------------------------------

@dataclass(frozen=True)
class SchemaError:
    path: str
    """Dotted path from the object root, e.g. ``spec.queues[1].resources.gpu.deserved``."""
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


M = TypeVar("M", bound=_Model)
Parsed = tuple[_Model | None, tuple[SchemaError, ...]]


PARSED_BUDGET = 16 * 2**20
_parsed: Memo[tuple[type[_Model], bytes], Parsed] = Memo(20_000, PARSED_BUDGET)
"""Typed specs by the digest of the spec (``util.digest``), at most 16 MiB of them,
measured (issue 38: 250 distinct 1 MB Departments held 819 MiB when keyed by bytes)."""


def parse(model: type[M], spec: Any) -> tuple[M | None, tuple[SchemaError, ...]]:
    """The typed spec, or None and why not. Never raises on bad input.

    Results are remembered by the spec's content (not its identity), so a sibling
    read by many requests, or by every object of ``envelope check``, is validated
    once, and a changed object is never served a stale model.
    """
    if spec is None:
        spec = {}
    try:
        key = (model, digest(spec))
    except TypeError:  # not JSON (e.g. YAML dates): validate without remembering
        return _validate(model, spec)
    found = _parsed.get(key)
    if found is None:
        found = _parsed.put(key, _validate(model, spec))
    # The key holds the model, so what it remembers was validated by ``model``.
    return cast(tuple[M | None, tuple[SchemaError, ...]], found)


def unknown_fields(model: _Model, path: str = "spec") -> Iterator[str]:
    """Paths of the fields the CRD does not know (the API server drops them)."""
    for key in model.model_extra or {}:
        yield f"{path}.{key}"
    for name, info in type(model).model_fields.items():
        value, where = getattr(model, name), f"{path}.{info.alias or name}"
        if isinstance(value, _Model):
            yield from unknown_fields(value, where)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, _Model):
                    yield from unknown_fields(item, f"{where}[{i}]")


def _validate(model: type[M], spec: Any) -> tuple[M | None, tuple[SchemaError, ...]]:
    try:
        return model.model_validate(spec), ()
    except ValidationError as exc:
        return None, tuple(SchemaError(_path(("spec", *e["loc"])), _message(e))
                           for e in exc.errors())


def _path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return shown(value)  # a long string by its start and length
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    return str(value)


_EXPECTED = {
    "float_type": "a number", "int_type": "a whole number", "string_type": "a string",
    "bool_type": "true or false", "list_type": "a list", "model_type": "an object",
    "dict_type": "an object", "model_attributes_type": "an object",
    "finite_number": "a finite number",
}


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field is missing"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_shown(error.get('input'))}"
    return str(error["msg"])


# --- exact arithmetic -----------------------------------------------------------------

@lru_cache(maxsize=8192)
def exact(value: float | int | None) -> Decimal:
    """The exact decimal a user wrote: ``Decimal(str(0.1)) == Decimal("0.1")``."""
    if value is None:
        return ZERO
    return Decimal(str(value))


def effective(value: Decimal) -> Decimal:
    """A guarantee as a sum sees it: negatives other than -1 are invalid (rule
    ``kai-values`` reports them) and count as 0 rather than hide someone else's excess."""
    return value if value >= 0 or value == UNLIMITED else ZERO


def total(values: Iterable[Decimal]) -> Decimal:
    """The sum of guarantees; one unlimited term makes the sum unlimited."""
    out = ZERO
    for value in values:
        term = effective(value)
        if term == UNLIMITED:
            return UNLIMITED
        out += term
    return out


def exceeds(demand: Decimal, cap: Decimal) -> bool:
    """True when ``demand`` does not fit under ``cap`` (-1 = unlimited on either side)."""
    demand = effective(demand)
    if cap == UNLIMITED:
        return False
    if demand == UNLIMITED:
        return True
    return demand > cap


def shortfall(demand: Decimal, cap: Decimal) -> Decimal:
    """How much of ``demand`` cannot be met under ``cap`` (UNLIMITED for an unlimited demand)."""
    if not exceeds(demand, cap):
        return ZERO
    return UNLIMITED if effective(demand) == UNLIMITED else demand - cap


def grew(old: Decimal, new: Decimal) -> bool:
    """Whether a guarantee went up (to unlimited counts; from unlimited never does)."""
    old, new = effective(old), effective(new)
    if old == UNLIMITED:
        return False
    return new == UNLIMITED or new > old


# --- units ----------------------------------------------------------------------------

def describe(resource: Resource, value: Decimal) -> str:
    """An amount in the resource's own units: ``1 card``, ``2.5 cards``, ``500 mCPU``,
    ``64000 MB``, ``unlimited``."""
    if value == UNLIMITED:
        return "unlimited"
    number = plain_number(value)
    if resource == "gpu":
        return f"{number} card" if value == 1 else f"{number} cards"
    return f"{number} mCPU" if resource == "cpu" else f"{number} MB"


# --- status keys ----------------------------------------------------------------------

STANDARD_RESOURCES = frozenset({"cpu", "memory", "ephemeral-storage", "storage", "pods"})
"""Unprefixed resource names a container may request (with ``hugepages-<size>``): never a
DeviceClass name in a Queue status."""


def status_resource(key: str) -> Resource | None:
    """The quota resource a key of a KAI Queue's ``status.allocated`` (``requested``,
    ``allocatedNonPreemptible``) counts in, as KAI counts it; None for a key no quota of
    the spec covers (``ephemeral-storage``, ``pods``, ``nvidia.com/gpu.memory``...).

    KAI sums, per pod, the containers' requests (``nvidia.com/gpu`` and any other device
    plugin's ``<vendor>/gpu``) and, for DRA, the devices of each claim whose
    DeviceClass name contains ``gpu`` (any case), keyed by **the DeviceClass name**
    (e.g. ``gpu.nvidia.com``): ``pkg/common/resources/dra.go`` ``IsGPUDeviceClass``
    (line 155), ``ExtractDRAGPUResourcesFromClaims`` (124) and
    ``DRAGPUResourceListFromClaims`` (303), called by
    ``pkg/podgroupcontroller/controllers/metadata/pod.go`` (106, 125); the queue controller
    sums the PodGroups' lists (``pkg/queuecontroller/controllers/resource_updater/
    resource_updater.go`` 71-74), and the scheduler counts the same claims in the GPU
    quota (``pkg/scheduler/api/resource_info/gpu_resource_requirment.go``
    ``GetGpusQuota``, 183-198), all at KAI-Scheduler d5bc503a. A claim KAI made for a
    DRA extended resource is skipped there (its cards are already under the container's
    resource name), so the two kinds of keys add up without counting a card twice.

    A DeviceClass name is a DNS subdomain (no ``/``), while a device plugin's resource
    name is prefixed (``vendor/name``) and the unprefixed container resources are the
    standard ones, none of which holds ``gpu``: so an unprefixed key holding ``gpu`` is
    a DRA GPU class (``gpu``, KAI's own ``constants.GpuResource``, included)."""
    if key == "cpu":
        return "cpu"
    if key == "memory":
        return "memory"
    if key.endswith("/gpu"):
        return "gpu"
    if "/" not in key and "gpu" in key.lower() and key not in STANDARD_RESOURCES \
            and not key.startswith("hugepages-"):
        return "gpu"
    return None


# --- names ----------------------------------------------------------------------------

def queue_name(entry_name: str, owner: str, nodepool: str) -> str:
    """The KAI Queue a queue entry becomes: its name, or (left empty) ``<owner>`` on the
    default pool and ``<owner>-<pool>`` elsewhere, as KRM derives it."""
    if entry_name:
        return entry_name
    return owner if nodepool == DEFAULT_POOL else f"{owner}-{nodepool}"


def project_namespace(project: str, namespace: str | None) -> str:
    """The namespace a Project claims: ``spec.namespace``, else ``kai-<project name>``."""
    return namespace or f"kai-{project}"


# --- nodes ----------------------------------------------------------------------------

def _count(value: Any) -> Decimal:
    try:
        return parse_quantity(value) if value is not None else ZERO
    except QuantityError:
        return ZERO


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def node_labels(node: dict[str, Any]) -> dict[str, Any]:
    return _mapping(_mapping(node.get("metadata")).get("labels"))


def node_cards(node: dict[str, Any]) -> Decimal:
    """GPU cards on a node: the largest of allocatable, capacity and the
    ``nvidia.com/gpu.count`` label (a node being drained may report 0 allocatable)."""
    status = _mapping(node.get("status"))
    return max(_count(_mapping(status.get("allocatable")).get(GPU_RESOURCE)),
               _count(_mapping(status.get("capacity")).get(GPU_RESOURCE)),
               _count(node_labels(node).get(GPU_COUNT_LABEL)))
