"""Does a pod fit a node? kube-scheduler's filters, one node at a time, and what the
kubelet admits of a pod bound to a node (``decider=KUBELET``).

Pure functions over plain Kubernetes dicts; no I/O. Kubernetes v1.37.2, checked by the
scheduling oracle (``e2e/test_oracle_scheduling.py``, on v1.37.2 and v1.35.8) and the
DRA oracle (``e2e/test_oracle_dra.py``), which put the same nodes and pod through the
real kube-scheduler. The upstream file each filter ports: docs/fidelity.md, "The ports,
file by file". Not modelled (they need objects this module is not given): inter-pod
(anti-)affinity, topology spread, host ports, volumes.

Why one module of ~708 lines: the filters, the node model they read and the node
classes (``class_key`` must read exactly what ``_fit`` reads, or two nodes of a class
could get different verdicts) are one port of one upstream plugin set, checked together
by the scheduling oracle. API defaulting, which ran before them, is
``app/k8s/defaulting.py``; DRA devices are ``app/k8s/dra.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, Decimal
from typing import Any

import orjson

from app.k8s.dra import DeviceRequest, DeviceState, device_shortfalls
from app.k8s.quantity import QuantityError, parse_quantity

__all__ = [
    "CORDONED",
    "KUBELET",
    "LIFECYCLE_TAINT_KEYS",
    "PER_NODE_LABELS",
    "SCHEDULER",
    "STAND_IN",
    "DeviceDemand",
    "Mentions",
    "Node",
    "NodeGroup",
    "NodeVerdict",
    "PodPlacement",
    "Shortfall",
    "aggregate_container_limits",
    "aggregate_container_requests",
    "clamp_quantity",
    "class_key",
    "class_node",
    "fit_node",
    "mentions",
    "node_from_object",
    "node_selector_matches",
    "place_pod",
    "pod_requests",
    "tolerates",
]

ResourceList = dict[str, Decimal]

UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
CORDONED = "node is unschedulable (cordoned)"
LIFECYCLE_TAINT_KEYS = frozenset({
    "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable",
    "node.kubernetes.io/network-unavailable", "node.kubernetes.io/memory-pressure",
    "node.kubernetes.io/disk-pressure", "node.kubernetes.io/pid-pressure", UNSCHEDULABLE_TAINT_KEY,
})
"""Taints a node carries while in a state it leaves on its own: the node lifecycle controller
sets them from the node's conditions and cordon and removes them when those clear
(``nodeConditionToTaintKeyStatusMap`` and ``doNoScheduleTaintingPass``,
pkg/controller/nodelifecycle/node_lifecycle_controller.go at v1.37.2; a new Node gets
not-ready from the TaintNodesByCondition admission plugin). kube-scheduler's TaintToleration
filter rejects the node meanwhile and requeues the pod when the node's taints change
(pkg/scheduler/framework/plugins/tainttoleration): the pod waits, Pending, for the node to
recover. A node blocked by these (or its cordon) alone is ``NodeVerdict.recovers``."""
NOT_SELECTED = "node does not match the pod's nodeSelector / required node affinity"
_FILTERED_EFFECTS = ("NoSchedule", "NoExecute")
_HUGEPAGES = "hugepages-"
_QUALIFIED_NAME = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_INT64 = re.compile(r"^[+-]?[0-9]+$")


# ------------------------------------------------------------------ resource lists


_CAP = Decimal("1e24")


def clamp_quantity(value: Decimal) -> Decimal:
    """Quantities beyond 10^24 (no node has that much of anything; kube-scheduler's
    int64 counters end near 9.2e18) count as 10^24, so that sums and integer
    conversions of ``1e999999999`` stay cheap and cannot overflow a Decimal context."""
    if value.is_finite() and value.adjusted() > 24:
        return _CAP if value > 0 else -_CAP
    return value


def _resource_list(raw: object) -> ResourceList:
    """Parse a ResourceList; unparseable values raise QuantityError."""
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): clamp_quantity(parse_quantity(v)) for k, v in raw.items()}


def _add(into: ResourceList, other: Mapping[str, Decimal]) -> None:
    for name, value in other.items():
        into[name] = into.get(name, Decimal(0)) + value


def _max(into: ResourceList, other: Mapping[str, Decimal]) -> None:
    for name, value in other.items():
        if name not in into or value > into[name]:
            into[name] = value


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key)
    return [c for c in items if isinstance(c, Mapping)] if isinstance(items, list) else []


def _requirements(container: Mapping[str, Any], which: str) -> ResourceList:
    resources = container.get("resources")
    return _resource_list(resources.get(which)) if isinstance(resources, Mapping) else {}


def _is_sidecar(container: Mapping[str, Any]) -> bool:
    return container.get("restartPolicy") == "Always"


def _aggregate(spec: Mapping[str, Any], which: str) -> ResourceList:
    """component-helpers AggregateContainerRequests / AggregateContainerLimits."""
    total: ResourceList = {}
    for container in _containers(spec, "containers"):
        _add(total, _requirements(container, which))
    sidecars: ResourceList = {}
    init_peak: ResourceList = {}
    for container in _containers(spec, "initContainers"):
        own = _requirements(container, which)
        if _is_sidecar(container):
            _add(total, own)
            _add(sidecars, own)
            in_use = dict(sidecars)
        else:
            in_use = dict(own)
            _add(in_use, sidecars)
        _max(init_peak, in_use)
    _max(total, init_peak)
    return total


def aggregate_container_requests(spec: Mapping[str, Any]) -> ResourceList:
    """Sum of the regular containers' and sidecars' requests, or the largest
    "init container + sidecars started before it" when that is more, per resource
    (component-helpers resource/helpers.go ``AggregateContainerRequests``)."""
    return _aggregate(spec, "requests")


def aggregate_container_limits(spec: Mapping[str, Any]) -> ResourceList:
    """The same aggregate of the containers' limits (helpers.go ``AggregateContainerLimits``)."""
    return _aggregate(spec, "limits")


