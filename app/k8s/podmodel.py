"""The Pods a workload makes, as Envelope's Pod webhook will be asked about them.

A template is not a Pod: between the two stand the workload's controller (only the
template's labels and annotations reach the Pod; the DaemonSet controller adds its
tolerations), the API server's defaulting, and the mutating admission plugins that run
before the webhooks (LimitRanger, Priority, DefaultTolerationSeconds,
ExtendedResourceToleration when the policy lists it, RuntimeClass), applied here by one
function, :func:`admit`: every rule that judges a template's Pods goes through it. How
many run at once (``concurrent``) is the controller's.

Upstream v1.37.2 (the same in v1.35), file by file: docs/fidelity.md, "The ports, file
by file". ``e2e/test_oracle_podconstruction.py`` compares this with the Pods a real
kube-controller-manager and kube-apiserver make. Pure: no I/O.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.k8s.defaulting import apply_limit_range_defaults, default_pod
from app.k8s.namespace_policy import pods_at_once
from app.k8s.podspec import pod_template
from app.k8s.quantity import QuantityError
from app.k8s.scheduling import node_from_object, required_affinity_matches, untolerated_taint

__all__ = ["DAEMON_TOLERATIONS", "EXTENDED_RESOURCE_TOLERATION", "Admission", "PodModel", "admit",
           "concurrent", "daemon_nodes", "daemon_tolerations", "default_priority_class",
           "extended_resources", "merge_tolerations", "pod_of"]

#: AddOrUpdateDaemonPodTolerations, in its order (hostNetwork adds network-unavailable).
DAEMON_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
_NETWORK_UNAVAILABLE = {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists",
                        "effect": "NoSchedule"}
#: DefaultTolerationSeconds' defaults (--default-not-ready-toleration-seconds=300, ...).
DEFAULT_TOLERATION_SECONDS = 300


@dataclass(frozen=True)
class PodModel:
    """One Pod of the workload as the mutating webhooks receive it, or why none is made."""

    pod: dict[str, Any] | None
    refused: str | None = None  # an admission plugin refuses every such Pod


def _same_match(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Toleration.MatchToleration: same key, effect, operator and value."""
    return all((a.get(k) or "") == (b.get(k) or "") for k in ("key", "effect", "operator", "value"))


def _add_or_update(tolerations: list[dict[str, Any]], toleration: dict[str, Any]) -> list[dict[str, Any]]:
    """v1helper.AddOrUpdateTolerationInPodSpec."""
    out: list[dict[str, Any]] = []
    updated = False
    for existing in tolerations:
        if _same_match(toleration, existing):
            if existing == toleration:
                return tolerations
            out.append(dict(toleration))
            updated = True
            continue
        out.append(existing)
    if not updated:
        out.append(dict(toleration))
    return out


def _superset(ss: Mapping[str, Any], t: Mapping[str, Any]) -> bool:
    """pkg/util/tolerations isSuperset: ``ss`` tolerates everything ``t`` does."""
    if dict(ss) == dict(t):
        return True
    ss_key = ss.get("key") or ""
    if (t.get("key") or "") != ss_key and (ss_key != "" or ss.get("operator") != "Exists"):
        return False  # an empty key with Exists matches every key
    if (t.get("effect") or "") != (ss.get("effect") or "") and (ss.get("effect") or ""):
        return False
    if ss.get("effect") == "NoExecute" and ss.get("tolerationSeconds") is not None:
        seconds = t.get("tolerationSeconds")
        if seconds is None or seconds > ss["tolerationSeconds"]:
            return False
    operator = ss.get("operator") or "Equal"
    if operator == "Equal":
        return (t.get("operator") or "Equal") == "Equal" and (t.get("value") or "") == (ss.get("value") or "")
    return operator == "Exists"


