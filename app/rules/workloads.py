"""Workload envelopes: strip CPU limits, keep memory request == limit.

Applies to Pods and every kind that carries a pod template (where each kind keeps
it, and the helpers that read it: ``app/k8s/podspec.py``). Each rule is a pure
function ``(subject, obj, view, policy) -> findings``; mutating rules change
``obj`` (a copy the engine owns) and report what they changed.

Why one module of ~470 lines: the six rules of one family and the string-envelope
helpers only two of them use; the pod-spec helpers every workload rule reads are
``app/k8s/podspec.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.defaulting import apply_limit_range_defaults, default_pod, limit_range_default
from app.k8s.envexpand import EnvValue, container_env, references
from app.k8s.podspec import (
    POD_SPEC_PATHS,
    WORKLOAD_KINDS,
    compared_by_controller,
    containers,
    held_on_update,
    holders,
    pod_resources,
    pod_spec,
    pod_template,
    qos_class,
    shape_problems,
    spec_text,
    stored_qos,
    template_part,
    well_formed,
    with_pod_spec,
)
from app.k8s.quantity import QuantityError, format_bytes, parse_quantity
from app.k8s.util import cut, dig, dotted, shown
from app.rules.base import Finding, KindUpdates, Ratchet, Subject, change, error, rule, warning
from app.rules.envelope import (
    EnvelopeString,
    PairError,
    compare_quantities,
    is_integer_cpu,
    move_cpu_limit_to_request,
    move_pod_level_cpu_limit,
    parse_envelope_string,
    without_written_cpu,
)

__all__ = ["COPIERS", "CPU_LIMIT_RULES", "UPDATES", "keeps_cpu_limit", "memory_below_limit_applies"]

CPU_LIMIT_RULES = frozenset({"cpu-limits", "env-envelope-cpu"})
"""The rules that remove CPU limits: what a namespace guard holds back (namespace/cpu_limits.py)."""

_WRITTEN_LIMIT = 200
"""How much of an env value as written a message shows (a string envelope is tens of
characters; the rest is cut, with its length)."""
def keeps_cpu_limit(subject: Subject, obj: dict[str, Any], policy: Policy) -> bool:
    """The opt-out annotation on the object or its pod template."""
    spec_path = POD_SPEC_PATHS[(subject.group, subject.kind)]
    places = [("metadata",), (*spec_path[:-1], "metadata")]
    for place in places:
        annotations = dig(obj, (*place, "annotations"))
        if isinstance(annotations, dict):
            value = annotations.get(policy.opt_out_annotation)
            if isinstance(value, str) and value.strip().lower() == "true":
                return True
    return False


_TEMPLATED_KINDS = WORKLOAD_KINDS - {("", "Pod")}


def _carried(policy: Policy) -> list[str]:
    """The annotations a workload's own metadata may carry for its Pods: the opt-out, and
    the exemption annotation where objects may exempt themselves."""
    return [policy.opt_out_annotation,
            *([policy.exempt_annotation] if policy.allow_object_exemptions else [])]


@rule("template-opt-outs", "mutate", _TEMPLATED_KINDS, Mode.ENFORCE,
      "a workload's opt-out and exemption annotations are copied to its pod template, so "
      "its Pods carry them", order=1)
def template_opt_outs(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """A controller gives its Pods the pod template's annotations only (ReplicaSet,
    StatefulSet, DaemonSet, Job controllers: ``GetPodFromTemplate`` in
    pkg/controller/controller_utils.go at v1.37.2; a Deployment's Pods through its
    ReplicaSet, a CronJob's through its Job), so ``keep-cpu-limit`` or ``exempt`` on the
    workload's own metadata would stop at the Pod webhook. Each one the template does not
    have is copied there, value as written (a template that has its own value keeps it).
    A CronJob's also go to its ``jobTemplate.metadata``: the cronjob controller gives its
    Jobs those annotations (``getJobFromTemplate2``, pkg/controller/cronjob/utils.go), and
    the Job is itself judged (an exemption is read from the object's own metadata).
    The opt-out is copied only when it says ``"true"``; an exemption of no rule is not."""
    own = dig(obj, ("metadata", "annotations"))
    if pod_template(subject, obj) is None or not isinstance(own, dict):
        return []
    carried: dict[str, str] = {}
    for key in _carried(policy):
        value = own.get(key)
        if not isinstance(value, str):
            continue
        if key == policy.opt_out_annotation and value.strip().lower() != "true":
            continue
        if key != policy.opt_out_annotation and not value.replace(",", "").strip():
            continue
        carried[key] = value
    if not carried:
        return []
    places = [POD_SPEC_PATHS[(subject.group, subject.kind)][:-1]]
    if subject.kind == "CronJob":
        places.insert(0, ("spec", "jobTemplate"))
    findings = []
    for place in places:
        holder = dig(obj, place)  # a copy the copier made (it copies every dict on the path)
        meta = holder.get("metadata") if isinstance(holder, dict) else None
        theirs = meta.get("annotations") if isinstance(meta, dict) else None
        if not isinstance(holder, dict) or (meta is not None and not isinstance(meta, dict)) or \
                (theirs is not None and not isinstance(theirs, dict)):
            continue
        added = {k: v for k, v in carried.items() if not (theirs and k in theirs)}
        if not added:
            continue
        # copy-on-write: the copier shares the metadata with the admitted object
        holder["metadata"] = {**(meta or {}), "annotations": {**(theirs or {}), **added}}
        what = "job template, so the Jobs it makes carry it" if place == ("spec", "jobTemplate") \
            else "pod template, so the Pods it makes carry it"
        findings += [change(f"{'.'.join(place)}.metadata.annotations",
                            f"{key}: {shown(value)} copied from the {subject.kind}'s metadata to "
                            f"its {what}")
                     for key, value in added.items()]
    return findings


def _parses(value: object) -> bool:
    try:
        parse_quantity(value)
    except QuantityError:
        return False
    return True


def _guaranteed_with_whole_cores(subject: Subject, obj: dict[str, Any]) -> bool:
    """Guaranteed QoS with whole cores: what the CPU manager's static policy pins
    exclusive cores for, and stripping CPU limits loses. The QoS class is upstream's
    (``pkg/apis/core/v1/helper/qos/qos.go`` ``ComputePodQOS`` at v1.37.2): with pod-level
    resources set (cpu or memory in ``spec.resources``), the pod-level requests and limits
    as the API server defaults them decide alone (cpu and memory limits, requests equal,
    a whole-core CPU); otherwise every container needs cpu and memory limits with
    requests equal or unset, and one of them a whole-core CPU request."""
    spec = pod_spec(subject, obj)
    pod_level = spec.get("resources") if spec is not None else None
    if spec is not None and isinstance(pod_level, dict) and any(
            isinstance(pod_level.get(section), dict) and
            ("cpu" in pod_level[section] or "memory" in pod_level[section])
            for section in ("requests", "limits")):
        return _pod_level_guaranteed_whole(spec)
    found = list(containers(subject, obj))
    if not found:
        return False
    whole = False
    for _, _, container in found:
        resources = container.get("resources")
        if not isinstance(resources, dict):
            return False
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        for name in ("cpu", "memory"):
            if name not in limits:
                return False
            if name in requests and compare_quantities(requests[name], limits[name]) != 0:
                return False
        whole = whole or is_integer_cpu(requests.get("cpu", limits["cpu"]))
    return whole


def _pod_level_guaranteed_whole(spec: dict[str, Any]) -> bool:
    """``requirementsQOS`` of the pod-level resources of the Pod made from ``spec``
    (defaulted: a missing pod-level request is the containers' sum or the limit)."""
    try:
        resources = default_pod({"spec": spec})["spec"].get("resources") or {}
        requests = resources.get("requests") or {}
        limits = resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name not in limits or name not in requests:
                return False
            if compare_quantities(requests[name], limits[name]) != 0 or \
                    parse_quantity(limits[name]) == 0:
                return False
    except QuantityError:
        return False
    return is_integer_cpu(limits["cpu"])


@rule("cpu-limits", "mutate", WORKLOAD_KINDS, Mode.ENFORCE,
      "remove CPU limits; keep the CPU request they implied", judges=pod_resources, requires=well_formed)
def strip_cpu_limits(subject: Subject, obj: dict[str, Any], view: ClusterView,
                     policy: Policy) -> list[Finding]:
    """On a ``pods/resize`` only a CPU limit the resize adds is removed: one the Pod
    already has stays, as the API server refuses a resize that removes a limit
    (``validateContainerResize``, pkg/apis/core/validation/validation.go at v1.37.2).
    Removing an added limit keeps the Pod's QoS class: the container keeps its CPU
    request, so a Burstable Pod stays Burstable (a resize that would change the class
    is refused with or without Envelope)."""
    if keeps_cpu_limit(subject, obj, policy):
        return []
    resize = subject.subresource == "resize" and isinstance(subject.old, dict)
    had = {h.path for h in holders(subject, subject.old)  # the blocks that have a CPU limit
           if isinstance(h.resources.get("limits"), dict) and "cpu" in h.resources["limits"]} \
        if resize and subject.old is not None else set()
    qos_lost = not resize and _guaranteed_with_whole_cores(subject, obj)
    findings = []
    for holder in holders(subject, obj):
        limits = holder.resources.get("limits")
        limit = limits.get("cpu") if isinstance(limits, dict) else None
        if limit is not None and not _parses(limit):
            continue  # left where it was written; the quantities rule names it
        if holder.path in had:
            continue  # a resize cannot remove a limit the Pod has
        if holder.container is None:
            # Pod level: the request the API server would have defaulted, not the limit.
            pod_moved = move_pod_level_cpu_limit(pod_spec(subject, obj) or {})
            if pod_moved is None:
                continue
            value, request = pod_moved
            text = f"{holder.label}: CPU limit {value} removed"
            if request is not None:
                text += f"; CPU request set to {request} (what the pods would get) so they keep it"
            findings.append(change(f"{holder.path}.limits.cpu", text))
            continue
        moved = move_cpu_limit_to_request(holder.resources)
        if moved is None:
            continue
        value, wrote_request = moved
        text = f"{holder.label}: CPU limit {value} removed"
        if wrote_request:
            text += f"; CPU request set to {value} so the pods keep it"
        findings.append(change(f"{holder.path}.limits.cpu", text))
    if findings and qos_lost:
        findings.append(warning(
            dotted(POD_SPEC_PATHS[(subject.group, subject.kind)]),
            f"pods become Burstable, losing exclusive cores; to keep them: "
            f'{policy.opt_out_annotation}: "true"'))
    return findings


@rule("memory-limit", "mutate", WORKLOAD_KINDS, Mode.ENFORCE,
      "a memory request without a limit gets a limit equal to it", judges=pod_resources, requires=well_formed)
def fill_memory_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                      policy: Policy) -> list[Finding]:
    """Only a memory request: write the limit equal to it (memory is not borrowable).

    On a ``pods/resize`` the limit is written only in a resources block the resize
    changes (touching another one can make the API server refuse the resize: a plain
    init container's resources need ``InPlacePodVerticalScalingInitContainers`` on the
    node), and only when the Pod keeps its QoS class (``ValidatePodResize`` refuses a
    resize that changes it; adding memory limits can make a Burstable Pod Guaranteed):
    otherwise the resize passes as written, with a warning."""
    findings = []
    filled: list[tuple[dict[str, Any], bool]] = []
    resize = subject.subresource == "resize" and isinstance(subject.old, dict)
    before_limit = _pod_memory_limit(pod_spec(subject, obj) or {})
    stored = {h.path: h.resources for h in holders(subject, subject.old)} \
        if resize and subject.old is not None else {}
    for holder in holders(subject, obj):
        requests = holder.resources.get("requests")
        if not isinstance(requests, dict) or "memory" not in requests:
            continue
        if resize and stored.get(holder.path) == holder.resources:
            continue  # not resized: a plain init container may not be, on most nodes
        limits = holder.resources.get("limits")
        if isinstance(limits, dict) and "memory" in limits:
            continue
        created = not isinstance(limits, dict)
        if created:
            limits = holder.resources["limits"] = {}
        assert isinstance(limits, dict)
        limits["memory"] = requests["memory"]
        filled.append((holder.resources, created))
        findings.append(change(f"{holder.path}.limits.memory",
                              f"{holder.label}: memory limit set to the request "
                                f"{requests['memory']}"))
    if filled and not resize:
        findings += _memory_volumes_over_limit(subject, obj, before_limit)
    if filled and resize and subject.old is not None:
        try:
            before, after = stored_qos(subject.old), qos_class(pod_spec(subject, obj) or {})
        except QuantityError:
            before = after = ""  # the quantities rule names the value
        if before != after:
            for resources, created in filled:
                if created:
                    del resources["limits"]
                else:
                    del resources["limits"]["memory"]
            return [warning(f"{spec_text(subject)}.containers",
                            f"memory limits not set to the requests: the Pod would become "
                            f"{after} (it is {before}), and a resize cannot change the QoS "
                            f"class; set equal memory limits when the Pod is next created")]
    return findings


def memory_below_limit_applies(subject: Subject, view: ClusterView, policy: Policy) -> bool:
    """Whether ``policy.memoryBelowLimit`` selects the subject's namespace: every condition
    given holds (``namespaces``, ``"*"`` for any; ``namespaceSelector`` on the Namespace's
    labels, an unknown namespace matching none)."""
    choice = policy.memory_below_limit
    if choice is None:
        return False
    if choice.namespaces and "*" not in choice.namespaces and \
            subject.namespace not in choice.namespaces:
        return False
    if choice.namespace_selector is not None:
        namespace = view.get("Namespace", subject.namespace) if subject.namespace else None
        labels = dig(namespace, ("metadata", "labels")) if namespace is not None else None
        if not isinstance(labels, dict) or not choice.namespace_selector.matches(
                {str(k): str(v) for k, v in labels.items()}):
            return False
    return True


@rule("memory-below-limit", "mutate", WORKLOAD_KINDS, Mode.ENFORCE,
      "where the policy's memoryBelowLimit selects the namespace, a memory request below its "
      "limit is raised to it (or the limit lowered to it)",
      judges=pod_resources, requires=well_formed, announces=True,
      where=memory_below_limit_applies)
def memory_below_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                       policy: Policy) -> list[Finding]:
    """``memory-request-equals-limit``'s fix, at admission, for stacks the platform does
    not own: in every resources block (init containers, sidecars, containers, pod level)
    with a memory request below its memory limit, the request becomes the limit
    (``raise-request``) or the limit the request (``lower-limit``). A pod-level memory
    limit without a request (the API server would default the request to the containers'
    sum) gets the request equal to the limit when raising. A request above its limit is
    left to the API server, which refuses it. Nothing on a ``pods/resize`` (a resize must
    not change the QoS class; the validating rule ratchets what the Pod had)."""
    choice = policy.memory_below_limit
    if choice is None or subject.subresource == "resize":
        return []  # the engine asked memory_below_limit_applies for the namespace
    raising = choice.action == "raise-request"
    findings = []
    for holder in holders(subject, obj):
        requests = holder.resources.get("requests")
        limits = holder.resources.get("limits")
        if not isinstance(limits, dict) or "memory" not in limits:
            continue
        limit = limits["memory"]
        request = requests.get("memory") if isinstance(requests, dict) else None
        try:
            if request is None:
                if holder.container is not None or not raising:
                    continue  # a container's request defaults to its limit
                defaulted = (dig(default_pod({"spec": pod_spec(subject, obj) or {}}),
                                 ("spec", "resources", "requests", "memory")))
                if defaulted is None or compare_quantities(defaulted, limit) == 0:
                    continue
                request_amount = parse_quantity(defaulted)
            else:
                if compare_quantities(request, limit) >= 0:
                    continue  # equal, or above: the API server refuses that
                request_amount = parse_quantity(request)
            gap = format_bytes(parse_quantity(limit) - request_amount)
        except QuantityError:
            continue  # the quantities rule names the value
        shown_request = request if request is not None else \
            f"{format_bytes(request_amount)} (the containers' sum the API server defaults)"
        if raising:
            if not isinstance(requests, dict):
                requests = holder.resources["requests"] = {}
            requests["memory"] = limit
            findings.append(change(
                f"{holder.path}.requests.memory",
                f"{holder.label}: memory request raised from {shown_request} to {limit} "
                f"(+{gap}) to equal its limit (policy memoryBelowLimit; "
                f"memory-request-equals-limit)"))
        else:
            assert isinstance(requests, dict)
            limits["memory"] = request
            findings.append(change(
                f"{holder.path}.limits.memory",
                f"{holder.label}: memory limit lowered from {limit} to {request} (-{gap}) to "
                f"equal its request (policy memoryBelowLimit; memory-request-equals-limit)"))
    return findings