def is_supported_pod_level_resource(name: str) -> bool:
    """cpu, memory and hugepages-* (helpers.go ``IsSupportedPodLevelResource``)."""
    return name in ("cpu", "memory") or name.startswith(_HUGEPAGES)


def _pod_resources(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    resources = spec.get("resources")
    return resources if isinstance(resources, Mapping) else {}


def pod_requests(spec: Mapping[str, Any]) -> ResourceList:
    """The request the scheduler charges for a *stored* (already defaulted) pod:
    component-helpers ``PodRequests`` with PodLevelResources on (1.34 default)."""
    requests = aggregate_container_requests(spec)
    pod_level = _resource_list(_pod_resources(spec).get("requests"))
    if any(is_supported_pod_level_resource(n) for n in pod_level):
        for name, value in pod_level.items():
            if is_supported_pod_level_resource(name):
                requests[name] = value
    _add(requests, _resource_list(spec.get("overhead")))
    return requests


# ---------------------------------------------------------------------- node model


def _scheduler_units(name: str, value: Decimal) -> int:
    """How NodeResourcesFit counts a quantity: millicores for cpu, else the
    integer value; both rounded up away from zero (Quantity.MilliValue/Value)."""
    scaled = value * 1000 if name == "cpu" else value
    return int(scaled.to_integral_value(rounding=ROUND_CEILING)) if scaled >= 0 else \
        -int((-scaled).to_integral_value(rounding=ROUND_CEILING))


def scheduler_units(name: str, value: Decimal) -> int:
    """Public ``_scheduler_units`` (app/crds/autoscaling.py sizes potential nodes with it)."""
    return _scheduler_units(name, value)


def counted_requests(requests: Mapping[str, Decimal]) -> dict[str, int]:
    """The pod's request as NodeResourcesFit counts it, in scheduler units."""
    return _counted(requests)


def is_scalar_resource(name: str) -> bool:
    """pkg/scheduler/util/utils.go ``IsScalarResourceName``: extended resources,
    hugepages-*, ``*kubernetes.io/*`` prefixed names and attachable-volumes-*."""
    if name.startswith(_HUGEPAGES) or name.startswith("attachable-volumes-"):
        return True
    if "kubernetes.io/" in name:
        return True
    # IsExtendedResourceName: not native (has a "/" and no kubernetes.io/), not
    # "requests.*", and "requests.<name>" is a qualified name.
    if "/" not in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".rpartition("/")
    return bool(_QUALIFIED_NAME.match(f"requests.{name}")) and len(prefix) <= 253 and len(short) <= 63


_FIT_NAMED = ("cpu", "memory", "ephemeral-storage")


def _counted(requests: Mapping[str, Decimal]) -> dict[str, int]:
    """The pod's request as NodeResourcesFit sees it (after ``SetMaxResource``)."""
    out: dict[str, int] = {}
    for name, value in requests.items():
        if name in _FIT_NAMED or is_scalar_resource(name):
            out[name] = max(out.get(name, 0), _scheduler_units(name, value))
    return out


@dataclass(frozen=True)
class Node:
    """A node as the scheduler's filters see it.

    ``allocatable`` and ``requested`` are in scheduler units (millicores for cpu,
    integers otherwise); ``pods`` is how many pods it already runs. A node with
    ``potential=True`` does not exist yet: a shape an autoscaler could create
    (``app.crds.autoscaling``)."""

    name: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, str]] = ()
    unschedulable: bool = False
    requested: Mapping[str, int] = field(default_factory=dict)
    pods: int = 0
    potential: bool = False
    devices: DeviceState | None = None
    """The DRA devices the node reaches (``app.k8s.dra.node_device_states``), when the pod
    asks for any; not part of ``class_key`` (classes are split by it when it matters)."""


