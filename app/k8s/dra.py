"""Dynamic resource allocation (``resource.k8s.io/v1``): the devices a node can give a pod.

Pure functions over plain Kubernetes dicts; no I/O. ``pod-fits-node`` uses them for the
two ways a pod asks for DRA devices on Kubernetes 1.37 — the claims it names, and the
extended resources a DeviceClass maps — checked against the real kube-scheduler by
``e2e/test_oracle_dra.py``. Which devices a node reaches, what is decided, what is not
(treated as "may match": it can only let a pod through, never refuse it): docs/fidelity.md,
"DRA scheduling oracle" and "The ports, file by file". The selectors' CEL subset is
``app/k8s/dracel.py``.

Why one module of ~451 lines: device classes, pools and the devices each node reaches,
claims and the allocation check (Hall's condition over a pod's requests) are one port of
the DRA allocator's structured model, read beside the upstream files it cites and
checked together by the DRA oracle.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

from app.k8s.dracel import cel_match, cel_references

__all__ = [
    "DEVICE_CLASS_PREFIX",
    "DeviceClass",
    "DeviceRequest",
    "DeviceShortfall",
    "DeviceState",
    "allocated_devices",
    "claim_requests",
    "device_classes",
    "device_shortfalls",
    "extended_resource_classes",
    "node_device_states",
    "pod_claim_requests",
]

DEVICE_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
"""``resourceapi.ResourceDeviceClassPrefix``: the implicit extended resource of a class."""

HALL_LIMIT = 12
"""Up to this many ExactCount requests, every subset is checked (exact); beyond, each
request alone and all together (still only refusals that are proven)."""


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


# ------------------------------------------------------------------- device classes


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str | None, ...] = ()
    """CEL expressions; None for a selector that is not CEL (cannot decide)."""
    extended_resource_name: str = ""
    created: str = ""


def _selectors(raw: object) -> tuple[str | None, ...]:
    out: list[str | None] = []
    for item in _list(raw):
        expression = _map(_map(item).get("cel")).get("expression")
        out.append(expression if isinstance(expression, str) else None)
    return tuple(out)


def device_classes(objects: Iterable[Mapping[str, Any]]) -> dict[str, DeviceClass]:
    out: dict[str, DeviceClass] = {}
    for obj in objects:
        meta, spec = _map(obj.get("metadata")), _map(obj.get("spec"))
        name = _str(meta.get("name"))
        if name:
            out[name] = DeviceClass(name, _selectors(spec.get("selectors")),
                                    _str(spec.get("extendedResourceName")),
                                    _str(meta.get("creationTimestamp")))
    return out


def extended_resource_classes(classes: Mapping[str, DeviceClass]) -> dict[str, str]:
    """Extended resource name -> the class that serves it: every class's implicit
    ``deviceclass.resource.kubernetes.io/<name>``, and ``extendedResourceName`` (newest
    class first, then the lower name; RFC 3339 timestamps sort as times)."""
    out = {DEVICE_CLASS_PREFIX + name: name for name in classes}
    ordered = sorted(classes.values(), key=lambda c: (c.created, _Reversed(c.name)), reverse=True)
    for c in ordered:
        if c.extended_resource_name and c.extended_resource_name not in out:
            out[c.extended_resource_name] = c.name
    return out


@dataclass(frozen=True)
class _Reversed:
    """Sorts in reverse, so that ``reverse=True`` keeps the lower name first on a tie."""

    value: str

    def __lt__(self, other: _Reversed) -> bool:
        return self.value > other.value


# ------------------------------------------------------------------------ the devices

Shape = tuple[str, tuple[tuple[str, object], ...]]
"""A device as the pod's selectors see it: its driver and the attributes they read."""


@dataclass(frozen=True)
class DeviceState:
    """The devices one node can reach, projected on what the pod's selectors read:
    how many of each shape are free and how many taken; whether the node reaches an
    incomplete pool (``unsettled_pool``: the driver is publishing it) or an invalid one
    (duplicate device names)."""

    free: tuple[tuple[Shape, int], ...] = ()
    used: tuple[tuple[Shape, int], ...] = ()
    unsettled_pool: bool = False
    invalid_pool: bool = False


EMPTY = DeviceState()


