"""Dynamic resource allocation (``resource.k8s.io/v1``): the devices a node can give a pod.

Pure functions over plain Kubernetes dicts; no I/O. ``pod-fits-node`` uses them for the
two ways a pod asks for DRA devices on Kubernetes 1.37 — the claims it names, and the
extended resources a DeviceClass maps — checked against the real kube-scheduler by
``e2e/test_oracle_dra.py``. Which devices a node reaches, what is decided, what is not
(treated as "may match": it can only let a pod through, never refuse it) and the CEL
subset decided exactly: docs/fidelity.md, "DRA scheduling oracle" and "The ports, file
by file".

Why one module of ~654 lines: pools, the selectors' CEL subset, claims and the allocation
check (Hall's condition over a pod's requests) are one port of the DRA allocator's
structured model, read beside the upstream files it cites and checked together by the
DRA oracle; the CEL subset (``cel_match``, ~210 lines) is the part to move out should it
grow.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, cast

from app.k8s.util import Memo, footprint

__all__ = [
    "DEVICE_CLASS_PREFIX",
    "DeviceClass",
    "DeviceRequest",
    "DeviceShortfall",
    "DeviceState",
    "allocated_devices",
    "cel_match",
    "cel_references",
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


# ------------------------------------------------------------------------ CEL subset

_TOKEN = re.compile(r"""\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<int>-?[0-9]+)(?![0-9.eEuU])|"""
                    r"""(?P<id>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>==|!=|&&|\|\||[!()\[\].]))""")


class _Unsupported(Exception):
    """The expression is outside the subset: cannot decide."""


_ERR = object()
"""A CEL evaluation error (a missing attribute, a comparison of different types)."""

Expr = Callable[[str, Mapping[str, object]], object]


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Unsupported(text[pos:])
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _unquote(raw: str) -> str:
    body = raw[1:-1]
    if "\\" in body:
        if re.search(r"\\[^\\\"']", body):
            raise _Unsupported(raw)  # escapes beyond \\ \" \' are not decided
        body = re.sub(r"\\(.)", r"\1", body)
    return body


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0
        self.refs: set[str] = set()

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (value is not None and tok[1] != value) or (kind is not None and tok[0] != kind):
            raise _Unsupported(str(tok))
        self.pos += 1
        return tok[1]

    def parse(self) -> Expr:
        expr = self.or_()
        if self.peek() is not None:
            raise _Unsupported(str(self.peek()))
        return expr

    def or_(self) -> Expr:
        parts = [self.and_()]
        while self.peek() == ("op", "||"):
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else _logic(parts, True)

    def and_(self) -> Expr:
        parts = [self.unary()]
        while self.peek() == ("op", "&&"):
            self.take()
            parts.append(self.unary())
        return parts[0] if len(parts) == 1 else _logic(parts, False)

    def unary(self) -> Expr:
        if self.peek() == ("op", "!"):
            self.take()
            inner = self.unary()
            return lambda d, a: _ERR if not isinstance(v := inner(d, a), bool) else not v
        return self.comparison()

    def comparison(self) -> Expr:
        if self.peek() == ("op", "("):
            self.take()
            left = self.or_()
            self.take(")")
        else:
            left = self.operand()
        tok = self.peek()
        if tok in (("op", "=="), ("op", "!=")):
            self.take()
            right = self.operand()
            return _compare(left, right, tok[1] == "==")
        return left

    def operand(self) -> Expr:
        kind, value = self.peek() or ("", "")
        if kind == "str":
            self.take()
            text = _unquote(value)
            return lambda d, a: text
        if kind == "int":
            self.take()
            number = int(value)
            return lambda d, a: number
        if kind == "id" and value in ("true", "false"):
            self.take()
            flag = value == "true"
            return lambda d, a: flag
        if kind == "op" and value == "(":
            self.take()
            inner = self.or_()
            self.take(")")
            return inner
        self.take("device")
        self.take(".")
        member = self.take(kind="id")
        if member == "driver":
            self.refs.add("driver")
            return lambda d, a: d
        if member != "attributes":
            raise _Unsupported(member)
        self.take("[")
        domain = _unquote(self.take(kind="str"))
        self.take("]")
        if self.peek() == ("op", "."):
            self.take()
            name = self.take(kind="id")
        else:
            self.take("[")
            name = _unquote(self.take(kind="str"))
            self.take("]")
        key = f"{domain}/{name}"
        self.refs.add(key)
        return lambda d, a: a.get(key, _ERR)


def _logic(parts: list[Expr], is_or: bool) -> Expr:
    def run(d: str, a: Mapping[str, object]) -> object:
        error = False
        for part in parts:
            v = part(d, a)
            if not isinstance(v, bool):
                error = True
            elif v is is_or:
                return is_or  # true || x, false && x: decided whatever x is
        return _ERR if error else not is_or

    return run


def _compare(left: Expr, right: Expr, equal: bool) -> Expr:
    def run(d: str, a: Mapping[str, object]) -> object:
        x, y = left(d, a), right(d, a)
        if x is _ERR or y is _ERR or type(x) is not type(y):
            return _ERR  # CEL: no such key / no matching overload
        return (x == y) is equal

    return run


_COMPILED: Memo[str, tuple[Expr, frozenset[str]] | None] = Memo(
    1024, 4 * 2**20, lambda expression, _: footprint(expression) + 48 * len(expression))
"""Compiled expressions by their text, at most 4 MiB: a compiled expression is closures,
which ``footprint`` cannot see into; tracemalloc measures ~40 bytes a character."""
_NOT_COMPILED = object()


def _compiled(expression: str) -> tuple[Expr, frozenset[str]] | None:
    found = _COMPILED.get(expression, _NOT_COMPILED)
    if found is not _NOT_COMPILED:
        return cast("tuple[Expr, frozenset[str]] | None", found)
    try:
        parser = _Parser(expression)
        compiled: tuple[Expr, frozenset[str]] | None = (parser.parse(), frozenset(parser.refs))
    except (_Unsupported, RecursionError, ValueError):
        compiled = None
    return _COMPILED.put(expression, compiled)


def cel_references(expression: str | None) -> frozenset[str] | None:
    """What the expression reads of a device (``driver``, ``<domain>/<name>``), or None
    when it is outside the subset."""
    found = _compiled(expression) if expression is not None else None
    return None if found is None else found[1]


def cel_match(expression: str | None, driver: str, attributes: Mapping[str, object]) -> bool | None:
    """True/False when the expression is in the subset and evaluates without an error
    (``attributes``: ``<domain>/<name>`` -> str, int or bool); None: cannot decide."""
    found = _compiled(expression) if expression is not None else None
    if found is None:
        return None
    value = found[0](driver, attributes)
    return value if isinstance(value, bool) else None


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