def _memory_limit(container: Any) -> Decimal | None:
    value = dig(container, ("resources", "limits", "memory"))
    if value is None:
        return None
    amount = parse_quantity(value)
    return amount if amount > 0 else None


def _pod_memory_limit(spec: dict[str, Any]) -> Decimal | None:
    """The memory limit of the Pod's cgroup as the kubelet sets it
    (``pkg/kubelet/cm/helpers_linux.go`` ``ResourceConfigForPod`` at v1.37.2, lines
    180-252, through ``resourcehelper.PodLimits``): the pod-level limit when set; else,
    when every container and init container has one (``memoryLimitsDeclared``), the
    larger of the containers' and restartable sidecars' sum and each plain init
    container's limit plus the sidecars started before it; else None (unbounded).
    None too when a quantity does not parse (the quantities rule names it)."""
    try:
        pod_level = dig(spec, ("resources", "limits", "memory"))
        if pod_level is not None:
            amount = parse_quantity(pod_level)
            return amount if amount > 0 else None
        regular = spec.get("containers")
        inits = spec.get("initContainers")
        total, sidecars, peak = Decimal(0), Decimal(0), Decimal(0)
        for c in inits if isinstance(inits, list) else []:
            limit = _memory_limit(c)
            if limit is None:
                return None  # memoryLimitsDeclared is false: no pod memory limit
            if isinstance(c, dict) and c.get("restartPolicy") == "Always":
                sidecars += limit
            else:
                peak = max(peak, limit + sidecars)
        for c in regular if isinstance(regular, list) else []:
            limit = _memory_limit(c)
            if limit is None:
                return None
            total += limit
        return max(total + sidecars, peak)
    except QuantityError:
        return None


