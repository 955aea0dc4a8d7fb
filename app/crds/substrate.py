"""agent-substrate objects across upstream versions: both WorkerPool shapes, and
ActorTemplates in the format users write since the CRD was removed.

Pure functions over raw (already decoded) objects; nothing here raises on a malformed
object. A WorkerPool (``ate.dev/v1alpha1``) names one class in ``spec.sandboxClass`` up
to upstream's rename (#1298), and ``spec.sandboxClasses`` since; an ActorTemplate is no
longer a CRD (#1376) but a resource of the substrate API server:
:func:`read_current_template` reads its ``api.ate.dev/v1alpha1`` document into the
envelope the CRD-era rules judge, and :func:`as_crd_template` renders that envelope as an
``ate.dev/v1alpha1`` ActorTemplate so those rules run unchanged. What upstream changed,
the fields read and where each was read: docs/upstream.md, "agent-substrate".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "API_GROUP",
    "CRD_DEFAULT_CLASS",
    "CURRENT_TEMPLATE_KINDS",
    "CurrentTemplate",
    "PoolClasses",
    "PoolShape",
    "as_crd_template",
    "is_current_template",
    "pool_sandbox_classes",
    "pool_worker_image",
    "read_current_template",
    "read_pool_classes",
]

CRD_GROUP = "ate.dev"
API_GROUP = "api.ate.dev"
"""The group of ``kubectl ate apply`` manifests; the CLI rejects ``ate.dev/v1alpha1``."""
CURRENT_TEMPLATE_KINDS = frozenset({"ActorTemplate", "ActorTemplateVersion"})
CRD_DEFAULT_CLASS = "gvisor"
"""What the CRD-era schemas default ``spec.sandboxClass`` to, on both kinds."""

PoolShape = Literal["sandboxClasses", "sandboxClass", "both", "neither"]
"""Which class field(s) a WorkerPool carries: current, CRD-era, both (only in
hand-written files: a served CRD prunes the field it does not know) or neither."""

_ENUM_PREFIX = "SANDBOX_CLASS_"


def _type(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _spec(obj: object) -> Mapping[str, Any]:
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    return spec if isinstance(spec, Mapping) else {}


# --------------------------------------------------------------------------- WorkerPool


@dataclass(frozen=True)
class PoolClasses:
    """The sandbox classes a WorkerPool runs, as the scheduler will see them."""

    classes: frozenset[str]
    """Empty only when the pool declares classes and none of them can be read."""
    shape: PoolShape
    problems: tuple[str, ...] = ()
    """``path: what is wrong`` for each entry that could not be read."""


def _current_classes(value: object) -> tuple[list[str], list[str]]:
    """Names in ``spec.sandboxClasses`` (order kept, duplicates dropped) and problems."""
    path = "spec.sandboxClasses"
    if not isinstance(value, list):
        return [], [f"{path}: expected a list of {{name, configRef}}, got {_type(value)}"]
    if not value:
        return [], [f"{path}: names no sandbox class (upstream requires exactly one entry)"]
    names: list[str] = []
    problems: list[str] = []
    for i, entry in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{where}: expected {{name, configRef}}, got {_type(entry)}")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}.name: expected a sandbox class name, got {name!r}")
            continue
        ref = entry.get("configRef")
        if ref is not None and not (isinstance(ref, Mapping) and isinstance(ref.get("name"), str)):
            problems.append(f"{where}.configRef: expected {{name: <SandboxConfig>}}, got {ref!r}")
        if name in names:
            problems.append(f"{where}.name: {name} is listed twice (the list is keyed by name)")
            continue
        names.append(name)
    return names, problems


def read_pool_classes(pool: object) -> PoolClasses:
    """The classes a WorkerPool offers, from either shape.

    - current shape: the names in ``spec.sandboxClasses``;
    - CRD-era shape: ``spec.sandboxClass``, absent or empty being the CRD default
      ``gvisor`` — so a pool with neither field is a CRD-era gVisor pool (the current
      CRD requires ``sandboxClasses``);
    - both (a hand-written file): the current field wins; a disagreement is a problem;
    - a ``sandboxClasses`` with no readable entry falls back to a readable
      ``sandboxClass``, else offers nothing: a pool that meant to name its classes
      and named none hosts no actor, rather than silently becoming gVisor.
    """
    spec = _spec(pool)
    has_new = spec.get("sandboxClasses") is not None
    old = spec.get("sandboxClass")
    has_old = old not in (None, "")
    problems: list[str] = []
    old_class: str | None = None
    if has_old:
        if isinstance(old, str):
            old_class = old
        else:
            problems.append(f"spec.sandboxClass: expected a sandbox class name, got {_type(old)}")
    if not has_new:
        shape: PoolShape = "sandboxClass" if has_old else "neither"
        if has_old and old_class is None:
            return PoolClasses(frozenset(), shape, tuple(problems))
        return PoolClasses(frozenset({old_class or CRD_DEFAULT_CLASS}), shape, tuple(problems))
    names, new_problems = _current_classes(spec.get("sandboxClasses"))
    problems = new_problems + problems
    shape = "both" if has_old else "sandboxClasses"
    if names:
        if old_class is not None and old_class not in names:
            problems.append(f"spec.sandboxClass: {old_class} disagrees with spec.sandboxClasses "
                            f"({', '.join(names)}); a served CRD keeps only one of the two fields")
        return PoolClasses(frozenset(names), shape, tuple(problems))
    return PoolClasses(frozenset({old_class}) if old_class else frozenset(), shape, tuple(problems))


def pool_sandbox_classes(pool: object) -> frozenset[str]:
    """The sandbox classes a WorkerPool of either shape runs (see :func:`read_pool_classes`)."""
    return read_pool_classes(pool).classes


def pool_worker_image(pool: object) -> str | None:
    """The worker image: ``spec.workerImage`` (current) else ``spec.ateomImage`` (CRD era)."""
    spec = _spec(pool)
    for key in ("workerImage", "ateomImage"):
        value = spec.get(key)
        if isinstance(value, str) and value:
            return value
    return None


# --------------------------------------------------------------------------- current templates


def is_current_template(doc: object) -> bool:
    """An ``api.ate.dev`` ActorTemplate or ActorTemplateVersion document."""
    if not isinstance(doc, Mapping):
        return False
    group, _, _version = str(doc.get("apiVersion") or "").rpartition("/")
    return group == API_GROUP and doc.get("kind") in CURRENT_TEMPLATE_KINDS


@dataclass(frozen=True)
class CurrentTemplate:
    """The part of a substrate-API ActorTemplate Envelope judges: its envelope."""

    kind: str
    name: str
    atespace: str
    sandbox_class: str
    limits: dict[str, Any] = field(default_factory=dict)
    """Resource name -> quantity as written (``resources.limits`` of the template)."""
    requests: dict[str, Any] | None = None
    """Present only when the document declares requests, which upstream does not size by."""
    worker_selector: dict[str, Any] | None = None
    config_name: str | None = None
    problems: tuple[str, ...] = ()


def _class_from_config(config: object, problems: list[str], path: str) -> tuple[str, str | None]:
    if config is None:
        return CRD_DEFAULT_CLASS, None
    if not isinstance(config, Mapping):
        problems.append(f"{path}: expected {{sandboxClass, configName}}, got {_type(config)}")
        return CRD_DEFAULT_CLASS, None
    raw = config.get("sandboxClass")
    name = config.get("configName")
    config_name = name if isinstance(name, str) and name else None
    if raw in (None, "", f"{_ENUM_PREFIX}UNSPECIFIED"):
        return CRD_DEFAULT_CLASS, config_name
    if not isinstance(raw, str):
        problems.append(f"{path}.sandboxClass: expected a class such as SANDBOX_CLASS_MICROVM, "
                        f"got {_type(raw)}")
        return CRD_DEFAULT_CLASS, config_name
    text = raw[len(_ENUM_PREFIX):] if raw.startswith(_ENUM_PREFIX) else raw
    return text.lower(), config_name


def _limits(value: object, problems: list[str], path: str) -> dict[str, Any]:
    """``[{name, quantity}]`` (the API's list form) or ``{name: quantity}`` -> a map."""
    out: dict[str, Any] = {}
    if value is None:
        return out
    if isinstance(value, Mapping):
        for name, quantity in value.items():
            out[str(name)] = quantity
        return out
    if not isinstance(value, list):
        problems.append(f"{path}: expected a list of {{name, quantity}}, got {_type(value)}")
        return out
    for i, entry in enumerate(value):
        where = f"{path}[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            problems.append(f"{where}: expected {{name, quantity}}, got {entry!r}")
            continue
        name = entry["name"]
        if name in out:
            problems.append(f"{where}.name: {name} is listed twice")
            continue
        out[name] = entry.get("quantity")
    return out


def read_current_template(doc: object, selector_from: Mapping[str, Any] | None = None) -> CurrentTemplate:
    """Read an ``api.ate.dev`` ActorTemplate (or ActorTemplateVersion) document.

    The body is ``spec`` when the document has one (``kubectl ate apply`` manifests),
    else the document itself (the API resource written out as YAML/JSON). An
    ActorTemplateVersion carries no ``workerSelector``; pass its template's
    document as ``selector_from`` to place it as that template would be.
    """
    problems: list[str] = []
    body: Mapping[str, Any]
    root = "spec"
    if isinstance(doc, Mapping) and isinstance(doc.get("spec"), Mapping):
        body = doc["spec"]
    else:
        body = doc if isinstance(doc, Mapping) else {}
        root = ""
        if not isinstance(doc, Mapping):
            problems.append(f"expected a mapping, got {_type(doc)}")

    def at(name: str) -> str:
        return f"{root}.{name}" if root else name

    meta = doc.get("metadata") if isinstance(doc, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    kind = str(doc.get("kind") or "ActorTemplate") if isinstance(doc, Mapping) else "ActorTemplate"
    sandbox_class, config_name = _class_from_config(body.get("sandboxConfig"), problems,
                                                    at("sandboxConfig"))
    resources = body.get("resources")
    limits: dict[str, Any] = {}
    requests: dict[str, Any] | None = None
    if isinstance(resources, Mapping):
        limits = _limits(resources.get("limits"), problems, at("resources.limits"))
        if resources.get("requests") is not None:
            requests = _limits(resources.get("requests"), problems, at("resources.requests"))
    elif resources is not None:
        problems.append(f"{at('resources')}: expected {{limits}}, got {_type(resources)}")
    selector_body = _spec(selector_from) if selector_from is not None else body
    if selector_from is not None and not isinstance(selector_from.get("spec"), Mapping):
        selector_body = selector_from
    selector = selector_body.get("workerSelector")
    if selector is not None and not isinstance(selector, Mapping):
        problems.append(f"{at('workerSelector')}: expected a label selector, got {_type(selector)}")
        selector = None
    return CurrentTemplate(
        kind=kind,
        name=str(meta.get("name") or ""),
        atespace=str(meta.get("atespace") or ""),
        sandbox_class=sandbox_class,
        limits=limits,
        requests=requests,
        worker_selector=dict(selector) if selector is not None else None,
        config_name=config_name,
        problems=tuple(problems),
    )


def as_crd_template(template: CurrentTemplate, namespace: str) -> dict[str, Any]:
    """The envelope as an ``ate.dev/v1alpha1`` ActorTemplate, for the CRD-era rules
    (limits only, the micro-VM floor, placement). ``namespace`` is where placement
    looks for WorkerPools; a substrate-API template lives in an atespace, not a
    namespace, so the caller chooses."""
    resources: dict[str, Any] = {}
    if template.limits:
        resources["limits"] = dict(template.limits)
    if template.requests is not None:
        resources["requests"] = dict(template.requests)
    spec: dict[str, Any] = {"sandboxClass": template.sandbox_class}
    if resources:
        spec["resources"] = resources
    if template.worker_selector is not None:
        spec["workerSelector"] = dict(template.worker_selector)
    return {"apiVersion": f"{CRD_GROUP}/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"name": template.name, "namespace": namespace}, "spec": spec}
