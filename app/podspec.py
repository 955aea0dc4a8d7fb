"""Pod-spec helpers: where each workload kind keeps its pod template, the resources
blocks and containers in it, the shape the API server decodes it into, and how many
pods a workload asks for at once.

Pure functions over plain Kubernetes dicts (no rules, no I/O, no policy): the workload
rules (``app/rules/workloads.py``), the rules that read the namespace and the nodes
(``app/rules/namespace.py``), the webhook configuration's match conditions and the
tests read pod specs through here.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from app.util import dig

__all__ = ["POD_SPEC_PATHS", "WORKLOAD_KINDS", "Holder", "Kinded", "containers", "holders",
           "pod_resources", "pod_spec", "replicas_of", "shape_problems", "spec_text", "well_formed",
           "with_pod_spec"]


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


def pod_resources(subject: Kinded, obj: dict[str, Any]) -> Any:
    """What workload rules judge of a Pod: its resources blocks and container env
    (both immutable after creation, bar in-place resize), so a Pod UPDATE that leaves
    them alone — a label, a finalizer — is not judged again. Pod templates have no
    such part (``None``): every write of a Deployment is judged, and ratcheted."""
    if subject.kind != "Pod":
        return None
    return ([h.resources for h in holders(subject, obj)],
            [c.get("env") for _, _, c in containers(subject, obj)])


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