def _memory_volumes_over_limit(subject: Subject, obj: dict[str, Any],
                               before: Decimal | None) -> list[Finding]:
    """A memory-backed ``emptyDir`` whose ``sizeLimit`` the pod memory limit Envelope's
    limits make smaller: the kubelet sizes the tmpfs at the smallest of the sizeLimit, the
    pod's memory limit and the node's allocatable memory
    (``pkg/volume/emptydir/empty_dir.go`` ``calculateEmptyDirMemorySize`` at v1.37.2;
    the field's own doc in ``k8s.io/api`` ``EmptyDirVolumeSource.SizeLimit``), and its
    pages count against the pod's memory cgroup. vLLM's 20Gi ``/dev/shm`` with a 16Gi
    request silently becomes 16Gi (issue 37)."""
    spec = pod_spec(subject, obj) or {}
    after = _pod_memory_limit(spec)
    volumes = spec.get("volumes")
    if after is None or not isinstance(volumes, list):
        return []
    out = []
    for i, volume in enumerate(volumes):
        empty_dir = volume.get("emptyDir") if isinstance(volume, dict) else None
        if not isinstance(empty_dir, dict) or empty_dir.get("medium") != "Memory":
            continue
        try:
            size = parse_quantity(empty_dir.get("sizeLimit")) \
                if empty_dir.get("sizeLimit") is not None else None
        except QuantityError:
            continue
        if size is None or size <= after or (before is not None and before < size):
            continue  # no size asked, it fits, or the written limits already capped it
        out.append(warning(
            f"{spec_text(subject)}.volumes[{i}].emptyDir.sizeLimit",
            f'volume "{volume.get("name")}" (emptyDir, medium Memory): sizeLimit '
            f"{format_bytes(size)} > pod memory limit {format_bytes(after)} set from the "
            f"requests; the tmpfs holds at most {format_bytes(after)}: raise the memory "
            f"request by what the volume holds, or lower sizeLimit"))
    return out


