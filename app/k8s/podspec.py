"""Pod-spec helpers: where each workload kind keeps its pod template, the resources
blocks and containers in it, the shape the API server decodes it into, and how many
pods a workload asks for at once.

Pure functions over plain Kubernetes dicts (no rules, no I/O, no policy): the workload
rules (``app/rules/workloads/``), the rules that read the namespace and the nodes
(``app/rules/namespace/``), the webhook configuration's match conditions and the
tests read pod specs through here.

Why one module of ~455 lines: every helper here answers "where in this kind's object is
the pod spec, and what does it hold" for all eight workload kinds (``POD_SPEC_PATHS``);
the shape check, the parts an UPDATE holds and the QoS class read the same paths.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from app.k8s.quantity import parse_quantity
from app.k8s.util import dig

__all__ = ["POD_SPEC_PATHS", "WORKLOAD_KINDS", "Held", "Holder", "Kinded", "compared_by_controller",
           "containers", "held_on_update", "holders", "job_template_mutable", "pod_resources",
           "pod_spec", "pod_template", "qos_class", "replicas_of", "shape_problems", "spec_text",
           "stored_qos", "template_part", "well_formed", "with_pod_spec"]


class Kinded(Protocol):
    """What the helpers read of a write: its API group and kind (a ``Subject``)."""

    @property
    def group(self) -> str: ...

    @property
    def kind(self) -> str: ...


#: Where the pod spec lives in each workload kind, keyed by (API group, kind).
POD_SPEC_PATHS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "Pod"): ("spec",),
    ("", "ReplicationController"): ("spec", "template", "spec"),
    ("apps", "Deployment"): ("spec", "template", "spec"),
    ("apps", "ReplicaSet"): ("spec", "template", "spec"),
    ("apps", "StatefulSet"): ("spec", "template", "spec"),
    ("apps", "DaemonSet"): ("spec", "template", "spec"),
    ("batch", "Job"): ("spec", "template", "spec"),
    ("batch", "CronJob"): ("spec", "jobTemplate", "spec", "template", "spec"),
}
WORKLOAD_KINDS = frozenset(POD_SPEC_PATHS)
_SPEC_TEXT = {kind: ".".join(path) for kind, path in POD_SPEC_PATHS.items()}
"""The same paths as message text, e.g. ``spec.template.spec``."""


def spec_text(subject: Kinded) -> str:
    """The pod spec's path as message text, e.g. ``spec.template.spec``."""
    return _SPEC_TEXT[(subject.group, subject.kind)]


def pod_spec(subject: Kinded, obj: dict[str, Any]) -> dict[str, Any] | None:
    spec = dig(obj, POD_SPEC_PATHS[(subject.group, subject.kind)])
    return spec if isinstance(spec, dict) else None


def pod_template(subject: Kinded, obj: Any) -> dict[str, Any] | None:
    """A workload's pod template (its ``metadata`` and ``spec``: what its controller makes
    Pods from); None for a Pod, or where the object has none."""
    if subject.kind == "Pod":
        return None
    template = dig(obj, POD_SPEC_PATHS[(subject.group, subject.kind)][:-1])
    return template if isinstance(template, dict) else None


@dataclass
class Holder:
    """Something with a ``resources`` block: a container or the pod itself."""

    label: str
    """For messages: ``container "app"``, ``initContainer "setup"``, ``pod-level resources``."""
    path: str
    """Dotted path of the ``resources`` block, e.g. ``spec.containers[0].resources``."""
    resources: dict[str, Any]
    container: dict[str, Any] | None


