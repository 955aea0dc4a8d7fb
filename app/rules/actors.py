"""Actor sandboxes: agent-substrate ActorTemplate and WorkerPool (``ate.dev/v1alpha1``).

An actor is sized by ``spec.resources.limits`` on its ActorTemplate: the limits
size the sandbox (cgroup caps on gVisor, vCPUs and guest RAM on a micro-VM) and
gate placement, since upstream's scheduler puts an actor only on a worker whose
capacity — the WorkerPool's ``spec.template.resources.limits`` — is at least the
actor's limits on every dimension. A zero or absent value on either side means
"unconstrained". Micro-VM guest RAM is the memory limit minus the VMM reserve, and
below a guest minimum the VM cannot boot; both are settings (``policy.actors``).

Rules are pure functions ``(subject, obj, view, policy) -> findings`` and read other
objects only through the indexes declared here. See ``docs/actors.md``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from app.actors import (
    GPU,
    GROUP,
    GVISOR,
    MICROVM,
    ActorTemplate,
    LabelSelector,
    WorkerPool,
    sandbox_class_of,
)
from app.cluster.view import ClusterView, register_index
from app.config import Mode, Policy
from app.quantity import QuantityError, format_bytes, format_cpu, parse_quantity
from app.rules.base import Finding, Rule, Subject, register

__all__ = [
    "BY_CLASS",
    "MemoryFloor",
    "Placement",
    "actor_size",
    "microvm_floor",
    "place",
    "shortfall",
    "worker_capacity",
]

TEMPLATE_KINDS = frozenset({(GROUP, "ActorTemplate")})
POOL_KINDS = frozenset({(GROUP, "WorkerPool")})
GVISOR_ONLY = frozenset({GPU})
ACTOR_RESOURCES = ("cpu", "memory", GPU)
"""What an actor may declare; GPU only on gVisor (micro-VMs have no passthrough)."""

# --------------------------------------------------------------------------- indexes

BY_CLASS = "namespace/sandboxClass"
"""Index of both kinds by ``<namespace>/<sandboxClass>``: placement reads only the
WorkerPools an actor could use, and a WorkerPool update only the templates that
could use it."""


def _class_key(obj: dict[str, Any]) -> list[str]:
    api_version = obj.get("apiVersion")
    if api_version and not str(api_version).startswith(f"{GROUP}/"):
        return []  # a same-named kind of another group (list items may carry no apiVersion)
    namespace = obj["metadata"].get("namespace") or ""
    return [f"{namespace}/{sandbox_class_of(obj)}"]


register_index("ActorTemplate", BY_CLASS, _class_key)
register_index("WorkerPool", BY_CLASS, _class_key)

# --------------------------------------------------------------------------- the numbers

Size = dict[str, Decimal]
"""Amounts by resource name (cpu in cores, memory in bytes); a name that is absent
was not declared, or was zero, and so constrains nothing."""


def _positive(values: Mapping[str, Any] | None) -> Size:
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
    return _positive(template.limits)


def worker_capacity(pool: WorkerPool) -> Size:
    """Per-worker capacity: the limits of the worker (``ateom``) container."""
    return _positive(pool.resources.limits)


def _offered(capacity: Size, name: str) -> Decimal | None:
    """What a worker offers of ``name``; ``None`` is unconstrained. Absent CPU or
    memory is unconstrained (the worker pod has no limit), an absent GPU is none."""
    if name == GPU:
        return capacity.get(GPU, Decimal(0))
    return capacity.get(name)


def shortfall(size: Size, capacity: Size) -> list[str]:
    """Resource names on which an actor of ``size`` does not fit a worker."""
    short = []
    for name, amount in size.items():
        offered = _offered(capacity, name)
        if offered is not None and amount > offered:
            short.append(name)
    return short


def _largest(capacities: list[Size], name: str) -> Decimal | None:
    offers = [_offered(c, name) for c in capacities]
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


def _show_all(size: Size, names: list[str]) -> str:
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


def microvm_floor(policy: Policy) -> MemoryFloor:
    return MemoryFloor(parse_quantity(policy.actors.vmm_reserve),
                       parse_quantity(policy.actors.guest_minimum))

# --------------------------------------------------------------------------- reading objects


def _template(obj: dict[str, Any] | None) -> ActorTemplate | None:
    if obj is None:
        return None
    try:
        return ActorTemplate.model_validate(obj)
    except ValidationError:
        return None  # actor-limits reports the shape


def _pool(obj: dict[str, Any] | None) -> WorkerPool | None:
    if obj is None:
        return None
    try:
        return WorkerPool.model_validate(obj)
    except ValidationError:
        return None  # actor-pool-resources reports the shape


def _shape_findings(rule: str, error: ValidationError) -> list[Finding]:
    """The first few reasons an object does not have the shape the rules read."""
    return [Finding("error", rule, _dotted(e["loc"]), f"{_dotted(e['loc'])}: {e['msg']}")
            for e in error.errors()[:3]]


def _dotted(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(part) for part in loc)


def _namespace(subject: Subject, meta_namespace: str | None) -> str:
    return subject.namespace or meta_namespace or ""


def _pools(view: ClusterView, namespace: str, sandbox_class: str,
           admitted: WorkerPool | None = None) -> list[WorkerPool]:
    """WorkerPools of one class in one namespace, the admitted pool replacing its
    cached version."""
    found = [_pool(o) for o in view.by_index("WorkerPool", BY_CLASS, f"{namespace}/{sandbox_class}")]
    pools = [p for p in found if p is not None
             and (admitted is None or p.metadata.name != admitted.metadata.name)]
    if admitted is not None and admitted.spec.sandbox_class == sandbox_class:
        pools.append(admitted)
    return sorted(pools, key=lambda p: p.metadata.name or "")

# --------------------------------------------------------------------------- placement


def _selects(selector: LabelSelector | None, pool: WorkerPool) -> bool:
    """Upstream's scheduler matches ``workerSelector`` against the Worker's labels,
    which the worker syncer copies from the WorkerPool's ``metadata.labels``."""
    return selector is None or selector.matches(pool.labels)