def _attribute_value(raw: object) -> object:
    value = _map(raw)
    for kind in ("string", "int", "bool"):
        if kind in value:
            found = value[kind]
            if kind == "int" and isinstance(found, int) and not isinstance(found, bool):
                return found
            if kind == "string" and isinstance(found, str):
                return found
            if kind == "bool" and isinstance(found, bool):
                return found
    return _UNDECIDED


_UNDECIDED = object()
"""An attribute of a type the subset does not compare (version, list): a comparison
with it cannot be decided (the device may match)."""


def _shape(driver: str, device: Mapping[str, Any], keys: frozenset[str]) -> Shape:
    attrs: list[tuple[str, object]] = []
    for raw_key, raw in _map(device.get("attributes")).items():
        key = raw_key if "/" in raw_key else f"{driver}/{raw_key}"
        if key in keys:
            value = _attribute_value(raw)
            attrs.append((key, "\x00undecided" if value is _UNDECIDED else value))
    attrs.sort(key=lambda kv: kv[0])
    return (driver if "driver" in keys else "", tuple(attrs))


def _shared(device: Mapping[str, Any]) -> bool:
    """A device more than one claim may hold (consumable capacity), or one whose
    availability depends on shared counters: never counted as taken."""
    return bool(device.get("allowMultipleAllocations")) or bool(device.get("consumesCounters"))


_Relevant = dict[tuple[str, str], list[tuple[Mapping[str, Any], list[Mapping[str, Any]]]]]


def _add(into: _Relevant, s: Mapping[str, Any], devices: list[Mapping[str, Any]]) -> None:
    spec = _map(s.get("spec"))
    pid = (_str(spec.get("driver")), _str(_map(spec.get("pool")).get("name")))
    into.setdefault(pid, []).append((s, devices))


def _generation(s: Mapping[str, Any]) -> int:
    gen = _map(_map(s.get("spec")).get("pool")).get("generation")
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


@dataclass
class _Pool:
    generation: int
    count: int
    slices: int


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    """The (driver, pool, device) the claims' allocations take: each claim's
    ``status.allocation.devices.results`` but those with ``adminAccess``
    (``allocateddevices.go``). All that is read of a claim to tell which devices are free."""
    allocated: set[tuple[str, str, str]] = set()
    for claim in claims:
        results = _map(_map(_map(claim.get("status")).get("allocation")).get("devices")).get("results")
        for r in _list(results):
            r = _map(r)
            if not r.get("adminAccess"):
                allocated.add((_str(r.get("driver")), _str(r.get("pool")), _str(r.get("device"))))
    return allocated