def node_from_object(node: Mapping[str, Any], pods_on_node: Iterable[Mapping[str, Any]] = ()) -> Node:
    """A ``Node`` from a Node object and the (stored) pods bound to it."""
    meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
    spec = node.get("spec") if isinstance(node.get("spec"), Mapping) else {}
    status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
    allocatable: dict[str, int] = {}
    for name, value in _resource_list(status.get("allocatable")).items():  # type: ignore[union-attr]
        if name in _FIT_NAMED or name == "pods" or is_scalar_resource(name):
            allocatable[name] = _scheduler_units(name, value)
    requested: dict[str, int] = {}
    count = 0
    for pod in pods_on_node:
        count += 1
        spec_p = pod.get("spec")
        if isinstance(spec_p, Mapping):
            for name, units in _counted(pod_requests(spec_p)).items():
                requested[name] = requested.get(name, 0) + units
    taints = [t for t in spec.get("taints") or [] if isinstance(t, Mapping)]  # type: ignore[union-attr]
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}  # type: ignore[union-attr]
    return Node(
        name=str(meta.get("name", "")),  # type: ignore[union-attr]
        allocatable=allocatable,
        labels={str(k): str(v) for k, v in labels.items()},  # type: ignore[union-attr]
        taints=tuple(taints),
        unschedulable=bool(spec.get("unschedulable")),  # type: ignore[union-attr]
        requested=requested,
        pods=count,
    )


# ------------------------------------------------------------------- placement rules


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """k8s.io/api/core/v1/toleration.go ``ToleratesTaint``: an empty effect matches
    every effect, an empty key (operator Exists) every key, Exists every value,
    Equal (or no operator) only the same value."""
    effect = toleration.get("effect") or ""
    if effect and effect != (taint.get("effect") or ""):
        return False
    key = toleration.get("key") or ""
    if key and key != (taint.get("key") or ""):
        return False
    operator = toleration.get("operator") or ""
    if operator in ("", "Equal"):
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return operator == "Exists"


