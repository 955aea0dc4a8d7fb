"""Workload rules that read the namespace and the nodes.

Stripping CPU limits is only safe where the namespace lets pods live without them (a
ResourceQuota on ``limits.cpu`` or a LimitRange ``max.cpu`` refuses such pods, and the
ReplicaSet only shows FailedCreate), and a memory envelope is only honest when it fits
somewhere: on a node, and in the namespace's memory budget.

Why one module of ~440 lines: five rules that read the namespace and the nodes; most of
the length is ``pod-fits-node``'s node grouping, kept beside the class index it reads.
The pod-spec helpers are ``app/k8s/podspec.py``, the arithmetic ``app/k8s/namespace_policy.py``
and ``app/k8s/scheduling.py``.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import partial
from typing import Any

import orjson

from app.cluster.after import AfterWrite
from app.cluster.view import NODE_LABEL, ClusterView, Index
from app.core.config import Mode, Policy
from app.crds.autoscaling import KARPENTER_NODEPOOL, karpenter_pools, policy_nodes, pool_shape, scale_up
from app.k8s.defaulting import default_pod, effective_pod_requests
from app.k8s.disclosure import node_reference
from app.k8s.dra import (
    DeviceClass,
    DeviceRequest,
    DeviceState,
    allocated_devices,
    device_classes,
    extended_resource_classes,
    node_device_states,
    pod_claim_requests,
    selector_references,
)
from app.k8s.namespace_policy import (
    CpuLimitNeed,
    cpu_limit_needs,
    managed_elsewhere,
    pods_at_once,
    quota_hard,
    quota_matches_pod,
    quota_scope_key,
)
from app.k8s.podmodel import Admission, admit, daemon_tolerations
from app.k8s.podspec import (
    POD_SPEC_PATHS,
    WORKLOAD_KINDS,
    containers,
    pod_resources,
    pod_spec,
    well_formed,
)
from app.k8s.quantity import QuantityError, format_bytes, format_cpu, format_units, parse_quantity
from app.k8s.scheduling import (
    CORDONED,
    KUBELET,
    SCHEDULER,
    DeviceDemand,
    NodeGroup,
    NodeVerdict,
    PodPlacement,
    clamp_quantity,
    class_key,
    class_node,
    mentions,
    node_from_object,
    node_selector_matches,
    place_pod,
)
from app.k8s.scheduling import Node as SchedNode
from app.k8s.util import Memo, digest, footprint
from app.rules.base import Finding, Ratchet, Subject, error, rule, warning
from app.rules.envelope import move_cpu_limit_to_request, move_pod_level_cpu_limit, pod_amount
from app.rules.workloads import CPU_LIMIT_RULES, keeps_cpu_limit

__all__ = ["INDEXES", "MAX_NODE_GROUPS", "NODE_CLASS"]

INDEXES: tuple[Index, ...] = (NODE_LABEL,)


def _name(obj: dict[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _has_cpu_limit_to_strip(subject: Subject, obj: dict[str, Any]) -> bool:
    spec = pod_spec(subject, obj) or {}
    holders = [c.get("resources") for _, _, c in containers(subject, obj)]
    holders.append(spec.get("resources"))
    return any(isinstance(r, dict) and "cpu" in (r.get("limits") or {}) for r in holders)


def _without_cpu_limits(spec: dict[str, Any]) -> dict[str, Any]:
    """The pod Envelope would let through: API defaults applied (a Pod made from the
    template), every CPU limit removed as the cpu-limits rule removes it."""
    out: dict[str, Any] = default_pod({"spec": spec})["spec"]
    for key in ("containers", "initContainers"):
        for container in out.get(key) or []:
            if isinstance(container, dict) and isinstance(container.get("resources"), dict):
                move_cpu_limit_to_request(container["resources"])
    move_pod_level_cpu_limit(out)
    return out


def _cpu_limit_needs(subject: Subject, obj: dict[str, Any], view: ClusterView,
                     kind: str) -> list[CpuLimitNeed]:
    """app.k8s.namespace_policy.cpu_limit_needs for this workload's pods without CPU
    limits: the LimitRanges (both types, their defaults applied) and the quotas whose
    scopes match the pod (checked against the API server by the admission oracle);
    only the needs of ``kind`` (quotas need the LimitRanges too, for their defaults)."""
    spec = pod_spec(subject, obj)
    if spec is None:
        return []
    limit_ranges = view.list("LimitRange", subject.namespace)
    quotas = view.list("ResourceQuota", subject.namespace) if kind == "ResourceQuota" else []
    if not (quotas if kind == "ResourceQuota" else limit_ranges):
        return []  # nothing of that kind in the namespace: nothing can need the limits
    try:
        stripped = _without_cpu_limits(spec)
        if quotas:
            # The Pods' PriorityClass as the Priority plugin sets it (quota scopes read it;
            # app/k8s/podmodel.py ``admit``); LimitRanger's defaults are cpu_limit_needs', in
            # each order it may apply them.
            stripped = admit(stripped, Admission(priority_classes=view.list("PriorityClass")),
                             limit_ranger=False)[0]
        # A Pod reaches the webhook after LimitRanger's defaults; once stripped, nothing
        # puts them back. A template's Pods get them after the strip.
        needs = cpu_limit_needs(stripped, limit_ranges, quotas,
                                limit_range_defaults=subject.kind != "Pod")
    except QuantityError:
        return []  # the quantities rule names the value that does not parse
    return [n for n in needs if n.kind == kind]


def _guard(subject: Subject, obj: dict[str, Any], policy: Policy, needs: list[CpuLimitNeed]) -> list[Finding]:
    """Keep CPU limits (warn) or refuse the write (enforce) where the namespace needs
    them. Either way the rule holds back the rules that would strip them. A workload
    that opted out keeps its CPU limits anyway: nothing to keep or refuse (class 5)."""
    if not needs or not _has_cpu_limit_to_strip(subject, obj) or keeps_cpu_limit(subject, obj, policy):
        return []
    why = "; ".join(str(n) for n in needs)
    return [error("metadata.namespace",
                  f"{why}: pods without CPU limits would be refused there, and Envelope removes "
                  f'CPU limits; change that object or annotate {policy.opt_out_annotation}: "true"',
                  as_warning=f"CPU limits kept: {why}")]


@rule("quota-needs-cpu-limits", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a ResourceQuota matching the pod needs CPU limits: keep them (warn) or refuse (enforce)",
      mutates=False, order=10, reads={"ResourceQuota", "LimitRange", "PriorityClass"},
      judges=pod_resources, holds_back=CPU_LIMIT_RULES, requires=well_formed)
def quota_needs_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                           policy: Policy) -> list[Finding]:
    if not _has_cpu_limit_to_strip(subject, obj) or keeps_cpu_limit(subject, obj, policy):
        return []  # the cheap reasons first: nothing to keep
    needs = _cpu_limit_needs(subject, obj, view, "ResourceQuota")
    return _guard(subject, obj, policy, needs)


def _container_limits(view: ClusterView, namespace: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for lr in view.list("LimitRange", namespace):
        for item in (lr.get("spec") or {}).get("limits") or []:
            if isinstance(item, dict) and item.get("type") == "Container":
                out.append((_name(lr), item))
    return out


@rule("limitrange-needs-cpu-limits", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a LimitRange (type Container or Pod) needs CPU limits: keep them or refuse",
      mutates=False, order=10, reads={"LimitRange"}, judges=pod_resources,
      holds_back=CPU_LIMIT_RULES, requires=well_formed)
def limitrange_needs_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                policy: Policy) -> list[Finding]:
    if not _has_cpu_limit_to_strip(subject, obj) or keeps_cpu_limit(subject, obj, policy):
        return []  # the cheap reasons first: nothing to keep
    needs = _cpu_limit_needs(subject, obj, view, "LimitRange")
    return _guard(subject, obj, policy, needs)


@rule("limitrange-default-below-request", "validate", WORKLOAD_KINDS, Mode.WARN,
      "a LimitRange default CPU limit below a container's CPU request",
      reads={"LimitRange"}, judges=pod_resources, ratchet=Ratchet.WARN, requires=well_formed)
def limitrange_default_below_request(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                     policy: Policy) -> list[Finding]:
    """LimitRanger puts ``default.cpu`` on every Pod created without a CPU limit; below the
    request, the Pod is refused and the ReplicaSet shows FailedCreate."""
    if subject.kind == "Pod":
        return []  # Pods reach the webhook after LimitRanger; reinvocation strips its default
    defaults = [(name, item["default"]["cpu"]) for name, item in
                _container_limits(view, subject.namespace)
                if "cpu" in (item.get("default") or {})]
    if not defaults:
        return []
    findings = []
    for label, path, c in containers(subject, obj):
        resources = c.get("resources") or {}
        if "cpu" in (resources.get("limits") or {}):
            continue
        request = (resources.get("requests") or {}).get("cpu")
        if request is None:
            continue
        for name, default in defaults:
            if parse_quantity(request) > parse_quantity(default):
                findings.append(error(
                    f"{path}.resources.requests.cpu",
                    f'{label}: LimitRange "{name}" default cpu limit {default} < request '
                    f"{request}; pods fail without Envelope's Pod webhook"))
    return findings


# --- pod fits a node --------------------------------------------------------------


def _node_of(node: dict[str, Any]) -> SchedNode | None:
    """A Node as app.k8s.scheduling sees it (None when a quantity of it does not parse: such a
    node is not judged). The view holds no Pods, so nodes are judged empty; a node that
    reports no ``pods`` allocatable is not limited by pod count."""
    status = node.get("status") or {}
    merged = {**(status.get("capacity") or {}), **(status.get("allocatable") or {})}
    merged.setdefault("pods", "1000000")
    try:
        return node_from_object({**node, "status": {"allocatable": merged}})
    except QuantityError:
        return None


def _node_class(node: dict[str, Any]) -> list[str]:
    built = _node_of(node)
    return [] if built is None else [class_key(built)]


#: Nodes by class (app.k8s.scheduling ``class_key``: everything the filters read but the
#: name and per-node labels), kept current by the view on every watch event: a review
#: judges one node per class, so its cost follows the number of node shapes.
NODE_CLASS = Index("Node", "class", _node_class)


MAX_NODE_GROUPS = 500
"""The most node classes (plus nodes the pod names) one review judges: when none of
them takes the pod and more remain, ``pod-fits-node`` allows it with a warning that it
did not decide — never a refusal it has not checked (docs/deploy.md, "Capacity").
~13 us each on the benchmark machine: ~6 ms CPU for a review that reaches the cap
(docs/benchmarks.md, "pod-fits-node by node class")."""

_classes: Memo[tuple[str, int, int], SchedNode] = Memo(4 * MAX_NODE_GROUPS, 8 * 2**20)


def _reserved(node: SchedNode, reserve_cpu: int, reserve_memory: int) -> SchedNode:
    alloc = dict(node.allocatable)
    alloc["cpu"] = alloc.get("cpu", 0) - reserve_cpu
    alloc["memory"] = alloc.get("memory", 0) - reserve_memory
    return replace(node, allocatable=alloc)


def _class(key: str, reserve_cpu: int, reserve_memory: int) -> SchedNode:
    """The stand-in of a class, the policy's reserves taken off (decoded once per class)."""
    memo_key = (key, reserve_cpu, reserve_memory)
    found = _classes.get(memo_key)
    if found is None:
        found = _classes.put(memo_key, _reserved(class_node(key), reserve_cpu, reserve_memory))
    return found