@dataclass(frozen=True)
class Placement:
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


def place(template: ActorTemplate, namespace: str, pools: list[WorkerPool]) -> Placement:
    size = actor_size(template)
    selector = template.spec.worker_selector
    eligible = [p for p in pools if _selects(selector, p)]
    fitting = [p for p in eligible if not shortfall(size, worker_capacity(p))]
    return Placement(namespace, template.spec.sandbox_class, selector, size, pools, eligible, fitting)


def _no_fit_message(found: Placement) -> str:
    capacities = [worker_capacity(p) for p in found.eligible]
    largest = {name: _largest(capacities, name) for name in found.size}
    short = [n for n, amount in found.size.items() if (most := largest[n]) is not None and amount > most]
    if not short:
        return (f"needs {_show_all(found.size, list(found.size))} on one worker; "
                f"no {found.pools_phrase()} offers all of it")
    offers = [show(n, largest[n] or Decimal(0), unit=len(short) > 1 or n == GPU) for n in short]
    return (f"needs {_show_all(found.size, short)}; the largest {found.pools_phrase()} "
            f"offers {', '.join(offers)}")


def _placement_finding(found: Placement) -> Finding | None:
    rule = "actor-placement"
    if not found.candidates:
        return Finding("warning", rule, "spec.sandboxClass",
                       f"no {found.sandbox_class} WorkerPool in {found.where} yet; "
                       f"actors cannot be placed until one exists")
    if not found.eligible and found.selector is not None:
        return Finding("error", rule, "spec.workerSelector",
                       f"workerSelector {found.selector.describe()} matches none of the "
                       f"{len(found.candidates)} {found.sandbox_class} WorkerPools in {found.where}")
    if not found.fitting:
        return Finding("error", rule, "spec.resources.limits", _no_fit_message(found))
    return None

# --------------------------------------------------------------------------- UPDATE: spec equality

QUANTITY_MAPS = frozenset({"limits", "requests"})
"""Keys whose value maps resource names to quantities (``resources.limits``)."""
QUANTITY_FIELDS = frozenset({"capacity"})
"""Keys whose value is one quantity (``externalVolumeTemplate.capacity``)."""


def _as_quantity(value: Any) -> Any:
    try:
        return parse_quantity(value)
    except QuantityError:
        return value