def holders(subject: Kinded, obj: dict[str, Any]) -> Iterator[Holder]:
    """Every resources block of the pod spec: initContainers, containers, pod level."""
    base = _SPEC_TEXT[(subject.group, subject.kind)]
    spec = pod_spec(subject, obj)
    if spec is None:
        return
    for field, word in (("initContainers", "initContainer"), ("containers", "container")):
        items = spec.get(field)
        if not isinstance(items, list):
            continue
        for i, container in enumerate(items):
            if not isinstance(container, dict):
                continue
            resources = container.get("resources")
            if isinstance(resources, dict):
                name = container.get("name") if isinstance(container.get("name"), str) else i
                yield Holder(f'{word} "{name}"', f"{base}.{field}[{i}].resources",
                             resources, container)
    resources = spec.get("resources")
    if isinstance(resources, dict):
        yield Holder("pod-level resources", f"{base}.resources", resources, None)


_SCALAR = (str, int, float)


def _quantity_map(value: Any, path: str, out: list[tuple[str, str]]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        out.append((path, f"expected a map of resource name to quantity, got {type(value).__name__}"))
        return
    for key, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, _SCALAR):
            out.append((f"{path}.{key}", f"expected a quantity, got {type(amount).__name__}"))


def _resources_shape(resources: Any, path: str, out: list[tuple[str, str]]) -> None:
    if resources is None:
        return
    if not isinstance(resources, dict):
        out.append((path, f"expected an object, got {type(resources).__name__}"))
        return
    for section in ("limits", "requests"):
        _quantity_map(resources.get(section), f"{path}.{section}", out)