def _tolerations(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    items = spec.get("tolerations")
    return [t for t in items if isinstance(t, Mapping)] if isinstance(items, list) else []


def untolerated_taint(spec: Mapping[str, Any], node: Node,
                      effects: Sequence[str] = _FILTERED_EFFECTS) -> Mapping[str, str] | None:
    """The first NoSchedule/NoExecute taint (of ``effects``) of ``node`` the pod does not tolerate."""
    tolerations = _tolerations(spec)
    for taint in node.taints:
        if taint.get("effect") not in effects:
            continue
        if not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def untolerated_taints(spec: Mapping[str, Any], node: Node,
                       effects: Sequence[str] = _FILTERED_EFFECTS) -> list[Mapping[str, str]]:
    """Every taint (of ``effects``) of ``node`` the pod does not tolerate."""
    tolerations = _tolerations(spec)
    return [t for t in node.taints if t.get("effect") in effects
            and not any(tolerates(x, t) for x in tolerations)]


def _requirement_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = str(expr.get("key", ""))
    operator = expr.get("operator")
    values = [str(v) for v in expr.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        if not _INT64.match(labels[key]) or not _INT64.match(values[0]):
            return False
        have, want = int(labels[key]), int(values[0])
        if not (-(2**63) <= have < 2**63 and -(2**63) <= want < 2**63):
            return False
        return have > want if operator == "Gt" else have < want
    return False


def _field_matches(expr: Mapping[str, Any], node_name: str) -> bool:
    values = [str(v) for v in expr.get("values") or []]
    if expr.get("key") != "metadata.name" or len(values) != 1:
        return False
    if expr.get("operator") == "In":
        return node_name == values[0]
    if expr.get("operator") == "NotIn":
        return node_name != values[0]
    return False


def _term_matches(term: Mapping[str, Any], node: Node) -> bool:
    exprs = [e for e in term.get("matchExpressions") or [] if isinstance(e, Mapping)]
    fields = [e for e in term.get("matchFields") or [] if isinstance(e, Mapping)]
    if exprs and not all(_requirement_matches(e, node.labels) for e in exprs):
        return False
    # nodeaffinity.go: matchFields are checked only when the node has a name.
    return not (fields and node.name and not all(_field_matches(e, node.name) for e in fields))


def node_selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    """A v1.NodeSelector (terms ORed, empty terms skipped) matches ``node``
    (``nodeaffinity.NewNodeSelector(...).Match``; a ResourceSlice's ``nodeSelector``)."""
    terms = [t for t in selector.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)
             and (t.get("matchExpressions") or t.get("matchFields"))]
    return any(_term_matches(t, node) for t in terms)


def required_affinity_matches(spec: Mapping[str, Any], node: Node) -> bool:
    """``nodeSelector`` (every pair) AND the required node affinity (any non-empty term)."""
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        for key, value in selector.items():
            if node.labels.get(str(key)) != str(value):
                return False
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, Mapping) else None
    if not isinstance(required, Mapping):
        return True
    terms = [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)
             and (t.get("matchExpressions") or t.get("matchFields"))]
    return any(_term_matches(t, node) for t in terms)


# --------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class Shortfall:
    """One resource a node lacks: the pod asks ``requested``; ``free`` of
    ``allocatable`` is left (scheduler units: millicores for cpu)."""

    resource: str
    requested: int
    free: int
    allocatable: int

    @property
    def missing(self) -> int:
        return self.requested - self.free


@dataclass(frozen=True)
class NodeVerdict:
    """Why a pod does or does not fit one node. ``blocked`` holds the placement
    reasons (unschedulable, selector/affinity, an untolerated taint); a node that
    is not blocked but short of room has ``shortfalls``."""

    node: Node
    blocked: tuple[str, ...] = ()
    shortfalls: tuple[Shortfall, ...] = ()
    transient: bool = False
    """Every reason in ``blocked`` is one the node leaves on its own (``LIFECYCLE_TAINT_KEYS``,
    its cordon)."""

    @property
    def fits(self) -> bool:
        return not self.blocked and not self.shortfalls

    @property
    def recovers(self) -> bool:
        """It does not take the pod now, but would once out of the states kube-scheduler
        waits out (not ready, unreachable, under pressure, cordoned): room and selection fit."""
        return bool(self.blocked) and self.transient and not self.shortfalls

    def distance(self) -> tuple[int, Decimal]:
        """Closeness of a node the pod may land on: fewer short resources, then
        the smaller sum of (missing / requested)."""
        ratio = sum((Decimal(s.missing) / Decimal(max(s.requested, 1)) for s in self.shortfalls),
                    Decimal(0))
        return (len(self.shortfalls), ratio)


