"""The CPU-limit rules of the workload family: ``template-opt-outs`` (a workload's opt-out
reaches its Pods), ``cpu-limits`` (remove CPU limits, keep the request they implied) and
``downward-cpu-limit`` (a program that read its CPU limit reads the node's once stripped).

Why: a CPU limit throttles a pod that has idle cores beside it (README.md); the
opt-out (``keeps_cpu_limit``) and ``CPU_LIMIT_RULES`` are read by the namespace guards
(``app/rules/namespace/cpu_limits.py``). Rule pages: docs/rules/.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import ROUND_CEILING
from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.defaulting import apply_limit_range_defaults, default_pod
from app.k8s.podspec import (
    POD_SPEC_PATHS,
    WORKLOAD_KINDS,
    containers,
    holders,
    pod_resources,
    pod_spec,
    pod_template,
    spec_text,
    well_formed,
)
from app.k8s.quantity import QuantityError, parse_quantity
from app.k8s.util import dig, dotted, shown
from app.rules.base import Finding, Subject, change, rule, warning
from app.rules.envelope import (
    compare_quantities,
    is_integer_cpu,
    move_cpu_limit_to_request,
    move_pod_level_cpu_limit,
)

CPU_LIMIT_RULES = frozenset({"cpu-limits", "env-envelope-cpu"})
"""The rules that remove CPU limits: what a namespace guard holds back (namespace/cpu_limits.py)."""


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