def merge_tolerations(first: Sequence[Mapping[str, Any]],
                      second: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """pkg/util/tolerations MergeTolerations: both lists, a toleration another one covers
    dropped (of two equal ones, the first kept)."""
    every = [dict(t) for t in (*first, *second)]
    merged: list[dict[str, Any]] = []
    for i, t in enumerate(every):
        if any(_superset(m, t) for m in merged):
            continue
        if any(t != later and _superset(later, t) for later in every[i + 1:]):
            continue
        merged.append(t)
    return merged


def _default_toleration_seconds(tolerations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(tolerations)
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any((t.get("key") in (key, None, "")) and (t.get("effect") in ("NoExecute", None, ""))
                   for t in tolerations):
            out.append({"key": key, "operator": "Exists", "effect": "NoExecute",
                        "tolerationSeconds": DEFAULT_TOLERATION_SECONDS})
    return out


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


@dataclass(frozen=True)
class _Kinded:
    group: str
    kind: str


def _template(kind: str, group: str, obj: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, spec) of the Pods the workload makes: the template's, copied."""
    if kind == "Pod":
        meta, spec = _mapping(obj.get("metadata")), _mapping(obj.get("spec"))
        return copy.deepcopy(dict(meta)), copy.deepcopy(dict(spec))
    template = _mapping(pod_template(_Kinded(group, kind), obj))
    meta = _mapping(template.get("metadata"))
    keep = {k: copy.deepcopy(v) for k, v in meta.items() if k in ("labels", "annotations")}
    return keep, copy.deepcopy(dict(_mapping(template.get("spec"))))


def daemon_tolerations(spec: dict[str, Any]) -> None:
    """The DaemonSet controller's tolerations, added to ``spec`` in place."""
    tolerations = [dict(t) for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    for toleration in DAEMON_TOLERATIONS:
        tolerations = _add_or_update(tolerations, dict(toleration))
    if spec.get("hostNetwork") is True:
        tolerations = _add_or_update(tolerations, dict(_NETWORK_UNAVAILABLE))
    spec["tolerations"] = tolerations


EXTENDED_RESOURCE_TOLERATION = "ExtendedResourceToleration"
"""The plugin's name, as the policy's ``admissionPlugins`` and kube-apiserver's
``--enable-admission-plugins`` spell it."""


@dataclass(frozen=True)
class Admission:
    """What the admission plugins ahead of the webhook read of the cluster (and which of
    the plugins that are off by default are on). ``None``: not known, that step is left
    out (a Pod is judged as written there)."""

    limit_ranges: Sequence[Mapping[str, Any]] = ()
    priority_classes: Sequence[Mapping[str, Any]] | None = None
    runtime_classes: Mapping[str, Mapping[str, Any]] | None = None
    plugins: frozenset[str] = field(default_factory=frozenset)
    """Plugins enabled beyond kube-apiserver's defaults (``EXTENDED_RESOURCE_TOLERATION``)."""


def default_priority_class(classes: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Priority plugin's ``getDefaultPriorityClass``: of the classes with
    ``globalDefault: true``, the one of lowest value (several can exist after a race);
    None without one."""
    found: Mapping[str, Any] | None = None
    for pc in classes:
        if not (isinstance(pc, Mapping) and pc.get("globalDefault") is True):
            continue
        value = pc.get("value")
        value = value if isinstance(value, int) and not isinstance(value, bool) else 0
        if found is None or value < found["value"]:
            found = {"name": _name_of(pc), "value": value}
    return found


def _name_of(obj: Mapping[str, Any]) -> str:
    return str(_mapping(obj.get("metadata")).get("name", ""))


def _priority(spec: dict[str, Any], classes: Sequence[Mapping[str, Any]] | None) -> None:
    """The Priority plugin on CREATE, in place: no class named -> the global default's
    name and value (nothing without one). A class named is the writer's; a missing one
    refuses the Pod upstream, which is not judged here (the built-in classes
    ``system-*`` exist in every cluster, not in the files ``envelope check`` reads)."""
    if classes is None or spec.get("priorityClassName"):
        return
    default = default_priority_class(classes)
    if default is not None and default["name"]:
        spec["priorityClassName"] = default["name"]
        spec["priority"] = default["value"]


#: IsQualifiedName of ``requests.<name>`` (apimachinery validation): an optional DNS
#: subdomain prefix and a name of at most 63 alphanumerics, ``-``, ``_``, ``.``.
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$")


def _is_extended(name: str) -> bool:
    """pkg/apis/core/helper ``IsExtendedResourceName`` at v1.37.2: not native (a name
    with a ``/`` outside ``kubernetes.io/``), not ``requests.*``, and ``requests.<name>``
    a qualified name."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    quota_name = f"requests.{name}"
    prefix, _, _ = quota_name.rpartition("/")
    return len(prefix) <= 253 and bool(_QUALIFIED.match(quota_name))


def extended_resources(spec: Mapping[str, Any]) -> list[str]:
    """The extended resources the containers and init containers request, sorted (as
    the plugin's ``sets.String.List``). A limit without a request counts: the API
    server's defaulting copies it into the requests before admission."""
    names: set[str] = set()
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        for c in items if isinstance(items, list) else []:
            res = _mapping(_mapping(c).get("resources"))
            for section in ("requests", "limits"):
                names.update(str(n) for n in _mapping(res.get(section)) if _is_extended(str(n)))
    return sorted(names)


def _extended_resource_tolerations(spec: dict[str, Any]) -> None:
    tolerations = [dict(t) for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    for name in extended_resources(spec):
        tolerations = _add_or_update(tolerations, {"key": name, "operator": "Exists", "effect": "NoSchedule"})
    spec["tolerations"] = tolerations


def _runtime_class(spec: dict[str, Any],
                   runtime_classes: Mapping[str, Mapping[str, Any]] | None) -> str | None:
    name = spec.get("runtimeClassName")
    if not (isinstance(name, str) and name and runtime_classes is not None):
        return None
    rc = runtime_classes.get(name)
    if rc is None:
        return f"RuntimeClass {name!r} does not exist: the RuntimeClass admission plugin refuses the Pods"
    overhead = _mapping(rc.get("overhead")).get("podFixed")
    if isinstance(overhead, Mapping) and overhead:
        if spec.get("overhead") and dict(spec["overhead"]) != dict(overhead):
            return f"the Pods' overhead differs from RuntimeClass {name!r}'s: refused"
        spec["overhead"] = dict(overhead)
    scheduling = _mapping(rc.get("scheduling"))
    if scheduling:
        selector = dict(spec.get("nodeSelector") or {})
        for key, value in _mapping(scheduling.get("nodeSelector")).items():
            if key in selector and selector[key] != value:
                return (f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                        f"pod.spec.nodeSelector[{key}] = {selector[key]}")
            selector[key] = value
        if selector:
            spec["nodeSelector"] = selector
        spec["tolerations"] = merge_tolerations(spec["tolerations"],
                                                [t for t in scheduling.get("tolerations") or []
                                                 if isinstance(t, Mapping)])
    return None


def admit(spec: Mapping[str, Any], admission: Admission, *,
          limit_ranger: bool = True) -> tuple[dict[str, Any], str | None]:
    """The one model of the mutating admission plugins that run before Envelope's
    webhook on a Pod CREATE, in ``AllOrderedPlugins`` order: LimitRanger (unless
    ``limit_ranger`` is False: app/k8s/namespace_policy.py ``cpu_limit_needs`` applies the
    LimitRanges in each order LimitRanger may take them), Priority,
    DefaultTolerationSeconds, ExtendedResourceToleration (when ``admission.plugins``
    has it), RuntimeClass. Returns (the admitted spec, a copy; why the RuntimeClass
    plugin refuses the Pod, or None). The resources defaulting (``default_pod``) is the
    caller's: a template's Pods are defaulted first, and a rule that judges the written
    template does not want its requests rewritten."""
    out = apply_limit_range_defaults(spec, admission.limit_ranges) \
        if limit_ranger and admission.limit_ranges else dict(spec)
    _priority(out, admission.priority_classes)
    tolerations = [dict(t) for t in out.get("tolerations") or [] if isinstance(t, Mapping)]
    out["tolerations"] = _default_toleration_seconds(tolerations)
    if EXTENDED_RESOURCE_TOLERATION in admission.plugins:
        _extended_resource_tolerations(out)
    return out, _runtime_class(out, admission.runtime_classes)


def pod_of(kind: str, group: str, obj: Mapping[str, Any], *,
           limit_ranges: Iterable[Mapping[str, Any]] = (),
           runtime_classes: Mapping[str, Mapping[str, Any]] | None = None,
           priority_classes: Sequence[Mapping[str, Any]] | None = None,
           plugins: Iterable[str] = ()) -> PodModel:
    """One Pod of the workload ``obj`` (of ``group``/``kind``, a kind of
    app/k8s/podspec.py ``POD_SPEC_PATHS`` or a Pod) as it reaches the mutating webhooks:
    built by its controller, defaulted, and through the admission plugins (:func:`admit`)
    with the namespace's ``limit_ranges``, the cluster's RuntimeClasses by name and
    PriorityClasses (None: unknown, that step is left out) and the ``plugins`` enabled
    beyond the defaults."""
    meta, spec = _template(kind, group, obj)
    if kind == "DaemonSet":
        daemon_tolerations(spec)
    pod = default_pod({"metadata": meta, "spec": spec})
    admitted_spec, refused = admit(pod["spec"], Admission(tuple(limit_ranges), priority_classes,
                                                          runtime_classes, frozenset(plugins)))
    if refused is not None:
        return PodModel(None, refused)
    pod["spec"] = admitted_spec
    return PodModel(pod)


def daemon_nodes(obj: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The Nodes a DaemonSet runs a Pod on (NodeShouldRunDaemonPod: node name, node
    selector and required node affinity, NoSchedule/NoExecute taints against the
    template's tolerations plus the DaemonSet's own). A cordoned Node counts: the
    DaemonSet tolerates ``node.kubernetes.io/unschedulable``."""
    _, spec = _template("DaemonSet", "apps", obj)
    daemon_tolerations(spec)
    names: list[str] = []
    for obj_node in nodes:
        try:
            node = node_from_object(obj_node)
        except (QuantityError, TypeError, ValueError, AttributeError):
            continue  # a Node whose status does not parse: not judged (as pod-fits-node)
        if spec.get("nodeName") and spec["nodeName"] != node.name:
            continue
        if required_affinity_matches(spec, node) and untolerated_taint(spec, node) is None:
            names.append(node.name)
    return names


def concurrent(kind: str, obj: Mapping[str, Any],
               nodes: Iterable[Mapping[str, Any]] | None = None) -> int | None:
    """How many Pods the workload runs at once when its controller has caught up (no Pod
    finished): app/k8s/namespace_policy.py ``pods_at_once`` (replicas, a Job's parallelism
    capped by its completions, none while suspended), a DaemonSet's Nodes (None without
    ``nodes``); a CronJob's is its Jobs' (None: when they overlap is the schedule's)."""
    if kind == "DaemonSet":
        return None if nodes is None else len(daemon_nodes(obj, nodes))
    if kind == "CronJob":
        return None
    return pods_at_once(kind, obj)