def _canonical(node: Any, key: str = "") -> Any:
    """A spec as values: quantities parsed where the schema has quantities (``1Gi``
    equals ``1024Mi``, ``1`` equals ``1000m``), nulls dropped."""
    if key in QUANTITY_FIELDS:
        return _as_quantity(node)
    if isinstance(node, dict):
        if key in QUANTITY_MAPS:
            return {k: _as_quantity(v) for k, v in node.items() if v is not None}
        return {k: _canonical(v, k) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    return node


def canonical_spec(obj: Mapping[str, Any] | None) -> Any:
    spec = (obj or {}).get("spec")
    if not isinstance(spec, dict):
        return spec
    return _canonical({**spec, "sandboxClass": sandbox_class_of(obj or {})})


_MISSING = object()


def _changed_paths(before: Any, after: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            b, a = before.get(key, _MISSING), after.get(key, _MISSING)
            if b != a:
                yield from _changed_paths(b, a, (*path, key))
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            if b != a:
                yield from _changed_paths(b, a, (*path, i))
    else:
        yield path


def spec_changes(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[tuple[Any, ...]]:
    before, after = canonical_spec(old), canonical_spec(new)
    return [] if before == after else list(_changed_paths(before, after, ("spec",)))


def _settled(subject: Subject, obj: dict[str, Any]) -> bool:
    """An UPDATE that leaves the spec as it was: nothing here re-judges it, so
    metadata-only updates always pass."""
    return subject.operation == "UPDATE" and subject.old is not None and not spec_changes(subject.old, obj)


def _path_text(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _dig(obj: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        if isinstance(obj, dict) and isinstance(part, str):
            obj = obj.get(part)
        elif isinstance(obj, list) and isinstance(part, int) and part < len(obj):
            obj = obj[part]
        else:
            return None
    return obj

# --------------------------------------------------------------------------- ActorTemplate rules


def _judged(subject: Subject, obj: dict[str, Any]) -> ActorTemplate | None:
    """The template to judge: ``None`` when it does not parse (actor-limits says why)
    or when an UPDATE leaves its spec alone."""
    return None if _settled(subject, obj) else _template(obj)


def refuse_requests_and_claims(subject: Subject, obj: dict[str, Any], view: ClusterView,
                               policy: Policy) -> list[Finding]:
    template = _judged(subject, obj)
    if template is None or template.spec.resources is None:
        return []
    resources = template.spec.resources
    return [Finding("error", "actor-no-requests", f"spec.resources.{field}",
                    f"actors are sized by spec.resources.limits only; remove spec.resources.{field}")
            for field in ("requests", "claims") if getattr(resources, field) is not None]


def _limit_problem(name: str, value: Any, sandbox_class: str) -> str | None:
    if name not in ACTOR_RESOURCES:
        return "not supported; actors take cpu, memory (and nvidia.com/gpu on gvisor)"
    if name in GVISOR_ONLY and sandbox_class != GVISOR:
        return f"only with sandboxClass gvisor; {sandbox_class} has no GPU passthrough"
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        return str(exc)
    if amount <= 0:
        return f"{value!r} must be greater than zero"
    if name == GPU and amount != amount.to_integral_value():
        return f"{value!r} must be a whole number of GPUs"
    return None


def check_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    if _settled(subject, obj):
        return []
    try:
        template = ActorTemplate.model_validate(obj)
    except ValidationError as exc:
        return _shape_findings("actor-limits", exc)
    findings = []
    for name, value in template.limits.items():
        problem = _limit_problem(name, value, template.spec.sandbox_class)
        if problem is not None:
            path = f"spec.resources.limits.{name}"
            findings.append(Finding("error", "actor-limits", path, f"{path}: {problem}"))
    return findings


def microvm_memory_floor(subject: Subject, obj: dict[str, Any], view: ClusterView,
                         policy: Policy) -> list[Finding]:
    template = _judged(subject, obj)
    if template is None or template.spec.sandbox_class != MICROVM:
        return []
    memory = actor_size(template).get("memory")
    floor = microvm_floor(policy)
    if memory is None or memory >= floor.total:
        return []  # no memory limit: the runtime default applies
    return [Finding("error", "actor-microvm-memory-floor", "spec.resources.limits.memory",
                    f"microvm limits.memory {show_bytes(memory)} is below the floor of "
                    f"{floor.describe()}")]


def spec_immutable(subject: Subject, obj: dict[str, Any], view: ClusterView,
                   policy: Policy) -> list[Finding]:
    changes = spec_changes(subject.old, obj) if subject.old is not None else []
    if not changes:
        return []
    first = changes[0]
    detail = _path_text(first)
    before, after = _dig(subject.old, first), _dig(obj, first)
    if len(changes) == 1 and all(isinstance(v, str | int | float) for v in (before, after)):
        detail += f" {before} -> {after}"
    elif len(changes) > 1:
        detail += f" and {len(changes) - 1} more"
    return [Finding("error", "actor-spec-immutable", _path_text(first),
                    f"ActorTemplate spec is immutable (baked into snapshots); changed {detail}")]


def _placement_of(subject: Subject, obj: dict[str, Any], view: ClusterView) -> Placement | None:
    """Where the judged template could go; ``None`` when there is nothing to judge or
    its workerSelector is invalid (actor-placement reports that)."""
    template = _judged(subject, obj)
    if template is None:
        return None
    selector = template.spec.worker_selector
    if selector is not None and selector.problems():
        return None
    namespace = _namespace(subject, template.metadata.namespace)
    return place(template, namespace, _pools(view, namespace, template.spec.sandbox_class))


def check_placement(subject: Subject, obj: dict[str, Any], view: ClusterView,
                    policy: Policy) -> list[Finding]:
    template = _judged(subject, obj)
    selector = template.spec.worker_selector if template is not None else None
    if selector is not None and selector.problems():
        return [Finding("error", "actor-placement", "spec.workerSelector", f"workerSelector: {problem}")
                for problem in selector.problems()]
    found = _placement_of(subject, obj, view)
    finding = _placement_finding(found) if found is not None else None
    return [finding] if finding is not None else []


def microvm_cpu_share(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """A micro-VM's VMM threads run in the worker's CPU quota beside the guest, so an
    actor declaring all of it is throttled. A pool without a CPU limit has no quota."""
    found = _placement_of(subject, obj, view)
    if found is None or found.sandbox_class != MICROVM or "cpu" not in found.size:
        return []
    cpu = found.size["cpu"]
    for pool in found.fitting:
        if worker_capacity(pool).get("cpu") == cpu:
            return [Finding("warning", "actor-microvm-cpu-share", "spec.resources.limits.cpu",
                            f"microvm actor takes all {show('cpu', cpu)} of WorkerPool "
                            f"{pool.metadata.name}'s workers; VMM threads share that quota")]
    return []


def microvm_memory_headroom(subject: Subject, obj: dict[str, Any], view: ClusterView,
                            policy: Policy) -> list[Finding]:
    """The worker must hold the actor's memory limit and the VMM reserve."""
    found = _placement_of(subject, obj, view)
    if found is None or found.sandbox_class != MICROVM or "memory" not in found.size:
        return []
    memory, reserve = found.size["memory"], microvm_floor(policy).reserve
    for pool in found.fitting:
        worker = worker_capacity(pool).get("memory")
        if worker is not None and memory + reserve > worker:
            return [Finding("warning", "actor-microvm-memory-headroom", "spec.resources.limits.memory",
                            f"microvm {show_bytes(memory)} + {show_bytes(reserve)} VMM reserve "
                            f"exceeds WorkerPool {pool.metadata.name}'s {show_bytes(worker)} workers")]
    return []

# --------------------------------------------------------------------------- WorkerPool rules


def _hosts(pool: WorkerPool, template: ActorTemplate) -> bool:
    return (pool.spec.sandbox_class == template.spec.sandbox_class
            and _selects(template.spec.worker_selector, pool)
            and not shortfall(actor_size(template), worker_capacity(pool)))


def _lost_reason(before: WorkerPool, after: WorkerPool, template: ActorTemplate) -> str:
    name = template.metadata.name
    if after.spec.sandbox_class != template.spec.sandbox_class:
        return (f"ActorTemplate {name} cannot use a {after.spec.sandbox_class} WorkerPool "
                f"(was {before.spec.sandbox_class})")
    if not _selects(template.spec.worker_selector, after):
        return f"ActorTemplate {name}'s workerSelector no longer matches this WorkerPool's labels"
    size, capacity = actor_size(template), worker_capacity(after)
    short = shortfall(size, capacity)
    offers = ", ".join(show(n, _offered(capacity, n) or Decimal(0)) for n in short)
    return f"ActorTemplate {name} needs {_show_all(size, short)}; this WorkerPool would offer {offers}"


def pool_shrink(subject: Subject, obj: dict[str, Any], view: ClusterView,
                policy: Policy) -> list[Finding]:
    before, after = _pool(subject.old), _pool(obj)
    if before is None or after is None:
        return []
    namespace = _namespace(subject, after.metadata.namespace)
    findings = []
    for raw in view.by_index("ActorTemplate", BY_CLASS, f"{namespace}/{before.spec.sandbox_class}"):
        template = _template(raw)
        if template is None or not _hosts(before, template) or _hosts(after, template):
            continue
        message = _lost_reason(before, after, template)
        pools = _pools(view, namespace, template.spec.sandbox_class, admitted=after)
        if not place(template, namespace, pools).fitting:
            message += "; no other WorkerPool fits it"
        findings.append(Finding("error", "actor-pool-shrink", "spec.template.resources.limits", message))
    return findings


def _pool_resources_unchanged(subject: Subject, obj: dict[str, Any]) -> bool:
    if subject.operation != "UPDATE" or subject.old is None:
        return False
    before, after = _pool(subject.old), _pool(obj)
    return (before is not None and after is not None and before.resources == after.resources
            and before.spec.sandbox_class == after.spec.sandbox_class)


def _quantity_findings(section: str, values: Mapping[str, Any]) -> Iterator[Finding]:
    for name, value in values.items():
        path = f"spec.template.resources.{section}.{name}"
        try:
            amount = parse_quantity(value)
        except QuantityError as exc:
            yield Finding("error", "actor-pool-resources", path, f"{path}: {exc}")
            continue
        if amount < 0:
            yield Finding("error", "actor-pool-resources", path, f"{path}: {value!r} is negative")


def _gpu_findings(pool: WorkerPool) -> Iterator[Finding]:
    limits, requests = pool.resources.limits or {}, pool.resources.requests or {}
    base = "spec.template.resources"
    if (GPU in limits or GPU in requests) and pool.spec.sandbox_class != GVISOR:
        yield Finding("error", "actor-pool-resources", f"{base}.limits.{GPU}",
                      f"{GPU} is only supported with sandboxClass gvisor, not {pool.spec.sandbox_class}")
    if GPU not in requests:
        return
    if GPU not in limits:
        yield Finding("error", "actor-pool-resources", f"{base}.limits.{GPU}",
                      f"{GPU} request {requests[GPU]} needs a matching limit")
    elif _as_quantity(requests[GPU]) != _as_quantity(limits[GPU]):
        yield Finding("error", "actor-pool-resources", f"{base}.requests.{GPU}",
                      f"{GPU} request {requests[GPU]} must equal its limit {limits[GPU]}")


def pool_resources(subject: Subject, obj: dict[str, Any], view: ClusterView,
                   policy: Policy) -> list[Finding]:
    if _pool_resources_unchanged(subject, obj):
        return []
    try:
        pool = WorkerPool.model_validate(obj)
    except ValidationError as exc:
        return _shape_findings("actor-pool-resources", exc)
    findings = []
    for section in ("limits", "requests"):
        findings.extend(_quantity_findings(section, getattr(pool.resources, section) or {}))
    findings.extend(_gpu_findings(pool))
    return findings


register(
    Rule("actor-no-requests", "validate", TEMPLATE_KINDS, Mode.ENFORCE, refuse_requests_and_claims,
         "ActorTemplate: spec.resources.requests and claims are refused (sized by limits only)"),
    Rule("actor-limits", "validate", TEMPLATE_KINDS, Mode.ENFORCE, check_limits,
         "ActorTemplate: limits parse, are > 0, and name cpu, memory (nvidia.com/gpu on gvisor)"),
    Rule("actor-microvm-memory-floor", "validate", TEMPLATE_KINDS, Mode.ENFORCE, microvm_memory_floor,
         "ActorTemplate microvm: limits.memory >= VMM reserve + guest minimum"),
    Rule("actor-spec-immutable", "validate", TEMPLATE_KINDS, Mode.ENFORCE, spec_immutable,
         "ActorTemplate: UPDATE must not change spec (compared as values)",
         operations=frozenset({"UPDATE"})),
    Rule("actor-placement", "validate", TEMPLATE_KINDS, Mode.ENFORCE, check_placement,
         "ActorTemplate: some WorkerPool of its class in the namespace fits its limits"),
    Rule("actor-microvm-cpu-share", "validate", TEMPLATE_KINDS, Mode.WARN, microvm_cpu_share,
         "ActorTemplate microvm: warn when it declares a worker's whole CPU"),
    Rule("actor-microvm-memory-headroom", "validate", TEMPLATE_KINDS, Mode.WARN,
         microvm_memory_headroom, "ActorTemplate microvm: warn when limit + VMM reserve exceeds the worker"),
    Rule("actor-pool-shrink", "validate", POOL_KINDS, Mode.WARN, pool_shrink,
         "WorkerPool UPDATE: capacity no longer hosts an ActorTemplate placed on it",
         operations=frozenset({"UPDATE"})),
    Rule("actor-pool-resources", "validate", POOL_KINDS, Mode.ENFORCE, pool_resources,
         "WorkerPool: quantities parse; nvidia.com/gpu only on gvisor, request == limit"),
)