_DOWNWARD_CPU_LIMIT = "limits.cpu"


@dataclass(frozen=True)
class _CpuLimitRead:
    """One ``resourceFieldRef`` on ``limits.cpu``: where it is, who reads it, of which
    container, with which divisor."""

    path: str
    reader: str
    target: str
    divisor: object


def _cpu_limit_reads(spec: dict[str, Any], base: str) -> Iterator[_CpuLimitRead]:
    """Every ``resourceFieldRef: {resource: limits.cpu}``: env ``valueFrom`` of any
    container (its own limit unless ``containerName`` names another), ``downwardAPI``
    volume items and ``projected`` volumes' ``downwardAPI`` sources (``containerName``
    required there)."""
    for field, word in (("initContainers", "initContainer"), ("containers", "container")):
        items = spec.get(field)
        for i, c in enumerate(items if isinstance(items, list) else []):
            if not isinstance(c, dict) or not isinstance(c.get("env"), list):
                continue
            for j, var in enumerate(c["env"]):
                ref = dig(var, ("valueFrom", "resourceFieldRef"))
                if isinstance(ref, dict) and ref.get("resource") == _DOWNWARD_CPU_LIMIT:
                    target = ref.get("containerName") or c.get("name")
                    yield _CpuLimitRead(f"{base}.{field}[{i}].env[{j}].valueFrom.resourceFieldRef",
                                        f'{word} "{c.get("name")}" env {var.get("name")}',
                                        str(target), ref.get("divisor"))
    volumes = spec.get("volumes")
    for v, volume in enumerate(volumes if isinstance(volumes, list) else []):
        if not isinstance(volume, dict):
            continue
        lists: list[tuple[str, Any]] = [(f"{base}.volumes[{v}].downwardAPI.items",
                                         dig(volume, ("downwardAPI", "items")))]
        sources = dig(volume, ("projected", "sources"))
        for k, source in enumerate(sources if isinstance(sources, list) else []):
            lists.append((f"{base}.volumes[{v}].projected.sources[{k}].downwardAPI.items",
                          dig(source, ("downwardAPI", "items"))))
        for where, entries in lists:
            for n, entry in enumerate(entries if isinstance(entries, list) else []):
                ref = entry.get("resourceFieldRef") if isinstance(entry, dict) else None
                if isinstance(ref, dict) and ref.get("resource") == _DOWNWARD_CPU_LIMIT:
                    yield _CpuLimitRead(f"{where}[{n}].resourceFieldRef",
                                        f'volume "{volume.get("name")}" file {entry.get("path")}',
                                        str(ref.get("containerName")), ref.get("divisor"))