def shape_problems(subject: Kinded, obj: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the pod spec lacks the shape the API server decodes it into (it refuses
    such objects before any webhook; ``envelope check`` reads raw files): lists that are
    not lists, resources that are not maps of quantities, env entries that are not
    objects. Empty when every workload rule can read it."""
    base = _SPEC_TEXT[(subject.group, subject.kind)]
    out: list[tuple[str, str]] = []
    node: Any = obj
    for key in POD_SPEC_PATHS[(subject.group, subject.kind)]:
        node = node.get(key) if isinstance(node, dict) else None
    if node is None:
        return out
    if not isinstance(node, dict):
        return [(base, f"expected an object, got {type(node).__name__}")]
    for field in ("initContainers", "containers"):
        items = node.get(field)
        if items is None:
            continue
        if not isinstance(items, list):
            out.append((f"{base}.{field}", f"expected a list, got {type(items).__name__}"))
            continue
        for i, c in enumerate(items):
            where = f"{base}.{field}[{i}]"
            if not isinstance(c, dict):
                out.append((where, f"expected an object, got {type(c).__name__}"))
                continue
            _resources_shape(c.get("resources"), f"{where}.resources", out)
            env = c.get("env")
            if env is not None and not (isinstance(env, list) and all(isinstance(e, dict) for e in env)):
                out.append((f"{where}.env", "expected a list of objects"))
    _resources_shape(node.get("resources"), f"{base}.resources", out)
    _quantity_map(node.get("overhead"), f"{base}.overhead", out)
    for field, kind in (("nodeSelector", dict), ("tolerations", list), ("affinity", dict)):
        value = node.get(field)
        if value is not None and not isinstance(value, kind):
            out.append((f"{base}.{field}", f"expected {'an object' if kind is dict else 'a list'}, "
                                           f"got {type(value).__name__}"))
    _placement_shape(node, base, out)
    return out


def _placement_shape(spec: dict[str, Any], base: str, out: list[tuple[str, str]]) -> None:
    """The strings pod-fits-node compares with every Node's labels: nodeSelector values
    and the required node affinity's expressions (key, operator, values). Anything else
    there (a deep object, a long string read as a list of characters) would be turned
    into text once per Node — seconds with thousands of Nodes."""
    selector = spec.get("nodeSelector")
    if isinstance(selector, dict):
        for key, value in selector.items():
            if not isinstance(value, str):
                out.append((f"{base}.nodeSelector.{key}",
                            f"expected a string, got {type(value).__name__}"))
    terms = dig(spec, ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                       "nodeSelectorTerms"))
    for i, term in enumerate(terms if isinstance(terms, list) else []):
        for part in ("matchExpressions", "matchFields"):
            exprs = term.get(part) if isinstance(term, dict) else None
            for j, expr in enumerate(exprs if isinstance(exprs, list) else []):
                where = (f"{base}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                         f".nodeSelectorTerms[{i}].{part}[{j}]")
                if not isinstance(expr, dict):
                    out.append((where, f"expected an object, got {type(expr).__name__}"))
                    continue
                for name in ("key", "operator"):
                    if expr.get(name) is not None and not isinstance(expr.get(name), str):
                        out.append((f"{where}.{name}",
                                    f"expected a string, got {type(expr.get(name)).__name__}"))
                values = expr.get("values")
                if values is not None and not (isinstance(values, list)
                                               and all(isinstance(v, str) for v in values)):
                    out.append((f"{where}.values", "expected a list of strings"))


def well_formed(subject: Kinded, obj: dict[str, Any]) -> bool:
    """What every workload rule but ``quantities`` requires (see :func:`shape_problems`)."""
    return not shape_problems(subject, obj)


def containers(subject: Kinded, obj: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(label, dotted path, container) for every container and initContainer."""
    base = _SPEC_TEXT[(subject.group, subject.kind)]
    spec = pod_spec(subject, obj) or {}
    for field, word in (("initContainers", "initContainer"), ("containers", "container")):
        items = spec.get(field)
        for i, container in enumerate(items if isinstance(items, list) else []):
            if isinstance(container, dict):
                name = container.get("name") if isinstance(container.get("name"), str) else i
                yield f'{word} "{name}"', f"{base}.{field}[{i}]", container


def template_part(subject: Kinded, obj: dict[str, Any]) -> Any:
    """The resources blocks and container env of the pod spec, for every workload kind:
    all that the mutating workload rules read and change. The engine compares it on
    every UPDATE in the mutate phase (``app.core.engine``): a write that leaves it as stored
    (a label, a scale, ``kubectl rollout restart``, an image bump, a Job resumed with a
    node selector) gets no patch, so Envelope never starts a rollout nobody asked for
    nor touches a Job's immutable template."""
    return ([h.resources for h in holders(subject, obj)],
            [c.get("env") for _, _, c in containers(subject, obj)])


def pod_resources(subject: Kinded, obj: dict[str, Any]) -> Any:
    """What workload rules judge of a Pod: its resources blocks and container env
    (both immutable after creation, bar in-place resize), so a Pod UPDATE that leaves
    them alone — a label, a finalizer — is not judged again. Pod templates have no
    such part for validations (``None``): every write of a Deployment is judged, and
    ratcheted; the mutate phase compares :func:`template_part` instead."""
    if subject.kind != "Pod":
        return None
    return template_part(subject, obj)


# --- what an UPDATE may change ----------------------------------------------------------

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Held:
    """What the API server keeps as stored on one UPDATE: a patch elsewhere than
    ``allows`` is refused (``why`` says by what) or, with ``why`` None, silently dropped
    by the strategy (a ``pods/resize`` keeps everything but resources)."""

    allows: Callable[[Path], bool]
    why: str | None


def _status(obj: dict[str, Any] | None) -> dict[str, Any]:
    status = obj.get("status") if isinstance(obj, dict) else None
    return status if isinstance(status, dict) else {}


def job_template_mutable(old: dict[str, Any]) -> bool:
    """Whether a stored Job's pod template resources may change on UPDATE:
    ``shouldAllowMutablePodTemplate`` (pkg/registry/batch/job/strategy.go at v1.37.2,
    feature ``MutablePodResourcesForSuspendedJobs``, beta and on since 1.36): suspended,
    not started or with a true ``Suspended`` condition, and no active pods. Without the
    gate (1.35) no template change passes, so nothing Envelope could patch would either."""
    spec = old.get("spec")
    if not isinstance(spec, dict) or spec.get("suspend") is not True:
        return False
    status = _status(old)
    conditions = status.get("conditions")
    suspended_condition = any(
        isinstance(c, dict) and c.get("type") == "Suspended" and c.get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else []))
    active = status.get("active")
    return (status.get("startTime") is None or suspended_condition) and not active