def _own(stand_in: SchedNode, obj: dict[str, Any]) -> SchedNode:
    """A member of a class as itself: the class's node with the member's name and labels."""
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return replace(stand_in, name="", labels={})  # as node_from_object reads such a node
    labels = meta.get("labels")
    return replace(stand_in, name=str(meta.get("name", "")),
                   labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, Mapping) else {})


DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate")
"""resource.k8s.io/v1 kinds ``pod-fits-node`` reads (app/k8s/dra.py)."""


def _slice_read(obj: dict[str, Any]) -> list[str]:
    """All ``node_device_states`` reads of a ResourceSlice is its spec."""
    try:
        return [digest(obj.get("spec")).hex()]
    except TypeError:
        return [repr(obj.get("spec"))]


def _claim_devices(obj: dict[str, Any]) -> list[str]:
    """The devices a ResourceClaim's allocation takes: all ``node_device_states`` reads
    of a claim (``status.allocation.devices.results``)."""
    return [orjson.dumps(taken).decode() for taken in sorted(allocated_devices([obj]))]


SLICE_SPEC = Index("ResourceSlice", "spec", _slice_read)
CLAIM_DEVICES = Index("ResourceClaim", "allocated devices", _claim_devices)
"""What the device split reads of slices and claims: their index versions move when
that changes, not on a claim's labels or a slice's annotations."""