SCHEDULER = "kube-scheduler"
KUBELET = "kubelet"
"""Who decides: kube-scheduler's filters, or the kubelet's admission of a pod bound to it
(``pkg/kubelet/lifecycle/predicate.go``: ``removeMissingExtendedResources`` — an extended
resource the node has no allocatable for is not checked —, then
``scheduler.AdmissionCheck``: NodeResourcesFit without DRA, node affinity, node name;
and NoExecute taints only; no cordon)."""


@dataclass(frozen=True)
class DeviceDemand:
    """What a pod asks of DRA devices: its claims' requests, and the requests an
    extended resource mapped by a DeviceClass becomes on a node with none of it in
    allocatable (``resource`` -> the class's request; its count is the pod's request)."""

    claims: tuple[DeviceRequest, ...] = ()
    mapped: Mapping[str, DeviceRequest] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.claims or self.mapped)


def fit_node(spec: Mapping[str, Any], node: Node,
             requests: Mapping[str, Decimal] | None = None, *, decider: str = SCHEDULER,
             devices: DeviceDemand | None = None) -> NodeVerdict:
    """The scheduler's filters for one node (or the kubelet's admission, ``decider``).
    ``spec`` is the *stored* pod spec (defaulted: see ``app.k8s.defaulting.default_pod``);
    ``requests`` overrides ``pod_requests(spec)``."""
    counted = _counted(requests if requests is not None else pod_requests(spec))
    return _fit(spec, node, counted, _tolerations(spec), decider, devices)


def _is_extended(name: str) -> bool:
    """``v1helper.IsExtendedResourceName``: not native (a "/" and no ``kubernetes.io/``)."""
    return "/" in name and "kubernetes.io/" not in name and is_scalar_resource(name)


def _fit(spec: Mapping[str, Any], node: Node, counted: Mapping[str, int],
         tolerations: list[Mapping[str, Any]], decider: str = SCHEDULER,
         devices: DeviceDemand | None = None) -> NodeVerdict:
    blocked: list[str] = []
    kubelet = decider == KUBELET
    if not kubelet and node.unschedulable and not any(
        tolerates(t, {"key": UNSCHEDULABLE_TAINT_KEY, "effect": "NoSchedule"}) for t in tolerations
    ):
        blocked.append(CORDONED)
    if not required_affinity_matches(spec, node):
        blocked.append(NOT_SELECTED)
    lasting = NOT_SELECTED in blocked
    taint = untolerated_taint(spec, node, ("NoExecute",) if kubelet else _FILTERED_EFFECTS) \
        if node.taints else None
    if taint is not None:
        value = f"={taint.get('value')}" if taint.get("value") else ""
        blocked.append(f"untolerated taint {taint.get('key')}{value}:{taint.get('effect')}")
        lasting = lasting or any(t.get("key") not in LIFECYCLE_TAINT_KEYS for t in untolerated_taints(
            spec, node, ("NoExecute",) if kubelet else _FILTERED_EFFECTS))
    shortfalls: list[Shortfall] = []
    allowed_pods = node.allocatable.get("pods", 0)
    if node.pods + 1 > allowed_pods:
        shortfalls.append(Shortfall("pods", 1, allowed_pods - node.pods, allowed_pods))
    delegated: list[DeviceRequest] = []
    for name in sorted(counted):
        want = counted[name]
        if want <= 0:
            continue
        if kubelet and name not in node.allocatable and _is_extended(name):
            continue  # removeMissingExtendedResources
        alloc = node.allocatable.get(name, 0)
        if devices and alloc <= 0 and name in devices.mapped:
            # fit.go shouldDelegateResourceToDRA: no allocatable, a class maps it
            delegated.append(replace(devices.mapped[name], count=want))
            continue
        free = alloc - node.requested.get(name, 0)
        if want > free:
            shortfalls.append(Shortfall(name, want, free, alloc))
    if devices and not kubelet:
        for short in device_shortfalls([*devices.claims, *delegated], node.devices):
            shortfalls.append(Shortfall(short.label, short.requested, short.free, short.total))
    return NodeVerdict(node=node, blocked=tuple(blocked), shortfalls=tuple(shortfalls),
                       transient=bool(blocked) and not lasting)


