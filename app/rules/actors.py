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

Why one module of ~480 lines: one family of nine rules over two kinds that share the
reading (decoded once, ``app.crds.actortypes.decode``), the indexes and the placement; the
typed models and the arithmetic are ``app/crds/actortypes.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from app.cluster.after import AfterWrite
from app.cluster.view import ClusterView, Index
from app.core.config import Mode, Policy
from app.crds.actortypes import (
    ACTOR_RESOURCES,
    GPU,
    GROUP,
    GVISOR,
    GVISOR_ONLY,
    MICROVM,
    ActorPlacement,
    ActorTemplate,
    MemoryFloor,
    WorkerPool,
    actor_size,
    decode,
    no_fit_message,
    offered,
    place_actor,
    sandbox_class_of,
    selects,
    shortfall,
    show,
    show_all,
    show_bytes,
    worker_capacity,
)
from app.crds.substrate import pool_sandbox_classes, read_pool_classes
from app.k8s.quantity import SHOWN, QuantityError, parse_quantity, shown
from app.k8s.util import Memo, dig, digest, dotted, same
from app.rules.base import Finding, Subject, error, rule, warning

__all__ = ["INDEXES", "POOLS_BY_CLASS", "TEMPLATES_BY_CLASS", "microvm_floor"]

TEMPLATE_KINDS = frozenset({(GROUP, "ActorTemplate")})
POOL_KINDS = frozenset({(GROUP, "WorkerPool")})

# --------------------------------------------------------------------------- indexes



def _ours(obj: dict[str, Any]) -> bool:
    api_version = obj.get("apiVersion")
    # a same-named kind of another group is not ours (list items may carry no apiVersion)
    return not api_version or str(api_version).startswith(f"{GROUP}/")


def _class_key(obj: dict[str, Any]) -> list[str]:
    if not _ours(obj):
        return []
    namespace = obj["metadata"].get("namespace") or ""
    return [f"{namespace}/{sandbox_class_of(obj)}"]


def _pool_class_keys(obj: dict[str, Any]) -> list[str]:
    """One key per class the pool runs, read from either WorkerPool shape."""
    if not _ours(obj):
        return []
    namespace = obj["metadata"].get("namespace") or ""
    return [f"{namespace}/{cls}" for cls in sorted(pool_sandbox_classes(obj))]


#: Both kinds by ``<namespace>/<sandboxClass>``: placement reads only the WorkerPools an
#: actor could use, and a WorkerPool update only the templates that could use it. A pool
#: is filed under every class it runs (``spec.sandboxClasses``, or ``spec.sandboxClass``).
TEMPLATES_BY_CLASS = Index("ActorTemplate", "namespace/sandboxClass", _class_key)
POOLS_BY_CLASS = Index("WorkerPool", "namespace/sandboxClass", _pool_class_keys)
INDEXES = (TEMPLATES_BY_CLASS, POOLS_BY_CLASS)

# --------------------------------------------------------------------------- the numbers

def microvm_floor(policy: Policy) -> MemoryFloor:
    return MemoryFloor(parse_quantity(policy.actors.vmm_reserve),
                       parse_quantity(policy.actors.guest_minimum))

# --------------------------------------------------------------------------- reading objects


def _template(obj: dict[str, Any] | None) -> ActorTemplate | None:
    """The typed template (decoded once: ``app.crds.actortypes.decode``); None when it does not
    have the shape (actor-limits reports it)."""
    found = decode(ActorTemplate, obj) if obj is not None else None
    return found if isinstance(found, ActorTemplate) else None


def _pool(obj: dict[str, Any] | None) -> WorkerPool | None:
    """The typed pool, decoded once; None when malformed (actor-pool-resources reports it)."""
    found = decode(WorkerPool, obj) if obj is not None else None
    return found if isinstance(found, WorkerPool) else None


def _shape_findings(problem: ValidationError) -> list[Finding]:
    """The first few reasons an object does not have the shape the rules read."""
    return [error(dotted(e["loc"]), f"{dotted(e['loc'])}: {e['msg']}")
            for e in problem.errors()[:3]]


def _namespace(subject: Subject, meta_namespace: str | None) -> str:
    return subject.namespace or meta_namespace or ""


def _pools(view: ClusterView | AfterWrite, namespace: str, sandbox_class: str) -> list[WorkerPool]:
    """WorkerPools of one class in one namespace (of the view as a WorkerPool write
    leaves it, for ``actor-pool-shrink``), by name."""
    found = [_pool(o) for o in view.by_index(POOLS_BY_CLASS, f"{namespace}/{sandbox_class}")]
    return sorted((p for p in found if p is not None), key=lambda p: p.metadata.name or "")