INDEXES = (NODE_LABEL, NODE_CLASS, SLICE_SPEC, CLAIM_DEVICES)

Split = dict[str, list[tuple[DeviceState | None, list[str]]]]
_splits: Memo[tuple[int, int, int, int, frozenset[str]], tuple[dict[str, DeviceState], Split]] = Memo(
    16, 32 * 2**20)


def _device_split(view: ClusterView, keys: frozenset[str]) -> tuple[dict[str, DeviceState], Split]:
    """Each node's DRA devices (projected on the attributes ``keys`` the pod's selectors
    read) and each node class split by them: computed again only when what it reads
    changes — a node's class or labels, a node added or removed, a ResourceSlice's spec,
    the devices claims hold (``view.index_version``) — not on a Node's status report or
    a claim's labels (issue 38: a resplit per Node write took GPU reviews to p99 588 ms)."""
    memo_key = (view.index_version(NODE_CLASS), view.index_version(NODE_LABEL),
                view.index_version(SLICE_SPEC), view.index_version(CLAIM_DEVICES), keys)
    found = _splits.get(memo_key)
    if found is not None:
        return found
    members: list[tuple[str, str, dict[str, Any]]] = []
    for key in view.index_counts(NODE_CLASS):
        for obj in view.by_index(NODE_CLASS, key):
            members.append((key, _name(obj), obj))

    def matcher(key: str, obj: dict[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
        """Built only for a slice that selects nodes (most name theirs)."""
        return lambda selector: node_selector_matches(selector, _own(class_node(key), obj))

    states = node_device_states(view.list("ResourceSlice"), view.list("ResourceClaim"),
                                ((name, matcher(key, obj)) for key, name, obj in members), keys)
    by: dict[str, dict[DeviceState | None, list[str]]] = {}
    for key, name, _ in members:
        by.setdefault(key, {}).setdefault(states.get(name), []).append(name)
    split: Split = {key: list(groups.items()) for key, groups in by.items()}
    return _splits.put(memo_key, (states, split))


def _groups(view: ClusterView, spec: dict[str, Any], reserve_cpu: int,
            reserve_memory: int, keys: frozenset[str] | None = None) -> Iterator[NodeGroup]:
    """The nodes to judge, built as ``place_pod`` asks for them: each node the pod mentions
    (a name in ``matchFields``, a per-node label value) on its own, then one stand-in per
    class for the rest (app.k8s.scheduling ``place_pod``). ``keys``: the pod asks for DRA
    devices (the attributes its selectors read): classes are split by their members'
    devices, and each node carries its own."""
    counts = view.index_counts(NODE_CLASS)
    states, split = _device_split(view, keys) if keys is not None else ({}, {})
    said = mentions(spec)
    if said.per_node:  # judge every node on its own
        for key in counts:
            stand_in = _class(key, reserve_cpu, reserve_memory)
            for obj in view.by_index(NODE_CLASS, key):
                node = _own(stand_in, obj)
                yield NodeGroup(replace(node, devices=states.get(node.name)) if keys is not None else node)
        return
    named: dict[str, dict[str, Any]] = {}
    for name in sorted(said.names):
        found = view.get("Node", name)
        if found is not None:
            named[name] = found
    for key, value in sorted(said.labels):
        for found in view.by_index(NODE_LABEL, f"{key}={value}"):
            named[_name(found)] = found
    taken: dict[str, int] = {}
    own: list[NodeGroup] = []
    for obj in named.values():
        if len(own) > MAX_NODE_GROUPS:
            break  # place_pod stops before the classes: what they hold no longer matters
        node_key = next(iter(_node_class(obj)), None)
        if node_key is None or node_key not in counts:
            continue  # not a node the rule judges (a quantity does not parse), or just added
        taken[node_key] = taken.get(node_key, 0) + 1
        node = _own(_class(node_key, reserve_cpu, reserve_memory), obj)
        own.append(NodeGroup(replace(node, devices=states.get(node.name)) if keys is not None else node))
    yield from own
    for key, count in counts.items():
        if keys is not None:
            stand_in = _class(key, reserve_cpu, reserve_memory)
            for state, names_of in split.get(key, ()):
                rest_names = [n for n in names_of if n not in named] if named else names_of
                if rest_names:
                    yield NodeGroup(replace(stand_in, devices=state), len(rest_names),
                                    partial(list, rest_names))
            continue
        rest = count - taken.get(key, 0)
        if rest <= 0:
            continue

        def names(key: str = key) -> list[str]:
            found = view.index_names(NODE_CLASS, key)
            return [n for n in found if n not in named] if named else found

        yield NodeGroup(_class(key, reserve_cpu, reserve_memory), rest, names)


_classes_memo: Memo[int, tuple[dict[str, DeviceClass], dict[str, str]]] = Memo(8, 8 * 2**20)


def _device_demand(subject: Subject, spec: dict[str, Any], view: ClusterView,
                   requests: Mapping[str, Decimal]) -> DeviceDemand:
    """What the pod asks of DRA devices (app/k8s/dra.py): its claims' requests, and each
    extended resource it requests that a DeviceClass maps."""
    if not view.count("DeviceClass"):
        return DeviceDemand()  # no class: no claim can be allocated, nothing is mapped
    version = view.version("DeviceClass")
    found = _classes_memo.get(version)
    if found is None:
        classes = device_classes(view.list("DeviceClass"))
        found = _classes_memo.put(version, (classes, extended_resource_classes(classes)))
    classes, mapped = found
    wanted = {name: mapped[name] for name, value in requests.items() if value > 0 and name in mapped}
    claims = pod_claim_requests(spec, subject.namespace,
                                lambda kind, name, ns: view.get(kind, name, ns), classes) \
        if spec.get("resourceClaims") else []
    return DeviceDemand(tuple(claims), {name: DeviceRequest(name, cls, classes[cls].selectors, resource=name)
                                        for name, cls in wanted.items()})


def _scheduled_spec(subject: Subject, spec: dict[str, Any], view: ClusterView,
                    policy: Policy) -> dict[str, Any]:
    """The pod spec the scheduler will see for a template's pods (app/k8s/podmodel.py ``admit``,
    checked by the pod-construction oracle): the DaemonSet controller's tolerations, then
    DefaultTolerationSeconds, ExtendedResourceToleration when the policy's
    ``admissionPlugins`` has it, and RuntimeClass admission (overhead, node selector,
    tolerations). A Pod reaches the webhook after those plugins: nothing to add then.
    Pods the RuntimeClass plugin refuses are judged as written (never created)."""
    if subject.kind == "Pod":
        return spec
    out = dict(spec)
    if subject.kind == "DaemonSet":
        daemon_tolerations(out)
    name = spec.get("runtimeClassName")
    runtime = view.get("RuntimeClass", name) if isinstance(name, str) and name else None
    admission = Admission(runtime_classes={name: runtime} if runtime is not None and isinstance(name, str)
                          else None, plugins=frozenset(policy.admission_plugins))
    admitted_spec, refused = admit(out, admission, limit_ranger=False)
    return admitted_spec if refused is None else out


DEFAULT_SCHEDULER = "default-scheduler"


def _decider(spec: dict[str, Any]) -> str:
    """Who places the pod: kube-scheduler, or only the kubelet's admission (a pod bound
    by ``spec.nodeName``, or placed by another scheduler such as KAI: whatever binds it,
    the kubelet admits it or fails it, ``pkg/kubelet/lifecycle/predicate.go``)."""
    name = spec.get("schedulerName")
    if spec.get("nodeName") or (name not in (None, "", DEFAULT_SCHEDULER)):
        return KUBELET
    return SCHEDULER




def _karpenter_pools(view: ClusterView) -> list[Mapping[str, Any]]:
    """Karpenter NodePools, filed by (group, kind) in every view (``app.k8s.kinds``):
    KAI's NodePools and a stale KAI NodePool watch never reach this rule."""
    return karpenter_pools(view.list(KARPENTER_NODEPOOL), [])


def _job_spec(subject: Subject, obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Job spec of a Job, or of a CronJob's Jobs (its ``jobTemplate``); None for the
    other kinds."""
    spec = obj.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    if subject.kind == "Job":
        return spec
    if subject.kind == "CronJob":
        template = spec.get("jobTemplate")
        inner = template.get("spec") if isinstance(template, Mapping) else None
        return inner if isinstance(inner, Mapping) else {}
    return None


def _gates(spec: Mapping[str, Any] | None) -> list[str]:
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    return [str(g.get("name")) for g in gates if isinstance(g, Mapping)] if isinstance(gates, list) else []


def _queued(subject: Subject, obj: dict[str, Any]) -> tuple[str, str] | None:
    """Why what ``pod-fits-node`` would refuse is only a warning: whoever will run or
    release the Pods places them after this write (class 7 of issue 37) —

    - a suspended Job (or a CronJob's Jobs created suspended) runs no Pod, and a queue
      controller such as Kueue writes its ResourceFlavor's node selectors and
      tolerations into the template when it admits and resumes it (allowed on a
      suspended Job that never started, ``AllowMutableSchedulingDirectives``);
    - Pods with ``schedulingGates`` are not scheduled until the gates are removed, and
      until then node selectors and required node affinity may still be added
      (pkg/apis/core/validation ``ValidatePodUpdate`` at v1.37.2: additions only on a
      gated Pod); an UPDATE of a Pod that was gated is judged the same way.

    (what, why): ``what`` leads the warning (the webhook's warnings are cut to 120
    characters, advice first), ``why`` ends it."""
    job = _job_spec(subject, obj)
    if job is not None and job.get("suspend") is True:
        return ("suspended Job", "it runs no Pod until it is resumed, and a queue controller "
                "(Kueue) may add node selectors and tolerations when it admits it")
    gates = _gates(pod_spec(subject, obj))
    if not gates and subject.kind == "Pod" and subject.operation == "UPDATE" \
            and isinstance(subject.old, dict):
        gates = _gates(subject.old.get("spec"))
    if gates:
        return (f"gated Pod ({', '.join(gates)})", "schedulingGates hold it: whoever removes them may "
                "still add node selectors or affinity")
    return None


def _placement(subject: Subject, obj: dict[str, Any]) -> Any:
    """What ``pod-fits-node`` judges of a Pod on UPDATE: its resources (in-place
    resize) and what may still move it — node selector, node affinity, tolerations and
    scheduling gates (mutable while the Pod is gated; tolerations may be added to any
    Pod). Templates: every write is judged (``pod_resources``)."""
    part = pod_resources(subject, obj)
    if part is None:
        return None
    spec = pod_spec(subject, obj) or {}
    affinity = spec.get("affinity")
    return (part, spec.get("nodeSelector"), affinity.get("nodeAffinity") if isinstance(affinity, Mapping)
            else None, spec.get("tolerations"), spec.get("schedulingGates"))


@rule("pod-fits-node", "validate", WORKLOAD_KINDS, Mode.ENFORCE,
      "each pod fits one node it may land on, on every resource at once (as kube-scheduler filters)",
      reads={"Node", KARPENTER_NODEPOOL, "RuntimeClass", *DRA_KINDS}, judges=_placement,
      ratchet=Ratchet.WARN, requires=well_formed)
def pod_fits_node(subject: Subject, obj: dict[str, Any], view: ClusterView,
                  policy: Policy) -> list[Finding]:
    """``_fits_node``, for the Pods this cluster runs: none for a Job (or a CronJob's
    Jobs) whose ``spec.managedBy`` names another controller — the Job controller skips
    it, and MultiKueue runs its Pods in a worker cluster, whose nodes are not these —
    and only warnings for Pods a queue controller or a scheduling gate still holds
    (``_queued``), with the same numbers."""
    job = _job_spec(subject, obj)
    if job is not None and managed_elsewhere(job):
        return []
    findings = _fits_node(subject, obj, view, policy)
    queued = _queued(subject, obj) if any(f.severity == "error" for f in findings) else None
    if queued is None:
        return findings
    what, why = queued
    return [warning(f.path, f"{what}, not refused: {f.message}; {why}") if f.severity == "error" else f
            for f in findings]


def _fits_node(subject: Subject, obj: dict[str, Any], view: ClusterView,
               policy: Policy) -> list[Finding]:
    """kube-scheduler's filters one node at a time (app/k8s/scheduling.py, checked against
    the real kube-scheduler by the scheduling oracle): schedulable, nodeSelector and
    required node affinity, NoSchedule/NoExecute taints vs tolerations, and the pod's
    effective request (sidecars, init containers, overhead, pod-level resources) on
    cpu, memory, ephemeral-storage and every extended resource, and the DRA devices its
    claims and its DeviceClass-mapped extended resources ask for (app/k8s/dra.py). Refused
    when no node takes it; the message names the closest node and what it lacks.

    A template's pods are judged as the RuntimeClass admission plugin and the DaemonSet
    controller make them (``_scheduled_spec``). A pod with ``spec.nodeName`` is judged on that
    node only, as the kubelet admits it; a pod for another scheduler (``schedulerName``,
    e.g. KAI's) by the kubelet's checks on every node (docs/fidelity.md). A DaemonSet whose
    selection takes no node makes no pod: never refused for that.

    Autoscaled clusters (class 10, app/crds/autoscaling.py): a pod no current node takes but
    a node the autoscaler can create would (``nodes.autoscaledShapes``, Karpenter
    NodePools in the view) gets a warning, never a refusal."""
    spec = pod_spec(subject, obj)
    settings = policy.nodes
    if spec is None or (view.count("Node") == 0 and not settings.autoscaled_shapes
                        and not _karpenter_pools(view)):
        return []  # no nodes known: nothing to judge against
    spec = _scheduled_spec(subject, spec, view, policy)
    decider = _decider(spec)
    reserve_cpu = clamp_quantity(parse_quantity(settings.reserve_cpu))
    reserve_memory = clamp_quantity(parse_quantity(settings.reserve_memory)) + clamp_quantity(
        parse_quantity(settings.sandbox_parent_reserve_memory))
    try:
        # A Pod arrives defaulted; a template's Pods will be (defaulting is idempotent).
        requests = effective_pod_requests({"spec": spec}) if subject.kind == "Pod" \
            else effective_pod_requests(spec, is_pod=False)
    except QuantityError:
        return []  # the quantities rule names the value that does not parse
    path = ".".join(POD_SPEC_PATHS[(subject.group, subject.kind)])
    bound = spec.get("nodeName")
    if isinstance(bound, str) and bound:
        return _bound_pod(spec, bound, view, requests, path, policy, int(reserve_cpu * 1000),
                          int(reserve_memory))
    devices = _device_demand(subject, spec, view, requests) if decider == SCHEDULER else DeviceDemand()
    keys = selector_references([*devices.claims, *devices.mapped.values()]) if devices else None
    groups = _groups(view, spec, int(reserve_cpu * 1000), int(reserve_memory), keys)
    verdict = place_pod(spec, groups, requests, MAX_NODE_GROUPS, name_closest=settings.name_in_messages,
                        decider=decider, devices=devices or None)
    if verdict.fits:
        return []
    if not verdict.complete:
        return [warning(path, f"pod-fits-node did not decide: the nodes come in more than "
                              f"{MAX_NODE_GROUPS} classes and none of the first "
                              f"{MAX_NODE_GROUPS} takes the pods")]
    if verdict.cordoned_only:
        return []  # a cordoned node would take it: maintenance, not a bad spec (docs/fidelity.md)
    if verdict.recovering:
        return [_waits_for_recovery(path, verdict)]
    closest = verdict.closest
    if closest is None and subject.kind == "DaemonSet" and verdict.count:
        return []  # its selection takes no node: the controller creates no pod at all
    by = "" if decider == SCHEDULER else \
        f" (schedulerName {spec.get('schedulerName')}: judged as the kubelet admits it)"
    pools = [pool_shape(p) for p in _karpenter_pools(view)]
    shapes = policy_nodes(settings.autoscaled_shapes, int(reserve_cpu * 1000), int(reserve_memory))
    new_node, why_not = scale_up(spec, requests, shapes=shapes, pools=pools,
                                 name_pools=settings.name_in_messages)
    if new_node is not None:
        maybe = (" if it gets the labels the pod selects (the NodePool allows several values)"
                 if new_node.uncertain else "")
        return [warning(path, f"fits no current node; would fit a node that {new_node.source} can "
                              f"create{maybe}: it waits for the autoscaler")]
    autoscaled = f"; no autoscaled node takes it either ({'; '.join(why_not)})" if why_not else ""
    if closest is None:
        if not verdict.count:
            return [error(path, f"no node exists and no node the autoscaler can create takes the "
                                f"pods{autoscaled}")]
        selector = spec.get("nodeSelector") or {}
        which = f"node matching nodeSelector {selector}" if selector else "node the pod may land on"
        return [error(path, f"no {which} is known; the pods cannot be placed "
                            f"({verdict.count} nodes: {'; '.join(verdict.reasons)}){autoscaled}{by}")]
    return [error(path, _no_room(closest, settings.name_in_messages, reserve_cpu, reserve_memory,
                                 "no node it may land on has room: the closest") + autoscaled + by)]


def _waits_for_recovery(path: str, verdict: PodPlacement) -> Finding:
    """No node takes the pods now, but some would once out of a state the node leaves on its
    own (app.k8s.scheduling ``LIFECYCLE_TAINT_KEYS``: not ready, unreachable, under pressure,
    cordoned): kube-scheduler leaves them Pending meanwhile, so this is not refused. The
    first clause says it all (a webhook warning keeps ~120 characters, app.k8s.util.brief)."""
    states = sorted({"cordoned" if r == CORDONED else
                     r.removeprefix("untolerated taint ").removeprefix("node.kubernetes.io/").split(":")[0]
                     for r in verdict.recovering})
    which = f" ({verdict.recovering_name} first)" if verdict.recovering_name else ""
    why = "; ".join(verdict.recovering)
    return warning(path, f"the pods wait, Pending, for {verdict.recovering_count} node(s) to recover from "
                         f"{', '.join(states)}{which}; no node takes them now ({why}), kube-scheduler "
                         f"places them once the node lifecycle controller lifts those taints")


def _no_room(closest: NodeVerdict, name_in_messages: bool, reserve_cpu: Decimal,
             reserve_memory: Decimal, lead: str) -> str:
    short = closest.shortfalls
    needs = " and ".join(f"{format_units(s.resource, s.requested)} {s.resource}" for s in short)
    offers = " and ".join(f"{format_units(s.resource, max(s.free, 0))} {s.resource}" for s in short)
    reserve = f"reserve {format_cpu(reserve_cpu)} cpu, {format_bytes(reserve_memory)} memory"
    where = node_reference(closest.node, name_in_messages, (s.resource for s in short))
    return f"each pod needs {needs}; {lead} ({where}) offers {offers} ({reserve})"


def _bound_pod(spec: dict[str, Any], node_name: str, view: ClusterView, requests: Mapping[str, Decimal],
               path: str, policy: Policy, reserve_cpu: int, reserve_memory: int) -> list[Finding]:
    """A pod bound by ``spec.nodeName`` (set by hand, or a scheduled Pod being resized):
    no scheduler places it; its node's kubelet admits it (``pkg/kubelet/lifecycle/
    predicate.go``: resources, node name, node affinity, NoExecute taints) or fails it.
    Judged on that node only; a node the view does not hold is not judged."""
    obj = view.get("Node", node_name)
    key = next(iter(_node_class(obj)), None) if obj is not None else None
    if obj is None or key is None:
        return []
    node = _own(_class(key, reserve_cpu, reserve_memory), obj)
    verdict = place_pod(spec, [NodeGroup(node)], requests, 1, decider=KUBELET,
                        name_closest=policy.nodes.name_in_messages)
    if verdict.fits:
        return []
    if verdict.recovering:
        return [_waits_for_recovery(f"{path}.nodeName", verdict)]
    closest = verdict.closest
    settings = policy.nodes
    where = node_reference(node, settings.name_in_messages)
    if closest is None:
        return [error(f"{path}.nodeName", f"the kubelet of node {where} (spec.nodeName) rejects the pod: "
                                          f"{'; '.join(verdict.reasons)}")]
    return [error(f"{path}.nodeName", _no_room(
        closest, settings.name_in_messages, Decimal(reserve_cpu) / 1000, Decimal(reserve_memory),
        "its node (spec.nodeName: the kubelet admits it, no scheduler) has no room:"))]


# --- namespace memory composition -------------------------------------------------

COUNTED_KINDS = ("Deployment", "StatefulSet", "ReplicaSet", "ReplicationController", "Job", "CronJob")
"""The workloads whose pods the namespace's memory quota is charged for. Bare Pods are
not read (the webhook would watch every Pod of the cluster): a Pod write is counted as
itself, against the workloads."""
_OWNER_OF = {"ReplicaSet": "Deployment", "Job": "CronJob"}
"""A child whose pods its controller's object is counted for (its controller owner)."""
_QUOTA_KEYS = {"requests.memory": "requests", "memory": "requests", "limits.memory": "limits"}
_SPEC_PATH = {kind: path for (_, kind), path in POD_SPEC_PATHS.items()}
"""Where each workload kind keeps its pod spec, by view name (the workload kinds' names
are unique)."""
_SEEN = (*COUNTED_KINDS, "LimitRange")
"""The kinds a namespace's sums are derived from: remembered until one of them changes in
that namespace (``view.version(kind, namespace)``)."""
_CLUSTER_SEEN = ("PriorityClass", "RuntimeClass")
"""The cluster-scoped kinds they are derived from too (the Pods' class and overhead, as
the Priority and RuntimeClass plugins write them): ``view.version(kind)``."""


def _counted_by_owner(view: ClusterView, kind: str, obj: Mapping[str, Any], namespace: str) -> bool:
    """Is this a ReplicaSet whose controller is a Deployment in the view (a Job, a
    CronJob)? Its pods are counted through that owner (the Deployment's replicas, one
    Job of the CronJob), not twice. An ownerReference is a claim anyone can write: it
    counts only when the owner exists (same name, and the same uid when both say one);
    a child that names a missing owner is counted itself."""
    parent = _OWNER_OF.get(kind)
    meta = obj.get("metadata")
    refs = meta.get("ownerReferences") if parent is not None and isinstance(meta, Mapping) else None
    for ref in refs if isinstance(refs, list) else []:
        if not (isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("kind") == parent
                and isinstance(ref.get("name"), str)):
            continue
        owner = view.get(str(parent), ref["name"], namespace)
        owner_meta = owner.get("metadata") if owner is not None else None
        uid = owner_meta.get("uid") if isinstance(owner_meta, Mapping) else None
        if owner is not None and (uid is None or ref.get("uid") is None or uid == ref.get("uid")):
            return True
    return False


@dataclass(frozen=True)
class _Pods:
    """One workload's pods as the quota counts them: how many at once, the pod spec as
    stored (LimitRanger's container defaults applied) and its memory per quota section
    (None: a quantity that does not parse — the quantities rule names it there)."""

    kind: str
    name: str
    count: int
    spec: Mapping[str, Any]
    memory: Mapping[str, Decimal | None]
    shared: bool = field(default=False, compare=False)
    """``spec`` is the stored object's own (no LimitRange default applied): the view
    holds it, a memo does not pay for it."""


def _admission(view: ClusterView, namespace: str, policy: Policy) -> Admission:
    """What the admission plugins before the webhook read for a Pod of ``namespace``
    (app/k8s/podmodel.py ``admit``): its LimitRanges (in the view's order; LimitRanger's own
    is a Go map's), the PriorityClasses and RuntimeClasses."""
    return Admission(view.list("LimitRange", namespace), view.list("PriorityClass"),
                     {_name(rc): rc for rc in view.list("RuntimeClass")},
                     frozenset(policy.admission_plugins))


def _charged_spec(spec: Mapping[str, Any], admission: Admission) -> Mapping[str, Any] | None:
    """The pod spec the quota sees: a Pod made from the template goes through the
    mutating admission plugins before the quota admission charges it (``admit``:
    LimitRanger's container defaults, the default PriorityClass its scopes read, the
    RuntimeClass's overhead it charges); None when the RuntimeClass plugin refuses it."""
    admitted_spec, refused = admit(spec, admission)
    return None if refused is not None else admitted_spec


def _amount(spec: Mapping[str, Any], section: str) -> Decimal | None:
    try:
        return clamp_quantity(pod_amount(dict(spec), "memory", section))
    except (TypeError, AttributeError, ValueError, QuantityError):
        return None  # the quantities rule names the value on its own object


def _pods_of(kind: str, name: str, obj: Mapping[str, Any], admission: Admission) -> _Pods | None:
    """None when the object's pods cannot be read (a pod spec of the wrong type: the
    quantities rule names it on that object) or it runs none."""
    node: Any = obj
    for key in _SPEC_PATH.get(kind, ()):
        node = node.get(key) if isinstance(node, Mapping) else None
    count = pods_at_once(kind, obj)
    if not isinstance(node, Mapping) or not count:
        return None
    try:
        spec = _charged_spec(node, admission)
    except (TypeError, AttributeError, ValueError, QuantityError):
        return None
    if spec is None:
        return None  # the RuntimeClass plugin refuses its Pods: none is charged
    return _Pods(kind, name, count, spec, {s: _amount(spec, s) for s in ("requests", "limits")},
                 shared=spec is node)


def _weigh_pods(key: object, pods: _Pods | None) -> int:
    """An entry of ``_derived``: its key and what it made, not the view's own pod spec."""
    if pods is None or not pods.shared:
        return footprint((key, pods))
    return footprint((key, pods.kind, pods.name, pods.memory)) + sys.getsizeof(pods)


DERIVED_BUDGET = 32 * 2**20
_derived: Memo[tuple[str, str, tuple[Any, ...], bytes], _Pods | None] = Memo(
    1 << 17, DERIVED_BUDGET, _weigh_pods)
"""Each stored object's pods, by its kind, name, the versions of what the admission
plugins read (the namespace's LimitRanges, the cluster's PriorityClasses and
RuntimeClasses, the policy's plugins) and the digest of what ``_pods_of`` reads
(``spec`` and ``status``): a namespace summed again after one change derives only what
changed, and an object changed in nothing read (an annotation patch) is found again.
Never keyed by identity: that kept every old version of a changed workload (issue 38:
48,000 annotation patches on the 30k cluster took RSS from 184 to 398 MiB)."""

_NOT_DERIVED: Any = object()
_pods: Memo[str, tuple[tuple[Any, ...], list[_Pods]]] = Memo(
    256, 16 * 2**20, lambda key, found: footprint((key, found[0])) + sys.getsizeof(found[1]) + sum(
        sys.getsizeof(p) for p in found[1]))
"""Each namespace's pods with the versions they were derived at: one entry per
namespace, replaced when it changes (an old state is never kept). The lists hold
``_derived``'s values (paid for there)."""


def _namespace_pods(view: ClusterView, namespace: str, policy: Policy) -> list[_Pods]:
    """Every counted workload of the namespace that runs pods, once per state of the
    kinds they are derived from in the namespace (``view.version(kind, namespace)``): an
    ``envelope check`` or an audit of every object reads the namespace once, not once
    per object, and the webhook again only after a change in that namespace."""
    versions = (*(view.version(k, namespace) for k in _SEEN),
                *(view.version(k) for k in _CLUSTER_SEEN), tuple(policy.admission_plugins))
    found = _pods.get(namespace)
    if found is not None and found[0] == versions:
        return found[1]
    admission = _admission(view, namespace, policy)
    ranges = (view.version("LimitRange", namespace), *(view.version(k) for k in _CLUSTER_SEEN),
              tuple(policy.admission_plugins))
    out = []
    for kind in COUNTED_KINDS:
        for w in view.list(kind, namespace):
            if _counted_by_owner(view, kind, w, namespace):
                continue
            name = _name(w)
            try:
                key = (kind, name, ranges, digest((w.get("spec"), w.get("status"))))
            except TypeError:  # not JSON (a YAML file's non-string keys): not remembered
                pods = _pods_of(kind, name, w, admission)
            else:
                pods = _derived.get(key, _NOT_DERIVED)
                if pods is _NOT_DERIVED:
                    pods = _derived.put(key, _pods_of(kind, name, w, admission))
            if pods is not None:
                out.append(pods)
    _pods.put(namespace, (versions, out))
    return out


_SHOWN = 16
"""How many of the largest shares a sum keeps for the message: an item is at least 13
characters (``a 1 x 1B = 1B``) and a separator, and the total's text follows, so at most
``110 // 15 = 7`` fit; 16 leaves room for the written object's stored copy, skipped."""


@dataclass(frozen=True)
class _Sum:
    """What one quota (a section, a scope) is charged for by the namespace's workloads:
    the total, each workload's share by (kind, name), how many there are, and the
    largest shares first (ties in the view's order) for the message."""

    total: Decimal
    share: dict[tuple[str, str], Decimal]
    count: int
    ranked: list[tuple[str, str, int, Decimal]]


_sums: Memo[tuple[str, str, str], tuple[tuple[Any, ...], _Sum]] = Memo(1024, 16 * 2**20)
"""Each namespace's sum per section and scope, with the versions it was made at: one
entry each, replaced when the namespace changes."""


def _matches(quota: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    try:
        return quota_matches_pod(quota, spec)
    except (TypeError, AttributeError, ValueError, QuantityError):
        return False


def _namespace_sum(view: ClusterView, namespace: str, quota: Mapping[str, Any], section: str,
                   policy: Policy) -> _Sum:
    """The pods of the namespace's workloads that ``quota`` counts (its scopes and
    scopeSelector, ``quota_matches_pod``, as the guards read them), summed once per
    namespace state, section and scope: linear in the workloads over a whole run."""
    scope = quota_scope_key(quota)
    key = (namespace, section, scope)
    versions = (*(view.version(k, namespace) for k in _SEEN),
                *(view.version(k) for k in _CLUSTER_SEEN), tuple(policy.admission_plugins))
    found = _sums.get(key)
    if found is not None and found[0] == versions:
        return found[1]
    share: dict[tuple[str, str], Decimal] = {}
    rows: list[tuple[str, str, int, Decimal]] = []
    unscoped = scope == "[]"  # no scope: every pod is counted
    for pods in _namespace_pods(view, namespace, policy):
        memory = pods.memory[section]
        if memory and (unscoped or _matches(quota, pods.spec)):
            share[(pods.kind, pods.name)] = pods.count * memory  # one object per kind and name
            rows.append((pods.kind, pods.name, pods.count, memory))
    # nlargest is sorted(..., reverse=True)[:n]: a stable sort's order, ties as listed
    ranked = heapq.nlargest(_SHOWN, rows, key=lambda r: r[2] * r[3])
    made = _Sum(sum(share.values(), Decimal(0)), share, len(rows), ranked)
    _sums.put(key, (versions, made))
    return made


def _breakdown(parts: Iterator[tuple[str, int, Decimal]], count: int, tail: str) -> str:
    """The largest shares first, as many as fit in ~110 characters, then ``+N more``."""
    shown: list[str] = []
    for name, n, m in parts:
        item = f"{name} {n} x {format_bytes(m)} = {format_bytes(n * m)}"
        if len(", ".join([*shown, item, tail])) > 110:
            break
        shown.append(item)
    if len(shown) < count:
        shown.append(f"+{count - len(shown)} more")
    return ", ".join([*shown, tail])


def _merged(ranked: list[tuple[str, str, int, Decimal]], skip: tuple[str, str] | None,
            mine: tuple[str, int, Decimal]) -> Iterator[tuple[str, int, Decimal]]:
    """The namespace's shares without the written object's stored copy, with the written
    object's own after those at least as large: the order of a stable sort of the
    shares with the written object appended, read lazily (the message needs a few)."""
    own = mine[1] * mine[2]
    placed = False
    for kind, name, n, m in ranked:
        if (kind, name) == skip:
            continue
        if not placed and n * m < own:
            placed = True
            yield mine
        yield name, n, m
    if not placed:
        yield mine


@rule("namespace-memory-composition", "validate", WORKLOAD_KINDS, Mode.WARN,
      "replicas x pod memory over the namespace's workloads fits its memory quota",
      reads={"ResourceQuota", "LimitRange", *_CLUSTER_SEEN, *COUNTED_KINDS}, judges=pod_resources,
      ratchet=Ratchet.WARN, requires=well_formed)
def namespace_memory_composition(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                 policy: Policy) -> list[Finding]:
    """The namespace as this write leaves it — its workloads' pods as their controllers
    run them (``pods_at_once``: Job concurrency, one Job per CronJob, a ReplicaSet or a
    Job counted through its existing owner) less the written object's stored copy
    (``AfterWrite.writes``), plus the written object's — against every memory quota that
    counts this write's pods. Each quota's sum is the namespace's, computed once per
    state of the view (``_namespace_sum``); a review costs a lookup and a short merge."""
    quotas = [(q, key, value) for q in view.list("ResourceQuota", subject.namespace)
              for key, value in quota_hard(q).items() if key in _QUOTA_KEYS]
    if not quotas or _counted_by_owner(view, subject.kind, obj, subject.namespace):
        return []  # no memory quota; or a child whose owner's write counts its pods
    mine = _pods_of(subject.kind, subject.name, obj, _admission(view, subject.namespace, policy))
    if mine is None:
        return []  # this write runs no pods (a DaemonSet, a suspended Job): nothing it adds
    name = subject.name or "(this)"
    after = AfterWrite(view, subject.kind, subject.name, obj, namespace=subject.namespace)
    findings = []
    for quota, key, hard in quotas:
        section = _QUOTA_KEYS[key]
        amount = mine.memory[section]
        try:
            limit = parse_quantity(hard)
        except QuantityError:
            continue  # the quota's own write was refused for it
        if not amount or not _matches(quota, mine.spec):
            continue  # this write's pods are not charged to this quota
        charged = _namespace_sum(view, subject.namespace, quota, section, policy)
        stored = (subject.kind, subject.name)
        skip = stored if stored in charged.share and after.writes(*stored, subject.namespace) else None
        total = charged.total - (charged.share[skip] if skip else 0) + mine.count * amount
        if total <= limit:
            continue
        count = charged.count - (1 if skip else 0) + 1
        tail = f"total {format_bytes(total)} > quota {_name(quota)} {key} {hard}"
        parts = _merged(charged.ranked, skip, (name, mine.count, amount))
        findings.append(error("metadata.namespace", _breakdown(parts, count, tail)))
    return findings