def _named_container(spec: dict[str, Any], name: str) -> dict[str, Any] | None:
    """``findContainerInPod``: containers first, then init containers."""
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        for c in items if isinstance(items, list) else []:
            if isinstance(c, dict) and c.get("name") == name:
                return c
    return None


def _downward_value(spec: dict[str, Any], target: str, section: str, divisor: object) -> str | None:
    """What the container reads for ``<section>.cpu`` of ``target``: the kubelet's
    ``defaultPodLimitsForDownwardAPI`` (``pkg/kubelet/kubelet_resources.go``: a container
    without a CPU limit reads the pod-level CPU limit when there is one, else the node's
    allocatable CPU; None then) and ``convertResourceCPUToString``
    (``pkg/api/v1/resource/helpers.go``: the ceiling of value / divisor, divisor 1 when
    unset or zero)."""
    container = _named_container(spec, target)
    if container is None:
        return None
    value = dig(container, ("resources", section, "cpu"))
    if value is None and section == "limits":
        value = dig(spec, ("resources", "limits", "cpu"))
    if value is None and section == "requests":
        value = dig(container, ("resources", "limits", "cpu"))
    try:
        amount = parse_quantity(value) if value is not None else None
        if amount is None or (section == "limits" and amount == 0):
            return None
        scale = parse_quantity(divisor) if divisor not in (None, "", 0) else 1
        scale = scale or 1
    except QuantityError:
        return None
    return format((amount / scale).to_integral_value(rounding=ROUND_CEILING), "f")


def _per(divisor: object) -> str:
    try:
        plain = divisor in (None, "") or parse_quantity(divisor) in (0, 1)
    except QuantityError:
        plain = False
    return "" if plain else f" (divisor {shown(str(divisor))})"


@rule("downward-cpu-limit", "mutate", WORKLOAD_KINDS, Mode.WARN,
      "a container reading its CPU limit through the downward API reads the node's CPU once it is stripped",
      mutates=False, order=110, reads={"LimitRange"}, judges=pod_resources, requires=well_formed)
def downward_cpu_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                       policy: Policy) -> list[Finding]:
    """Runs after ``cpu-limits`` and compares the object as written with the object as
    stripped (so it says nothing when the limit is kept: opt-out, a namespace guard, the
    rule off or warning). A ``resourceFieldRef`` on ``limits.cpu`` (GOMAXPROCS, worker
    counts) read the limit; without one the kubelet gives the pod-level CPU limit, else
    the node's allocatable CPU (``pkg/kubelet/kubelet_resources.go``
    ``defaultPodLimitsForDownwardAPI``): a program sized to 2 cores sizes itself to 64."""
    written = pod_spec(subject, subject.obj or {})
    stripped = pod_spec(subject, obj)
    if written is None or stripped is None or written is stripped:
        return []
    reads = list(_cpu_limit_reads(stripped, spec_text(subject)))
    if not reads:
        return []
    # The Pods get LimitRanger's default limits where none is left (for a Pod, again on
    # reinvocation): a LimitRange default.cpu (or max.cpu) is what the program then reads.
    limit_ranges = view.list("LimitRange", subject.namespace) if subject.namespace else []
    written_pod = apply_limit_range_defaults(written, limit_ranges)
    stripped_pod = apply_limit_range_defaults(stripped, limit_ranges)
    findings = []
    for read in reads:
        before = _downward_value(written_pod, read.target, "limits", read.divisor)
        after = _downward_value(stripped_pod, read.target, "limits", read.divisor)
        if before is None or after == before:
            continue
        own = _named_container(stripped, read.target)
        by_limit_range = own is not None and dig(own, ("resources", "limits", "cpu")) is None \
            and dig(stripped, ("resources", "limits", "cpu")) is None
        now = ("the node's allocatable CPU" if after is None else
               f"the LimitRange default {after}" if by_limit_range else
               f"the pod-level limit {after}")
        request = _downward_value(stripped, read.target, "requests", read.divisor)
        use = f"requests.cpu ({request})" if request is not None else "requests.cpu"
        findings.append(warning(
            read.path,
            f'{read.reader} reads limits.cpu of "{read.target}" = {before}{_per(read.divisor)}; '
            f"stripped, it reads {now}: use {use}"))
    return findings


@rule("quantities", "validate", WORKLOAD_KINDS, Mode.ENFORCE,
      "pod specs have Kubernetes' shape and resource quantities parse",
      judges=pod_resources, ratchet=Ratchet.WARN)
def check_resource_quantities(subject: Subject, obj: dict[str, Any], view: ClusterView,
                              policy: Policy) -> list[Finding]:
    """The shape the API server decodes a pod spec into, and quantities that parse (the
    API server refuses both before any webhook, but ``envelope check`` reads raw files
    and anyone who reaches the port can send anything)."""
    problems = shape_problems(subject, obj)
    if problems:
        return [error(path, f"{path}: {why}") for path, why in problems[:5]]
    findings = []
    for holder in holders(subject, obj):
        for section in ("requests", "limits"):
            values = holder.resources.get(section)
            if not isinstance(values, dict):
                continue
            for key, value in values.items():
                try:
                    parse_quantity(value)
                except QuantityError as exc:
                    findings.append(error(f"{holder.path}.{section}.{key}",
                                          f"{holder.label}: {section}.{key}: {exc}"))
    return findings


_LIMIT_RANGER_ANNOTATION = "kubernetes.io/limit-ranger"
"""What LimitRanger writes on a Pod it defaulted: ``LimitRanger plugin set: memory request
for container app; memory limit for container app`` (``mergePodResourceRequirements``)."""