def node_shape(name: str, allocatable: Mapping[str, object], *, labels: Mapping[str, str] | None = None,
               taints: Sequence[Mapping[str, str]] = ()) -> Node:
    """A potential node (class 10): an empty node with this allocatable."""
    alloc: dict[str, int] = {}
    for res, raw in allocatable.items():
        try:
            alloc[res] = _scheduler_units(res, clamp_quantity(parse_quantity(raw)))
        except QuantityError:
            continue
    return Node(name=name, allocatable=alloc, labels=dict(labels or {}), taints=tuple(taints), potential=True)


# ------------------------------------------------------------ nodes judged by class
#
# A big cluster has thousands of Nodes and few node shapes. Every filter above reads a
# node's allocatable, requested and pod count, labels, taints, unschedulable flag and —
# for ``matchFields`` only — its name. Nodes equal in all of that but their name (and
# the labels that name one node) get the same verdict for every pod that does not
# mention them, so they are judged once, as a class (``place_pod``).

PER_NODE_LABELS = frozenset({"kubernetes.io/hostname"})
"""Label keys whose value names one node (the kubelet sets ``kubernetes.io/hostname``
to the node's hostname): kept out of a node's class like its name, or no two nodes
would share one."""

STAND_IN = "\x00"
"""The name, and the value of each per-node label, of the node that stands for a class
in ``place_pod``: compared only with what the pod mentions (``mentions``); a pod that
mentions this very string is judged node by node."""


@dataclass(frozen=True)
class Mentions:
    """The node names (``matchFields`` on ``metadata.name``) and per-node label values
    (``PER_NODE_LABELS``) a pod's node selection compares with. Nodes with one of them
    are judged on their own; every other node of a class is decided by the class.
    ``per_node``: the selection reads a per-node label in a way mentions cannot decide
    (``Gt``/``Lt``), or mentions ``STAND_IN``: judge every node on its own."""

    names: frozenset[str] = frozenset()
    labels: frozenset[tuple[str, str]] = frozenset()
    per_node: bool = False


def mentions(spec: Mapping[str, Any]) -> Mentions:
    """What ``required_affinity_matches`` compares node names and per-node labels with
    (read exactly as it reads them)."""
    names: set[str] = set()
    labels: set[tuple[str, str]] = set()
    per_node = False
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping):
        labels.update((str(k), str(v)) for k, v in selector.items() if str(k) in PER_NODE_LABELS)
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") \
        if isinstance(node_affinity, Mapping) else None
    terms = required.get("nodeSelectorTerms") or [] if isinstance(required, Mapping) else []
    for term in terms:
        if not isinstance(term, Mapping):
            continue
        for expr in term.get("matchExpressions") or []:
            if isinstance(expr, Mapping) and str(expr.get("key", "")) in PER_NODE_LABELS:
                values = [str(v) for v in expr.get("values") or []]
                labels.update((str(expr.get("key", "")), v) for v in values)
                per_node = per_node or expr.get("operator") in ("Gt", "Lt")
        for expr in term.get("matchFields") or []:
            if isinstance(expr, Mapping) and expr.get("key") == "metadata.name":
                names.update(str(v) for v in expr.get("values") or [])
    per_node = per_node or STAND_IN in names or any(v == STAND_IN for _, v in labels)
    return Mentions(frozenset(names), frozenset(labels), per_node)


def class_key(node: Node) -> str:
    """Everything the filters read of ``node`` except its name and per-node label
    values (whether it has a name, and which per-node labels, are kept): nodes with the
    same key get the same verdict for a pod that mentions neither (``mentions``)."""
    labels = {k: v for k, v in node.labels.items() if k not in PER_NODE_LABELS}
    return orjson.dumps({"a": dict(node.allocatable), "l": labels,
                         "p": sorted(k for k in node.labels if k in PER_NODE_LABELS),
                         "t": list(node.taints), "u": node.unschedulable, "n": bool(node.name),
                         "r": dict(node.requested), "c": node.pods},
                        option=orjson.OPT_SORT_KEYS).decode()


def class_node(key: str) -> Node:
    """The node that stands for a class: ``STAND_IN`` as its name (when its members have
    one) and as the value of each per-node label."""
    d = orjson.loads(key)
    labels = {**d["l"], **dict.fromkeys(d["p"], STAND_IN)}
    return Node(name=STAND_IN if d["n"] else "", allocatable=d["a"], labels=labels,
                taints=tuple(d["t"]), unschedulable=d["u"], requested=d["r"], pods=d["c"])


