"""The memory rules of the workload family: ``memory-limit`` (a request without a limit
gets one equal to it), ``memory-below-limit`` (the policy's fix at admission) and
``memory-request-equals-limit`` (judged on the Pod as it will be stored, LimitRanger's
defaults applied).

Why: memory cannot be borrowed back, so the request is the limit (README.md); what
each rule decides and the messages are in docs/rules/.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.defaulting import default_pod, limit_range_default
from app.k8s.podspec import (
    WORKLOAD_KINDS,
    holders,
    pod_resources,
    pod_spec,
    qos_class,
    spec_text,
    stored_qos,
    well_formed,
    with_pod_spec,
)
from app.k8s.quantity import QuantityError, format_bytes, parse_quantity
from app.k8s.util import dig
from app.rules.base import Finding, Ratchet, Subject, change, error, rule, warning
from app.rules.envelope import compare_quantities


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


def _from_limit_ranger(subject: Subject, obj: dict[str, Any], holder_label: str,
                       written: dict[str, Any]) -> set[str]:
    """Which memory values of a container LimitRanger gives (``{"request", "limit"}``):
    what its annotation says it set on a Pod, and what the written block lacks."""
    from_lr = _set_by_limit_ranger(subject, obj, holder_label)
    if not _has(written.get("limits"), "memory"):
        if not _has(written.get("requests"), "memory"):
            from_lr.add("request")
        from_lr.add("limit")
    return from_lr


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
            from_lr = _from_limit_ranger(subject, obj, holder.label, written_blocks.get(holder.path) or {})
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