def _set_by_limit_ranger(subject: Subject, obj: dict[str, Any], holder_label: str) -> set[str]:
    """On a Pod, which memory values of one container LimitRanger's annotation says it set
    (``{"request", "limit"}``): the Pod reaching the webhook already carries them."""
    if subject.kind != "Pod":
        return set()
    note = dig(obj, ("metadata", "annotations", _LIMIT_RANGER_ANNOTATION))
    if not isinstance(note, str):
        return set()
    word, _, name = holder_label.partition(" ")
    who = f"{'init container' if word == 'initContainer' else 'container'} {name.strip(chr(34))}"
    found = set()
    for part in note.removeprefix("LimitRanger plugin set:").split(";"):
        names, sep, rest = part.strip().partition(" request for " if " request for " in part
                                                  else " limit for ")
        if sep and rest == who and "memory" in [n.strip() for n in names.split(",")]:
            found.add(sep.split()[0])
    return found


def _limit_range_message(holder_label: str, path: str, requests: dict[str, Any],
                         limits: dict[str, Any], from_lr: set[str],
                         limit_ranges: list[dict[str, Any]], pod: bool) -> str:
    """The mismatch LimitRanger's memory defaults make: which LimitRange, both numbers,
    and what to write instead."""
    said = {}
    for which, section, field in (("request", "requests", "defaultRequest"),
                                  ("limit", "limits", "default")):
        value = (requests if which == "request" else limits)["memory"]
        source = limit_range_default(limit_ranges, section, "memory") if which in from_lr else None
        said[which] = (f'{value} (LimitRange "{source[0]}" {field}.memory)' if source
                       else f"{value} (a LimitRange's {field}.memory)" if which in from_lr
                       else f"{value} (as written)")
    written = ("no memory request or limit" if from_lr == {"request", "limit"} else
               f"memory request {requests['memory']} without a limit")
    whom, refused = (("this Pod", "the Pod is refused") if pod else
                     ("every Pod of this template",
                      "each Pod is refused (FailedCreate on its controller)"))
    keep = limits["memory"] if "request" in from_lr else requests["memory"]
    block = path.removesuffix(".requests.memory")
    return (f"{holder_label}: {written}; LimitRanger, which runs before Envelope's Pod webhook, "
            f"gives {whom} memory request {said['request']} and limit {said['limit']}, which "
            f"differ, so {refused}; set {block}.requests.memory and limits.memory to one "
            f"value, e.g. {keep}")


@rule("memory-request-equals-limit", "validate", WORKLOAD_KINDS, Mode.ENFORCE,
      "memory request equals memory limit", reads={"LimitRange"}, judges=pod_resources,
      ratchet=Ratchet.WARN, requires=well_formed)
def memory_request_equals_limit(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                policy: Policy) -> list[Finding]:
    """Memory request == limit in every resources block — judged on the Pod as it will be
    stored (``app.k8s.defaulting.default_pod`` with the namespace's LimitRanges), for a Pod
    and for every Pod a template makes: requests from limits, then LimitRanger's
    container defaults (it runs before Envelope's Pod webhook), then pod-level defaults.
    A template whose containers set no memory in a namespace whose LimitRange has
    ``default.memory`` != ``defaultRequest.memory`` passes as written but makes Pods the
    Pod webhook refuses (FailedCreate): refused here, naming the LimitRange; so is a
    pod-level memory limit without a request, which gets the containers' summed request."""
    spec = pod_spec(subject, obj)
    limit_ranges = view.list("LimitRange", subject.namespace) if subject.namespace else []
    judged = obj
    if spec is not None:
        try:
            stored = default_pod({"spec": spec}, limit_ranges)["spec"]
        except QuantityError:
            stored = None  # the quantities rule names the value
        if stored is not None:
            judged = with_pod_spec(subject, obj, stored)
    written_blocks = {h.path: h.resources for h in holders(subject, obj)}
    findings = []
    written_pod_requests = dig(spec or {}, ("resources", "requests"))
    for holder in holders(subject, judged):
        requests = holder.resources.get("requests") or {}
        limits = holder.resources.get("limits") or {}
        if "memory" not in requests or "memory" not in limits:
            continue
        path = f"{holder.path}.requests.memory"
        try:
            order = compare_quantities(requests["memory"], limits["memory"])
        except QuantityError as exc:
            findings.append(error(path, f"{holder.label}: {exc}"))
            continue
        if order == 0:
            continue
        if holder.container is not None:
            written = written_blocks.get(holder.path) or {}
            from_lr = _set_by_limit_ranger(subject, obj, holder.label)
            if not _has(written.get("limits"), "memory"):
                if not _has(written.get("requests"), "memory"):
                    from_lr.add("request")
                from_lr.add("limit")
            if from_lr:
                findings.append(error(path, _limit_range_message(
                    holder.label, path, requests, limits, from_lr, limit_ranges,
                    subject.kind == "Pod")))
                continue
        defaulted_here = holder.container is None and not (
            isinstance(written_pod_requests, dict) and "memory" in written_pod_requests)
        if defaulted_here:
            findings.append(error(
                path,
                f"{holder.label}: memory limit {limits['memory']} without a request; the API "
                f"server gives the Pods the containers' summed memory request "
                f"{format_bytes(parse_quantity(requests['memory']))}, which differs from the "
                f"limit, so every Pod would be refused; set {path}: {limits['memory']}"))
            continue
        findings.append(error(
            path,
            f"{holder.label}: memory request {requests['memory']} differs from limit "
            f"{limits['memory']}; memory cannot be borrowed back, so request must "
            f"equal limit"))
    return findings


def _has(section: object, name: str) -> bool:
    return isinstance(section, dict) and name in section