def _names(spec: Any, field: str) -> list[Any]:
    items = spec.get(field) if isinstance(spec, dict) else None
    return [c.get("name") if isinstance(c, dict) else None
            for c in (items if isinstance(items, list) else [])]


def _container_resources(base: Path, new_spec: Any, old_spec: Any, pod_level: bool
                         ) -> Callable[[Path], bool]:
    """Paths under ``base`` + ``containers[i].resources`` (and init containers), for
    container lists of the same names in the same order, plus the pod-level
    ``resources`` when ``pod_level``: ``validatePodResourceUpdatesOnly`` (Jobs) and
    ``dropNonResizeUpdatesForContainers`` (resize) match containers that way."""
    same = {f for f in ("containers", "initContainers")
            if _names(new_spec, f) == _names(old_spec, f)}
    n = len(base)

    def allows(path: Path) -> bool:
        if path[:n] != base:
            return True  # not in the pod spec: held elsewhere or not at all
        rest = path[n:]
        if pod_level and rest[:1] == ("resources",):
            return True
        return (len(rest) >= 3 and rest[0] in same and isinstance(rest[1], int)
                and rest[2] == "resources")
    return allows


def held_on_update(subject: Kinded, obj: dict[str, Any], old: dict[str, Any] | None,
                   subresource: str = "") -> Held | None:
    """What this UPDATE cannot change in the pod spec (None: whatever the writer may):

    - a Job: its template is immutable (``validatePodTemplateUpdate``,
      pkg/apis/batch/validation/validation.go at v1.37.2) unless the stored Job is
      suspended and not started (:func:`job_template_mutable`); then only container
      and init container resources may change — not env, not pod-level resources
      (``validatePodResourceUpdatesOnly``). Node selector, affinity, tolerations,
      scheduling gates, template labels and annotations are mutable then too
      (``AllowMutableSchedulingDirectives``), but no rule writes them;
    - a ``pods/resize``: the strategy keeps all but container and pod-level resources
      and resize policies as stored (``dropNonResizeUpdates``,
      pkg/registry/core/pod/strategy.go): a change elsewhere would be dropped.
    """
    if not isinstance(old, dict):
        return None
    if subject.kind == "Job" and subject.group == "batch":
        base: Path = ("spec", "template")
        if not job_template_mutable(old):
            return Held(lambda path: path[:2] != base,
                        "a Job's pod template is immutable unless the Job is suspended and has "
                        "not started (ValidateJobUpdate)")
        spec_path: Path = ("spec", "template", "spec")
        inner = _container_resources(spec_path, dig(obj, spec_path), dig(old, spec_path), False)
        return Held(lambda path: path[:2] != base or (path[:3] == spec_path and inner(path)),
                    "a suspended Job's pod template may change only in container resources "
                    "(MutablePodResourcesForSuspendedJobs)")
    if subject.kind == "Pod" and subresource == "resize":
        inner = _container_resources(("spec",), obj.get("spec"), old.get("spec"), True)
        return Held(lambda path: path[:1] != ("spec",) or inner(path), None)
    return None


# --- owned children -------------------------------------------------------------------