def node_device_states(slices: Sequence[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]],  # noqa: C901
                       nodes: Iterable[tuple[str, Callable[[Mapping[str, Any]], bool]]],
                       keys: frozenset[str]) -> dict[str, DeviceState]:
    """Each node's ``DeviceState``: ``nodes`` gives each node's name and a function that
    says whether a NodeSelector matches it (``app.k8s.scheduling.node_selector_matches``).

    Why one function of ~83 lines: it follows the DRA allocator's walk over slices, pools
    and devices in one pass, as upstream writes it, to be read beside the cited code.
    """
    allocated = allocated_devices(claims)
    newest: dict[tuple[str, str], _Pool] = {}
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    shared: list[Mapping[str, Any]] = []
    for s in slices:
        spec = _map(s.get("spec"))
        pool = _map(spec.get("pool"))
        pid = (_str(spec.get("driver")), _str(pool.get("name")))
        gen = _generation(s)
        raw_count = pool.get("resourceSliceCount")
        count = raw_count if isinstance(raw_count, int) else 1
        found = newest.get(pid)
        if found is None or gen > found.generation:
            newest[pid] = _Pool(gen, count, 1)
        elif gen == found.generation:
            found.slices += 1
        node_name = _str(spec.get("nodeName"))
        if node_name:
            by_node.setdefault(node_name, []).append(s)
        elif spec.get("allNodes") or isinstance(spec.get("nodeSelector"), Mapping) \
                or spec.get("perDeviceNodeSelection") or spec.get("sharedCounters"):
            shared.append(s)
    out: dict[str, DeviceState] = {}
    for name, matches in nodes:
        relevant: _Relevant = {}
        for s in by_node.get(name, ()):
            _add(relevant, s, [_map(d) for d in _list(_map(s.get("spec")).get("devices"))])
        for s in shared:
            spec = _map(s.get("spec"))
            devices = [_map(d) for d in _list(spec.get("devices"))]
            if spec.get("allNodes") or (isinstance(spec.get("nodeSelector"), Mapping)
                                        and matches(spec["nodeSelector"])):
                _add(relevant, s, devices)
            elif spec.get("perDeviceNodeSelection"):
                # allocator_stable.go isSelectable: each device's own node selection
                mine = [d for d in devices if _str(d.get("nodeName")) == name or d.get("allNodes")
                        or (isinstance(d.get("nodeSelector"), Mapping) and matches(d["nodeSelector"]))]
                if mine:
                    _add(relevant, s, mine)
            elif spec.get("sharedCounters"):
                _add(relevant, s, [])
        free: Counter[Shape] = Counter()
        used: Counter[Shape] = Counter()
        unsettled = invalid = False
        for pid, items in relevant.items():
            gens = [_generation(s) for s, _ in items]
            top = max(gens)
            current = [(s, d) for (s, d), g in zip(items, gens, strict=True) if g == top]
            want = _map(_map(current[0][0].get("spec")).get("pool")).get("resourceSliceCount")
            want = want if isinstance(want, int) else 1
            if len(current) != want:
                seen = newest.get(pid)
                if seen is not None and seen.generation > top:
                    continue  # obsolete: the driver is replacing this generation
                if seen is None or seen.slices != want:
                    # Incomplete: kube-scheduler allocates nothing from it until the driver
                    # has published every slice, and fails a request for All devices. A
                    # passing state: its devices are counted (docs/fidelity.md).
                    unsettled = True
            names = [_str(d.get("name")) for _, ds in current for d in ds]
            if len(set(names)) != len(names):
                invalid = True  # invalid: duplicate device names (a driver bug): nothing from it
                continue
            for _, devices in current:
                for d in devices:
                    shape = _shape(pid[0], d, keys)
                    if (pid[0], pid[1], _str(d.get("name"))) in allocated and not _shared(d):
                        used[shape] += 1
                    else:
                        free[shape] += 1
        if free or used or unsettled or invalid:
            out[name] = DeviceState(tuple(sorted(free.items(), key=repr)),
                                    tuple(sorted(used.items(), key=repr)), unsettled, invalid)
    return out


# ---------------------------------------------------------------------- the demand


@dataclass(frozen=True)
class DeviceRequest:
    """One request a node's devices must meet: ``count`` devices (or all, ``all_``) of
    class ``device_class`` matching every selector (the class's, then the request's)."""

    label: str
    device_class: str
    selectors: tuple[str | None, ...]
    count: int = 1
    all_: bool = False
    resource: str = ""
    """The extended resource it serves (mapped by the class); "" for a claim's request."""


def claim_requests(claim_spec: Mapping[str, Any], label: str,
                   classes: Mapping[str, DeviceClass]) -> list[DeviceRequest]:
    """The requests of a ResourceClaimSpec that can be decided (see the module
    docstring for what is left out)."""
    out: list[DeviceRequest] = []
    for raw in _list(_map(claim_spec.get("devices")).get("requests")):
        req = _map(raw)
        exactly = req.get("exactly")
        if not isinstance(exactly, Mapping) or req.get("firstAvailable"):
            continue
        cls = classes.get(_str(exactly.get("deviceClassName")))
        if cls is None or exactly.get("adminAccess") or exactly.get("capacity"):
            continue  # a class not known (yet), admin access or capacity: not decided
        mode = exactly.get("allocationMode") or "ExactCount"
        count = exactly.get("count", 1)
        if mode not in ("ExactCount", "All") or not isinstance(count, int) or count < 1:
            continue
        out.append(DeviceRequest(f"{label}, request {_str(req.get('name'))}", cls.name,
                                 (*cls.selectors, *_selectors(exactly.get("selectors"))),
                                 count, mode == "All"))
    return out