# --------------------------------------------------------------------------- placement


def _placement_finding(found: ActorPlacement) -> Finding | None:
    if not found.candidates:
        return warning("spec.sandboxClass",
                       f"no {found.sandbox_class} WorkerPool in {found.where} yet; "
                       f"actors cannot be placed until one exists")
    if not found.eligible and found.selector is not None:
        return error("spec.workerSelector",
                       f"workerSelector {found.selector.describe()} matches none of the "
                       f"{len(found.candidates)} {found.sandbox_class} WorkerPools in {found.where}")
    if not found.fitting:
        return error("spec.resources.limits", no_fit_message(found))
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
    equals ``1024Mi``, ``1`` equals ``1000m``), nulls dropped. A loop, not recursion:
    a spec nested ~500 levels under a preserve-unknown-fields subtree made every
    UPDATE of it "too deep to judge" (actor-spec-immutable refused label changes)."""

    def one(value: Any, name: str, stack: list[tuple[Any, str, Any]]) -> Any:
        if name in QUANTITY_FIELDS:
            return _as_quantity(value)
        if isinstance(value, dict | list):
            out: Any = {} if isinstance(value, dict) else []
            stack.append((value, name, out))
            return out
        return value

    stack: list[tuple[Any, str, Any]] = []
    root = one(node, key, stack)
    while stack:
        source, name, target = stack.pop()
        if isinstance(source, list):
            target.extend(one(item, "", stack) for item in source)
        elif name in QUANTITY_MAPS:
            target.update((k, _as_quantity(v)) for k, v in source.items() if v is not None)
        else:
            target.update((k, one(v, k, stack)) for k, v in source.items() if v is not None)
    return root


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
    return [] if same(before, after) else list(_changed_paths(before, after, ("spec",)))


def spec_values(subject: Subject, obj: dict[str, Any]) -> Any:
    """What the ActorTemplate rules judge: the spec as values, so an UPDATE that leaves
    it as it was (labels, annotations, finalizers) always passes."""
    return canonical_spec(obj)

# --------------------------------------------------------------------------- ActorTemplate rules


@rule("actor-no-requests", "validate", TEMPLATE_KINDS, Mode.ENFORCE,
      "ActorTemplate: spec.resources.requests and claims are refused (sized by limits only)",
      judges=spec_values)
def refuse_requests_and_claims(subject: Subject, obj: dict[str, Any], view: ClusterView,
                               policy: Policy) -> list[Finding]:
    template = _template(obj)
    if template is None or template.spec.resources is None:
        return []
    resources = template.spec.resources
    return [error(f"spec.resources.{field}",
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
        return f"{shown(value)} must be greater than zero"
    if name == GPU and amount != amount.to_integral_value():
        return f"{shown(value)} must be a whole number of GPUs"
    return None


@rule("actor-limits", "validate", TEMPLATE_KINDS, Mode.ENFORCE,
      "ActorTemplate: limits parse, are > 0, and name cpu, memory (nvidia.com/gpu on gvisor)",
      judges=spec_values)
def check_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                 policy: Policy) -> list[Finding]:
    template = decode(ActorTemplate, obj)
    if isinstance(template, ValidationError):
        return _shape_findings(template)
    findings = []
    for name, value in template.limits.items():
        problem = _limit_problem(name, value, template.spec.sandbox_class)
        if problem is not None:
            path = f"spec.resources.limits.{name}"
            findings.append(error(path, f"{path}: {problem}"))
    return findings


@rule("actor-microvm-memory-floor", "validate", TEMPLATE_KINDS, Mode.ENFORCE,
      "ActorTemplate microvm: limits.memory >= VMM reserve + guest minimum", judges=spec_values)
def microvm_memory_floor(subject: Subject, obj: dict[str, Any], view: ClusterView,
                         policy: Policy) -> list[Finding]:
    template = _template(obj)
    if template is None or template.spec.sandbox_class != MICROVM:
        return []
    memory = actor_size(template).get("memory")
    floor = microvm_floor(policy)
    if memory is None or memory >= floor.total:
        return []  # no memory limit: the runtime default applies
    return [error("spec.resources.limits.memory",
                    f"microvm limits.memory {show_bytes(memory)} is below the floor of "
                    f"{floor.describe()}")]


@rule("actor-spec-immutable", "validate", TEMPLATE_KINDS, Mode.ENFORCE,
      "ActorTemplate: UPDATE must not change spec (compared as values)", operations={"UPDATE"})
def spec_immutable(subject: Subject, obj: dict[str, Any], view: ClusterView,
                   policy: Policy) -> list[Finding]:
    changes = spec_changes(subject.old, obj) if subject.old is not None else []
    if not changes:
        return []
    first = changes[0]
    detail = dotted(first)
    before, after = dig(subject.old, first), dig(obj, first)
    if len(changes) == 1 and all(isinstance(v, str | int | float) for v in (before, after)):
        detail += " {} -> {}".format(*(shown(v) if len(str(v)) > SHOWN else v for v in (before, after)))
    elif len(changes) > 1:
        detail += f" and {len(changes) - 1} more"
    return [error(dotted(first),
                    f"ActorTemplate spec is immutable (baked into snapshots); changed {detail}")]


PLACEMENTS_BUDGET = 4 * 2**20
_PLACEMENTS: Memo[tuple[bytes, str, tuple[bytes, ...]], ActorPlacement] = Memo(256, PLACEMENTS_BUDGET)
"""Placements by the digests of the template and of the pools (``util.digest``): the
three rules that read one (actor-placement and the two micro-VM warnings) compute it
once per review. Nothing of the template is kept (issue 38: 256 templates of 2.8 MB
were; the decoded objects are in ``actortypes``' memo, bounded in bytes)."""


def _placement_of(subject: Subject, obj: dict[str, Any], view: ClusterView) -> ActorPlacement | None:
    """Where the judged template could go; ``None`` when there is nothing to judge or
    its workerSelector is invalid (actor-placement reports that)."""
    template = _template(obj)
    if template is None:
        return None
    selector = template.spec.worker_selector
    if selector is not None and selector.problems():
        return None
    namespace = _namespace(subject, template.metadata.namespace)
    raw_pools = view.by_index(POOLS_BY_CLASS, f"{namespace}/{template.spec.sandbox_class}")
    try:
        key = (digest(obj), namespace, tuple(sorted(digest(p) for p in raw_pools)))
    except TypeError:  # not JSON (a YAML file's non-string keys): not remembered
        return place_actor(template, namespace, _pools(view, namespace, template.spec.sandbox_class))
    found = _PLACEMENTS.get(key)
    if found is None:
        found = _PLACEMENTS.put(key, place_actor(template, namespace,
                                                 _pools(view, namespace, template.spec.sandbox_class)))
    return found


@rule("actor-placement", "validate", TEMPLATE_KINDS, Mode.ENFORCE,
      "ActorTemplate: some WorkerPool of its class in the namespace fits its limits",
      reads={"WorkerPool"}, judges=spec_values)
def check_placement(subject: Subject, obj: dict[str, Any], view: ClusterView,
                    policy: Policy) -> list[Finding]:
    template = _template(obj)
    selector = template.spec.worker_selector if template is not None else None
    if selector is not None and selector.problems():
        return [error("spec.workerSelector", f"workerSelector: {problem}")
                for problem in selector.problems()]
    found = _placement_of(subject, obj, view)
    finding = _placement_finding(found) if found is not None else None
    return [finding] if finding is not None else []


@rule("actor-microvm-cpu-share", "validate", TEMPLATE_KINDS, Mode.WARN,
      "ActorTemplate microvm: warn when it declares a worker's whole CPU",
      reads={"WorkerPool"}, judges=spec_values)
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
            return [warning("spec.resources.limits.cpu",
                            f"microvm actor takes all {show('cpu', cpu)} of WorkerPool "
                            f"{pool.metadata.name}'s workers; VMM threads share that quota")]
    return []


@rule("actor-microvm-memory-headroom", "validate", TEMPLATE_KINDS, Mode.WARN,
      "ActorTemplate microvm: warn when limit + VMM reserve exceeds the worker",
      reads={"WorkerPool"}, judges=spec_values)
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
            return [warning("spec.resources.limits.memory",
                            f"microvm {show_bytes(memory)} + {show_bytes(reserve)} VMM reserve "
                            f"exceeds WorkerPool {pool.metadata.name}'s {show_bytes(worker)} workers")]
    return []

# --------------------------------------------------------------------------- WorkerPool rules


def _classes_text(classes: frozenset[str]) -> str:
    return "/".join(sorted(classes)) or "classless"


def _hosts(pool: WorkerPool, template: ActorTemplate) -> bool:
    return (template.spec.sandbox_class in pool.sandbox_classes
            and selects(template.spec.worker_selector, pool)
            and not shortfall(actor_size(template), worker_capacity(pool)))


def _lost_reason(before: WorkerPool, after: WorkerPool, template: ActorTemplate) -> str:
    name = template.metadata.name
    if template.spec.sandbox_class not in after.sandbox_classes:
        return (f"ActorTemplate {name} cannot use a {_classes_text(after.sandbox_classes)} WorkerPool "
                f"(was {_classes_text(before.sandbox_classes)})")
    if not selects(template.spec.worker_selector, after):
        return f"ActorTemplate {name}'s workerSelector no longer matches this WorkerPool's labels"
    size, capacity = actor_size(template), worker_capacity(after)
    short = shortfall(size, capacity)
    offers = ", ".join(show(n, offered(capacity, n) or Decimal(0)) for n in short)
    return f"ActorTemplate {name} needs {show_all(size, short)}; this WorkerPool would offer {offers}"


@rule("actor-pool-shrink", "validate", POOL_KINDS, Mode.WARN,
      "WorkerPool UPDATE: capacity no longer hosts an ActorTemplate placed on it",
      operations={"UPDATE"}, reads={"ActorTemplate", "WorkerPool"})
def pool_shrink(subject: Subject, obj: dict[str, Any], view: ClusterView,
                policy: Policy) -> list[Finding]:
    before, after = _pool(subject.old), _pool(obj)
    if before is None or after is None:
        return []
    namespace = _namespace(subject, after.metadata.namespace)
    written = AfterWrite(view, "WorkerPool", after.metadata.name or "", obj, namespace=namespace)
    findings = []
    raws = [raw for cls in sorted(before.sandbox_classes)
            for raw in view.by_index(TEMPLATES_BY_CLASS, f"{namespace}/{cls}")]
    for raw in raws:
        template = _template(raw)
        if template is None or not _hosts(before, template) or _hosts(after, template):
            continue
        message = _lost_reason(before, after, template)
        pools = _pools(written, namespace, template.spec.sandbox_class)
        if not place_actor(template, namespace, pools).fitting:
            message += "; no other WorkerPool fits it"
        findings.append(error("spec.template.resources.limits", message))
    return findings


def pool_sizing(subject: Subject, obj: dict[str, Any]) -> Any:
    """What actor-pool-resources judges: the worker's resources and sandbox class."""
    pool = _pool(obj)
    return None if pool is None else (pool.resources, pool.sandbox_classes)


def _quantity_findings(section: str, values: Mapping[str, Any]) -> Iterator[Finding]:
    for name, value in values.items():
        path = f"spec.template.resources.{section}.{name}"
        try:
            amount = parse_quantity(value)
        except QuantityError as exc:
            yield error(path, f"{path}: {exc}")
            continue
        if amount < 0:
            yield error(path, f"{path}: {shown(value)} is negative")


def _gpu_findings(pool: WorkerPool) -> Iterator[Finding]:
    limits, requests = pool.resources.limits or {}, pool.resources.requests or {}
    base = "spec.template.resources"
    classes = pool.sandbox_classes
    if (GPU in limits or GPU in requests) and classes != {GVISOR}:
        yield error(f"{base}.limits.{GPU}", f"{GPU} is only supported with sandboxClass gvisor, "
                                            f"not {_classes_text(classes - {GVISOR})}")
    if GPU not in requests:
        return
    if GPU not in limits:
        yield error(f"{base}.limits.{GPU}",
                      f"{GPU} request {requests[GPU]} needs a matching limit")
    elif _as_quantity(requests[GPU]) != _as_quantity(limits[GPU]):
        yield error(f"{base}.requests.{GPU}",
                      f"{GPU} request {requests[GPU]} must equal its limit {limits[GPU]}")


@rule("actor-pool-resources", "validate", POOL_KINDS, Mode.ENFORCE,
      "WorkerPool: quantities parse; nvidia.com/gpu only on gvisor, request == limit",
      judges=pool_sizing)
def pool_resources(subject: Subject, obj: dict[str, Any], view: ClusterView,
                   policy: Policy) -> list[Finding]:
    pool = decode(WorkerPool, obj)
    if isinstance(pool, ValidationError):
        return _shape_findings(pool)
    # a sandboxClasses list the CRD would refuse only reaches here from files (envelope check)
    findings = [error(problem.split(":", 1)[0], problem) for problem in read_pool_classes(obj).problems]
    for section in ("limits", "requests"):
        findings.extend(_quantity_findings(section, getattr(pool.resources, section) or {}))
    findings.extend(_gpu_findings(pool))
    return findings