def compared_by_controller(subject: Kinded, obj: dict[str, Any] | None) -> str | None:
    """Why Envelope leaves this object as its controller wrote it, or None.

    A ReplicaSet whose controller ownerReference is an apps/v1 Deployment: the
    Deployment controller finds its ReplicaSets by comparing pod templates
    (``FindNewReplicaSet``, ``EqualIgnoreHash`` in pkg/controller/deployment/util at
    v1.37.2). Changed by a webhook, the ReplicaSet never equals the Deployment's
    template: the controller makes another, which collides on the hash
    (``collisionCount``) and loops. The Deployment was judged when it was written and
    the ReplicaSet's Pods are judged when they are created, so nothing escapes the
    policy by this: a forged ownerReference keeps only the ReplicaSet's own template as
    written (the Pods are still stripped and judged, and the garbage collector deletes
    a ReplicaSet whose owner does not exist)."""
    if subject.kind != "ReplicaSet" or subject.group != "apps" or not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for owner in refs if isinstance(refs, list) else []:
        if (isinstance(owner, dict) and owner.get("controller") is True
                and owner.get("kind") == "Deployment" and owner.get("apiVersion") == "apps/v1"):
            name = owner.get("name")
            return f"owned by Deployment {name if isinstance(name, str) else '?'}: judged there"
    return None


# --- QoS class --------------------------------------------------------------------------

def _requirements_qos(resources: Any) -> str:
    """``requirementsQOS`` (pkg/apis/core/helper/qos/qos.go at v1.37.2)."""
    resources = resources if isinstance(resources, dict) else {}
    requests = resources.get("requests") if isinstance(resources.get("requests"), dict) else {}
    limits = resources.get("limits") if isinstance(resources.get("limits"), dict) else {}
    if not requests and not limits:
        return "BestEffort"
    found = ""
    for name in ("cpu", "memory"):
        req = parse_quantity(requests.get(name, 0))
        lim = parse_quantity(limits.get(name, 0))
        this = "Burstable" if req != lim else "BestEffort" if req == 0 else "Guaranteed"
        if this == "Burstable":
            return this
        if found and found != this:
            return "Burstable"
        found = this
    return found


def qos_class(spec: dict[str, Any]) -> str:
    """The QoS class of a Pod's spec, as ``ComputePodQOS`` computes it: from pod-level
    resources when they are set, else every container and init container. Raises
    ``QuantityError`` for a quantity that does not parse."""
    pod_level = spec.get("resources")
    if isinstance(pod_level, dict) and (pod_level.get("requests") or pod_level.get("limits")):
        return _requirements_qos(pod_level)
    found = ""
    for field in ("initContainers", "containers"):
        items = spec.get(field)
        for c in items if isinstance(items, list) else []:
            this = _requirements_qos(c.get("resources") if isinstance(c, dict) else None)
            if this == "Burstable":
                return this
            if found and found != this:
                return "Burstable"
            found = found or this
    return found or "BestEffort"


def with_pod_spec(subject: Kinded, obj: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """A shallow copy of ``obj`` with ``spec`` at its pod spec path (for judging only)."""
    path = POD_SPEC_PATHS[(subject.group, subject.kind)]
    root = dict(obj)
    node = root
    for key in path[:-1]:
        child = node.get(key)
        node[key] = node = dict(child) if isinstance(child, dict) else {}
    node[path[-1]] = spec
    return root


def _count(value: Any, default: int) -> int:
    """A replica count as the API server decodes it (an integer; null or absent is the
    default): anything else is the quantities rule's to refuse, not a crash here."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def replicas_of(subject: Kinded, obj: dict[str, Any]) -> int:
    """How many pods the object asks for at once."""
    raw = obj.get("spec")
    spec: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if subject.kind == "Pod":
        return 1
    if subject.kind == "Job":
        return _count(spec.get("parallelism"), 1)
    if subject.kind == "CronJob":
        return _count(dig(spec, ("jobTemplate", "spec", "parallelism")), 1)
    if subject.kind == "DaemonSet":
        return 0  # one per node: not a replica count the namespace chooses
    return _count(spec.get("replicas"), 1)


def stored_qos(old: dict[str, Any]) -> str:
    """A stored Pod's QoS class, as ``GetPodQOS`` reads it: ``status.qosClass``, else
    computed (:func:`qos_class`)."""
    status = old.get("status")
    written = status.get("qosClass") if isinstance(status, dict) else None
    if isinstance(written, str) and written:
        return written
    spec = old.get("spec")
    return qos_class(spec if isinstance(spec, dict) else {})