@dataclass(frozen=True)
class _EnvEnvelope:
    """A string envelope as the container sees it (issue 12, class 6)."""

    index: int
    """The entry the container gets: the last one of the name (the kubelet's map)."""
    written: str
    """Its ``value`` as written ("" for none)."""
    seen: EnvValue
    """After the kubelet's ``$(VAR)`` expansion: ``value`` None when only the node knows
    it (``valueFrom``), ``unresolved`` the references nothing before it defines."""


def _envelope_env(container: dict[str, Any], name: str) -> _EnvEnvelope | None:
    env = container.get("env")
    if not isinstance(env, list):
        return None
    index = None
    for i, var in enumerate(env):
        if isinstance(var, dict) and var.get("name") == name:
            index = i  # the last duplicate wins (makeEnvironmentVariables)
    if index is None:
        return None
    written = env[index].get("value")
    if isinstance(written, str) and "$" not in written and "valueFrom" not in env[index]:
        # No reference to expand: the container sees it as written (the kubelet's
        # expansion of the whole list is only needed for $(VAR) and $$).
        return _EnvEnvelope(index, written, EnvValue(written))
    return _EnvEnvelope(index, written if isinstance(written, str) else "", container_env(env)[name])


def _refs(names: tuple[str, ...]) -> str:
    return ", ".join(f"$({name})" for name in names)


def _shown(var: str, found: _EnvEnvelope) -> str:
    """``RESOURCE_LIMITS='cpu=$(C)'`` and, when the container sees something else, the
    variables it expanded: their values are another variable's (a token, a password)
    and never shown (issue 25, class 5). Only ``$$`` escapes changed it: what the
    container sees is then the written text's, and shown."""
    text = f"{var}={shown(found.written, _WRITTEN_LIMIT)}"
    seen = found.seen
    if seen.sources:
        text += f" (after expanding {_refs(tuple(dict.fromkeys(s.name for s in seen.sources)))})"
    elif seen.value is not None and seen.value != found.written:
        text += f" (the container sees {shown(seen.value, _WRITTEN_LIMIT)})"
    return text


def _expanded_in(found: _EnvEnvelope | None, span: tuple[int, int]) -> tuple[str, ...]:
    """The variables whose values make up any of ``seen.value[span]``."""
    if found is None:
        return ()
    start, end = span
    return tuple(dict.fromkeys(s.name for s in found.seen.sources
                               if s.start < s.end and s.start < end and start < s.end))


def _amount(found: _EnvEnvelope | None, envelope: EnvelopeString, key: str) -> str:
    """``memory=29Gi`` as written, or ``memory from $(MEM)`` when any of it came from
    another variable: not even its number is shown (a PIN is a quantity)."""
    pair = envelope.pair(key)
    if pair is None:
        return key
    names = _expanded_in(found, pair.span)
    return f"{key} from {_refs(names)}" if names else f"{key}={cut(pair.value, _WRITTEN_LIMIT)}"


def _envelope_problem(found: _EnvEnvelope) -> tuple[EnvelopeString | None, str]:
    """The envelope the container sees, parsed, or why it is not one: a chunk that is
    not ``key=value``, or a cpu or memory that is not a quantity (the first of each
    key, as :meth:`EnvelopeString.quantity` reads). Text that came from another
    variable is named by the variable, never shown."""
    seen = found.seen.value or ""
    try:
        envelope = parse_envelope_string(seen)
    except PairError as exc:
        names = _expanded_in(found, exc.span)
        return None, (f"a chunk from {_refs(names)} is not a key=value pair" if names
                      else str(exc))
    for key in ("cpu", "memory"):
        pair = envelope.pair(key)
        if pair is None:
            continue
        try:
            parse_quantity(pair.value)
        except QuantityError:
            names = _expanded_in(found, pair.span)
            what = f"{key} from {_refs(names)}" if names else shown(pair.value)
            return None, f"{what} is not a quantity (examples: 500m, 2, 1.5Gi, 29G, 1e3)"
    return envelope, ""


@rule("env-envelope-cpu", "mutate", WORKLOAD_KINDS, Mode.ENFORCE,
      "remove cpu pairs from string limits envelopes", judges=pod_resources, requires=well_formed)
def strip_cpu_from_env_envelope(subject: Subject, obj: dict[str, Any], view: ClusterView,
                                policy: Policy) -> list[Finding]:
    """``RESOURCE_LIMITS="cpu=7,memory=29Gi"`` -> ``"memory=29Gi"``: a runtime that
    sizes itself from a string envelope must not see a CPU cap the pod no longer has.
    The entry the container sees is changed (the last of the name), and only when its
    value is written out. A pair is dropped by its written key, whatever its value
    holds: ``cpu=$(CPU),memory=29Gi`` -> ``memory=29Gi`` (seed 000: the installer drops
    every ``cpu=`` pair). A ``$(VAR)`` that stands for whole pairs is never rewritten
    (a warning says when what it expands to still holds a cpu pair); ``valueFrom`` is
    only known on the node."""
    if keeps_cpu_limit(subject, obj, policy):
        return []
    findings: list[Finding] = []
    name = policy.envelope_env.limits
    for label, path, container in containers(subject, obj):
        found = _envelope_env(container, name)
        if found is None or found.seen.value is None:
            continue
        i, text = found.index, found.written
        if references(text):
            stripped_text = without_written_cpu(text)
            if stripped_text is not None:
                _rewrite_env(container, i, stripped_text)
                findings.append(change(f"{path}.env[{i}].value",
                                      f"{label}: {name} {shown(text, _WRITTEN_LIMIT)} -> "
                                      f"{shown(stripped_text, _WRITTEN_LIMIT)} (the cpu pair "
                                      f"dropped by its key)"))
                refound = _envelope_env(container, name)
                if refound is None:
                    continue
                found = refound
            value = found.seen.value
            if value is None or found.seen.unresolved:
                continue  # env-envelope-consistency says it is left as written
            try:
                seen = parse_envelope_string(value)
            except QuantityError:
                continue  # env-envelope-consistency denies it
            if seen.without_cpu() != value:
                findings.append(warning(
                    f"{path}.env[{i}].value",
                    f"{label}: {_shown(name, found)} keeps its cpu pair: Envelope does not "
                    f"rewrite a $(...) reference that stands for whole pairs; remove cpu from "
                    f"the variable it refers to"))
            continue
        try:
            envelope = parse_envelope_string(text)
            envelope.quantity("cpu")
            envelope.quantity("memory")
        except QuantityError:
            continue  # left as written; env-envelope-consistency denies it
        stripped = envelope.without_cpu()
        if stripped != text:
            _rewrite_env(container, i, stripped)
            findings.append(change(f"{path}.env[{i}].value",
                                  f"{label}: {name} {shown(text, _WRITTEN_LIMIT)} -> "
                                  f"{shown(stripped, _WRITTEN_LIMIT)}"))
    return findings