@dataclass(frozen=True)
class NodeGroup:
    """``count`` nodes judged through ``node``. A class: ``node`` is its stand-in and
    ``names`` lists its members (read only to name the closest node). A node judged on
    its own: count 1, ``names`` None."""

    node: Node
    count: int = 1
    names: Callable[[], Iterable[str]] | None = None

    def first_name(self) -> str:
        return self.node.name if self.names is None else min(self.names(), default="")


@dataclass(frozen=True)
class PodPlacement:
    """The pod against every node, as ``pod-fits-node`` words it: the same whether the
    nodes were judged one at a time (groups of one) or by class (``place_pod``).
    ``complete`` is False when ``place_pod`` reached its limit before any node took the pod:
    nothing is decided then. Otherwise, when nothing fits: ``closest`` (ties to the first
    name), how many nodes were judged, the distinct reasons nodes were blocked, and
    whether some node is blocked only by its cordon."""

    fits: bool
    complete: bool = True
    closest: NodeVerdict | None = None
    count: int = 0
    reasons: tuple[str, ...] = ()
    cordoned_only: bool = False
    recovering: tuple[str, ...] = ()
    """When no node takes the pod now but some would once recovered (``NodeVerdict.recovers``):
    what blocks them (distinct reasons), how many there are, the first one's name."""
    recovering_count: int = 0
    recovering_name: str = ""


def _placement(judged: Sequence[tuple[int, NodeVerdict]], closest: NodeVerdict | None) -> PodPlacement:
    return PodPlacement(False, closest=closest, count=sum(n for n, _ in judged),
                     reasons=tuple(sorted({r for _, v in judged for r in v.blocked})),
                     cordoned_only=any(v.blocked == (CORDONED,) and not v.shortfalls for _, v in judged))


def place_pod(spec: Mapping[str, Any], groups: Iterable[NodeGroup], requests: Mapping[str, Decimal],
              limit: int, *, name_closest: bool = True, decider: str = SCHEDULER,
              devices: DeviceDemand | None = None) -> PodPlacement:
    """kube-scheduler's filters over groups of nodes (see ``NodeGroup``): the same ``PodPlacement`` as
    judging every member on its own, when no class holds a node the pod mentions
    (``mentions``; those are given as groups of one). Stops at the first group that takes
    the pod; judges at most ``limit`` groups (then ``complete`` is False).
    ``name_closest=False``: the caller will not show the closest node's name, so a class
    that is closest alone keeps its stand-in's name (its members' names are read only to
    break a tie between classes). ``decider``, ``devices``: as ``fit_node``."""
    counted = _counted(requests)
    tolerations = _tolerations(spec)
    judged: list[tuple[NodeGroup, NodeVerdict]] = []
    total = 0
    for group in groups:
        if len(judged) >= limit:
            return PodPlacement(False, complete=False, count=total)
        verdict = _fit(spec, group.node, counted, tolerations, decider, devices)
        if verdict.fits:
            return PodPlacement(True)
        judged.append((group, verdict))
        total += group.count
    waiting = [(g, v) for g, v in judged if v.recovers]
    candidates = [(g, v) for g, v in judged if not v.blocked and v.shortfalls]
    closest = None
    if candidates:
        best = min(v.distance() for _, v in candidates)
        tied = [(g, v) for g, v in candidates if v.distance() == best]
        if len(tied) == 1 and not name_closest:
            named = [(tied[0][0].node.name, tied[0][1], tied[0][0])]
        else:
            named = [(g.first_name(), v, g) for g, v in tied]
        name, verdict, group = min(named, key=lambda t: t[0])
        closest = replace(verdict, node=replace(group.node, name=name))
    placement = _placement([(g.count, v) for g, v in judged], closest)
    if not waiting:
        return placement
    return replace(placement, recovering=tuple(sorted({r for _, v in waiting for r in v.blocked})),
                   recovering_count=sum(g.count for g, _ in waiting),
                   recovering_name=min(g.first_name() for g, _ in waiting) if name_closest else "")
