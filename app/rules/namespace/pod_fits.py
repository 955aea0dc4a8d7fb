"""``pod-fits-node``: each pod fits one node it may land on, on every resource at once, as
kube-scheduler filters (or the kubelet admits a bound pod), with a message that names the
closest node and what it lacks.

The nodes come grouped from ``node_groups.py``, the filters from ``app/k8s/scheduling.py``,
the pod as the admission plugins make it from ``app/k8s/podmodel.py``, and autoscaled
shapes from ``app/crds/autoscaling.py``; what it decides and what it leaves to a warning is
in docs/rules/pod-fits-node.md and docs/fidelity.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.crds.autoscaling import KARPENTER_NODEPOOL, karpenter_pools, policy_nodes, pool_shape, scale_up
from app.k8s.defaulting import effective_pod_requests
from app.k8s.disclosure import node_reference
from app.k8s.dra import (
    DeviceClass,
    DeviceRequest,
    device_classes,
    extended_resource_classes,
    pod_claim_requests,
    selector_references,
)
from app.k8s.namespace_policy import managed_elsewhere
from app.k8s.podmodel import Admission, admit, daemon_tolerations
from app.k8s.podspec import POD_SPEC_PATHS, WORKLOAD_KINDS, pod_resources, pod_spec, well_formed
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
    place_pod,
)
from app.k8s.util import Memo
from app.rules.base import Finding, Ratchet, Subject, error, rule, warning
from app.rules.namespace.node_groups import (
    DRA_KINDS,
    MAX_NODE_GROUPS,
    as_member,
    class_stand_in,
    node_class,
    node_groups,
)

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


def _devices_unknown(view: ClusterView, path: str, requests: Mapping[str, Decimal]
                     ) -> tuple[DeviceDemand, dict[str, Decimal], list[Finding]]:
    """Files with Nodes and no ResourceSlice say nothing of the nodes' devices: judged as
    nodes without any, every DRA pod was refused and the message blamed whichever node
    came closest on cpu and memory (issue 37). The devices (and the extended resources
    DeviceClasses map) are left out and said "not evaluated". A cluster with no slices
    is different: kube-scheduler refuses there (e2e/test_oracle_dra.py), and so does
    this rule, a cluster's view being never partial."""
    mapped = _classes_memo.get(view.version("DeviceClass"))
    kept = {name: value for name, value in requests.items() if mapped is None or name not in mapped[1]}
    return DeviceDemand(), kept, [warning(
        path, "not evaluated: the pods ask for DRA devices and the input holds no "
              "ResourceSlice, so no node's devices were judged (cpu, memory and the rest "
              "were); add the ResourceSlices (kubectl get resourceslices -o yaml) or check "
              "against the cluster (--kubeconfig) to judge them")]


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
    node only, as the kubelet admits it; a pod for another scheduler (``schedulerName``)
    by the kubelet's checks on every node (docs/fidelity.md). A DaemonSet whose selection
    takes no node makes no pod; a pod only an autoscaler's node would take: a warning."""
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
    unjudged: list[Finding] = []
    if devices and not view.count("ResourceSlice") and view.partial("ResourceSlice"):
        devices, requests, unjudged = _devices_unknown(view, path, requests)
    keys = selector_references([*devices.claims, *devices.mapped.values()]) if devices else None
    groups = node_groups(view, spec, int(reserve_cpu * 1000), int(reserve_memory), keys)
    verdict = place_pod(spec, groups, requests, MAX_NODE_GROUPS, name_closest=settings.name_in_messages,
                        decider=decider, devices=devices or None)
    if verdict.fits:
        return unjudged
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
    return _no_fit(spec, requests, view, policy, verdict, path, by, reserve_cpu, reserve_memory)


def _no_fit(spec: dict[str, Any], requests: Mapping[str, Decimal], view: ClusterView, policy: Policy,
            verdict: PodPlacement, path: str, by: str, reserve_cpu: Decimal,
            reserve_memory: Decimal) -> list[Finding]:
    """No current node takes the pods: a warning when a node the autoscaler can create
    would (``scale_up``), else the refusal, naming the closest node and what it lacks
    (``by``: who places the pods, when not kube-scheduler)."""
    settings = policy.nodes
    closest = verdict.closest
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
    key = next(iter(node_class(obj)), None) if obj is not None else None
    if obj is None or key is None:
        return []
    node = as_member(class_stand_in(key, reserve_cpu, reserve_memory), obj)
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