def _rewrite_env(container: dict[str, Any], index: int, value: str) -> None:
    """Copy-on-write: the copier shares env lists with the admitted object."""
    env = list(container["env"])
    env[index] = {**env[index], "value": value}
    container["env"] = env


@rule("env-envelope-consistency", "validate", WORKLOAD_KINDS, Mode.ENFORCE,
      "string envelopes agree on memory; CPU limit >= request", judges=pod_resources,
      ratchet=Ratchet.WARN, requires=well_formed)
def env_envelope_consistency(subject: Subject, obj: dict[str, Any], view: ClusterView,
                             policy: Policy) -> list[Finding]:
    """The two string envelopes agree on memory; a remaining CPU limit covers the request.
    Each is judged as the container will see it: the last entry of its name, after the
    kubelet's ``$(VAR)`` expansion (app/k8s/envexpand.py). ``valueFrom`` is not judged; a
    value still holding an unresolved ``$(VAR)`` is left as written with a warning."""
    findings: list[Finding] = []
    names = policy.envelope_env
    for label, path, container in containers(subject, obj):
        lim = _envelope_env(container, names.limits)
        req = _envelope_env(container, names.requests)
        parsed = {}
        for var, found in ((names.limits, lim), (names.requests, req)):
            if found is None or found.seen.value is None:
                continue  # valueFrom: only the node knows the value
            where = f"{path}.env[{found.index}].value"
            if found.seen.unresolved:
                refs = ", ".join(f"$({ref})" for ref in found.seen.unresolved)
                source = ("no env entry before it defines it; envFrom may, on the node"
                          if container.get("envFrom") else "no env entry before it defines it")
                findings.append(warning(
                    where,
                    f"{label}: {var}={shown(found.written, _WRITTEN_LIMIT)} left as written: "
                    f"{refs} is not resolved "
                    f"({source}), so the container sees it literally; define it in an earlier "
                    f"env entry or write the value out"))
                continue
            envelope, problem = _envelope_problem(found)
            if envelope is None:
                findings.append(error(where, f"{label}: {_shown(var, found)}: {problem}"))
                continue
            parsed[var] = envelope
        if len(parsed) != 2 or lim is None or req is None:
            continue
        limits, requests = parsed[names.limits], parsed[names.requests]
        where = f"{path}.env[{lim.index}].value"
        lim_mem, req_mem = limits.quantity("memory"), requests.quantity("memory")
        if lim_mem is not None and req_mem is not None and lim_mem != req_mem:
            findings.append(error(
                where,
                f"{label}: {names.limits} {_amount(lim, limits, 'memory')} differs from "
                f"{names.requests} {_amount(req, requests, 'memory')}; memory request must "
                f"equal limit"))
        lim_cpu, req_cpu = limits.quantity("cpu"), requests.quantity("cpu")
        if lim_cpu is not None and req_cpu is not None and lim_cpu < req_cpu:
            findings.append(error(
                where,
                f"{label}: {names.limits} {_amount(lim, limits, 'cpu')} is below "
                f"{names.requests} {_amount(req, requests, 'cpu')}; Kubernetes rejects a CPU "
                f"limit under the request"))
    return findings


def _copy_resources(resources: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in resources.items()}


def _copy_container(container: dict[str, Any]) -> dict[str, Any]:
    out = dict(container)
    if isinstance(out.get("resources"), dict):
        out["resources"] = _copy_resources(out["resources"])
    return out  # env stays shared: the env rule replaces the list it changes


def copy_for_mutation(subject: Subject, obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of what the mutating rules here change — the path to the pod spec, the
    container lists, each container's ``resources`` and the pod-level ``resources`` —
    sharing everything else with ``obj`` (metadata, volumes, probes, ``env``: the env
    rule replaces a list rather than change it).
    The property tests check that ``obj`` is never changed through it."""
    root = dict(obj)
    node = root
    for key in POD_SPEC_PATHS[(subject.group, subject.kind)]:
        child = node.get(key)
        if not isinstance(child, dict):
            return root
        node[key] = node = dict(child)
    for field in ("initContainers", "containers"):
        items = node.get(field)
        if isinstance(items, list):
            node[field] = [_copy_container(c) if isinstance(c, dict) else c for c in items]
    if isinstance(node.get("resources"), dict):
        node["resources"] = _copy_resources(node["resources"])
    return root


COPIERS = dict.fromkeys(WORKLOAD_KINDS, copy_for_mutation)

UPDATES = dict.fromkeys(WORKLOAD_KINDS, KindUpdates(
    mutate_parts={pod_resources: template_part}, held=held_on_update, owned=compared_by_controller))
"""Every workload kind's writes: in the mutate phase the pod template's resources and env
must change for a rule judging ``pod_resources`` to run (``template_part``); the parts
the API server keeps on an UPDATE (``held_on_update``); a Deployment's ReplicaSets left
as their controller wrote them (``compared_by_controller``)."""