def pod_claim_requests(spec: Mapping[str, Any], namespace: str,
                       get: Callable[[str, str, str], Mapping[str, Any] | None],
                       classes: Mapping[str, DeviceClass]) -> list[DeviceRequest]:
    """The device requests of the claims a pod spec names: ``get(kind, name, namespace)``
    reads a ResourceClaim or ResourceClaimTemplate. A claim that is already allocated
    holds its devices (not counted again); one the view does not hold is not decided."""
    out: list[DeviceRequest] = []
    for raw in _list(spec.get("resourceClaims")):
        entry = _map(raw)
        claim_name = _str(entry.get("resourceClaimName"))
        template_name = _str(entry.get("resourceClaimTemplateName"))
        if claim_name:
            claim = get("ResourceClaim", claim_name, namespace)
            if claim is None or _map(claim.get("status")).get("allocation"):
                continue
            out.extend(claim_requests(_map(claim.get("spec")), f"claim {claim_name}", classes))
        elif template_name:
            template = get("ResourceClaimTemplate", template_name, namespace)
            if template is None:
                continue
            inner = _map(_map(template.get("spec")).get("spec"))
            out.extend(claim_requests(inner, f"claim template {template_name}", classes))
    return out


def selector_references(requests: Iterable[DeviceRequest]) -> frozenset[str]:
    keys: set[str] = set()
    for r in requests:
        for s in r.selectors:
            refs = cel_references(s)
            if refs is not None:
                keys |= refs
    return frozenset(keys)


@dataclass(frozen=True)
class DeviceShortfall:
    """Requests no allocation on the node can meet together: they ask ``requested``
    devices; ``free`` devices may serve one of them, of ``total`` on the node."""

    label: str
    requested: int
    free: int
    total: int


@dataclass
class _Matcher:
    cache: dict[tuple[int, Shape], bool] = field(default_factory=dict)

    def may_match(self, index: int, request: DeviceRequest, shape: Shape) -> bool:
        key = (index, shape)
        found = self.cache.get(key)
        if found is None:
            driver, attrs = shape
            values = dict(attrs)
            found = True
            for s in request.selectors:
                refs = cel_references(s)
                if refs is None:
                    continue  # cannot decide: may match
                if any(v == "\x00undecided" for k, v in values.items() if k in refs):
                    continue
                if cel_match(s, driver, values) is False:
                    found = False
                    break
            self.cache[key] = found
        return found


def device_shortfalls(requests: Sequence[DeviceRequest], state: DeviceState | None) -> list[DeviceShortfall]:
    """What the node's devices cannot give the pod (empty: an allocation may exist)."""
    if not requests:
        return []
    state = state or EMPTY
    matcher = _Matcher()
    free = dict(state.free)
    total = Counter(free)
    total.update(dict(state.used))
    claimed: set[Shape] = set()  # devices an earlier All request of the pod takes
    for i, r in enumerate(requests):
        if not r.all_:
            continue
        matching = [s for s in total if matcher.may_match(i, r, s)]
        taken = sum(n for s, n in state.used if s in matching and _definitely(matcher, i, r, s))
        taken += sum(total[s] for s in matching if s in claimed and _definitely(matcher, i, r, s))
        if state.unsettled_pool:
            continue  # fails while a pool is incomplete: passing, not decided
        if state.invalid_pool or not matching or taken:
            return [DeviceShortfall(r.label + " (all devices)", max(1, sum(total[s] for s in matching)),
                                    sum(free.get(s, 0) for s in matching), sum(total[s] for s in matching))]
        for s in matching:  # all of them go to this request (the undecided ones may not)
            if _definitely(matcher, i, r, s):
                free[s] = 0
                claimed.add(s)
    exact = [(i, r) for i, r in enumerate(requests) if not r.all_]
    if not exact:
        return []
    sizes = range(1, len(exact) + 1) if len(exact) <= HALL_LIMIT else (1, len(exact))
    for size in sizes:
        for group in combinations(exact, size):
            reachable = [s for s in total if any(matcher.may_match(i, r, s) for i, r in group)]
            have = sum(free.get(s, 0) for s in reachable)
            want = sum(r.count for _, r in group)
            if have < want:
                return [DeviceShortfall(" + ".join(r.label for _, r in group), want, have,
                                        sum(total[s] for s in reachable))]
    return []


def _definitely(matcher: _Matcher, index: int, request: DeviceRequest, shape: Shape) -> bool:
    """The shape matches every selector of the request, each decided."""
    driver, attrs = shape
    values = dict(attrs)
    for s in request.selectors:
        if cel_references(s) is None or cel_match(s, driver, values) is not True:
            return False
    return matcher.may_match(index, request, shape)
