"""The API server's resource defaulting of a Pod, before any webhook judges it: API
defaulting on decode (requests from limits, hugepages, every value rounded up to 1m),
LimitRanger's container defaults (Pod CREATE and ``pods/resize``, before every mutating
webhook), then the pod-level defaulting v1.37 runs at create — in the order
``default_pod(pod, limit_ranges)`` applies them.

Pure functions over plain Kubernetes dicts; no I/O. Ported from v1.34.12 and checked on
every e2e version by the scheduling and admission oracles; the upstream files:
docs/fidelity.md, "The ports, file by file" and "Defaulting oracle". The request the
scheduler then charges is ``app/k8s/scheduling.py``; which LimitRanges and quotas refuse
the defaulted pod is ``app/k8s/namespace_policy.py``.

Why one module of ~448 lines: API defaulting and LimitRanger's defaults interleave
(decode, LimitRanger, then pod-level at create) and must be applied as one sequence; the
pod-level defaulting of 1.35-1.36 stays beside 1.37's for the version matrix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from decimal import ROUND_UP, Context, Decimal
from typing import Any

from app.k8s.quantity import NEWEST_MINOR, QuantityError, parse_quantity
from app.k8s.scheduling import (
    ResourceList,
    aggregate_container_limits,
    aggregate_container_requests,
    is_supported_pod_level_resource,
    pod_requests,
)

__all__ = ["LIMIT_RANGER_ANNOTATION", "apply_limit_range_defaults", "copy_for_defaulting", "default_pod",
           "defaulted_limit_range_item", "effective_pod_requests", "limit_range_default",
           "limit_range_items", "limit_ranger_pod", "merge_limit_range_defaults"]

_HUGEPAGES = "hugepages-"
_WHOLE_MILLIS = re.compile(r"[0-9]+(?:m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?")
"""Digits with a suffix of 1m or more, no point, no exponent: already a multiple of 1m."""


# ------------------------------------------------------------------ API defaulting


def _default_container_requests(container: dict[str, Any]) -> None:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return
    limits = resources.get("limits")
    if not isinstance(limits, dict) or not limits:
        return
    requests = resources.get("requests")
    if not isinstance(requests, dict):
        requests = {}
        resources["requests"] = requests
    for name, value in limits.items():
        requests.setdefault(name, value)


def _canonical(value: Decimal) -> str:
    """A quantity string with exactly ``value`` (plain digits when short)."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    if -9 <= exponent <= 18:
        return format(value, "f")
    coefficient = ("-" if sign else "") + "".join(map(str, digits))
    return f"{coefficient}e{exponent}"


def _round_up_milli(value: object) -> object:
    """pkg/apis/core/v1/defaults.go ``SetDefaults_ResourceList``: every value of a
    ResourceList is rounded up to a multiple of 1m (``Quantity.RoundUp(-3)``)."""
    if isinstance(value, str) and _WHOLE_MILLIS.fullmatch(value):
        return value  # the common case, without Decimal (a property test holds it to the rest)
    try:
        q = parse_quantity(value)
    except QuantityError:
        return value
    if q.is_finite() and q.adjusted() > 24:
        return value
    exponent = q.as_tuple().exponent
    if not isinstance(exponent, int) or exponent >= -3:
        return value
    ctx = Context(prec=len(q.as_tuple().digits) + 5)
    return _canonical(q.quantize(Decimal("0.001"), rounding=ROUND_UP, context=ctx))


def _round_lists(spec: dict[str, Any]) -> None:
    """Round every resource list of a pod spec in place, as the generated defaulter
    does after ``SetDefaults_Pod`` (containers, init containers, overhead and
    pod-level resources)."""
    lists: list[Any] = []
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict) and isinstance(container.get("resources"), dict):
                lists += [container["resources"].get("limits"), container["resources"].get("requests")]
    lists.append(spec.get("overhead"))
    if isinstance(spec.get("resources"), dict):
        lists += [spec["resources"].get("limits"), spec["resources"].get("requests")]
    for rl in lists:
        if isinstance(rl, dict):
            for name in list(rl):
                rl[name] = _round_up_milli(rl[name])


def default_pod(pod: Mapping[str, Any],
                limit_ranges: Iterable[Mapping[str, Any]] = (), *,
                minor: int = NEWEST_MINOR) -> dict[str, Any]:
    """A copy of a *Pod* with the resource defaults the API server applies on
    create, in Kubernetes v1.37.2's order:

    1. decoding (``SetDefaults_Pod``, ``pkg/apis/core/v1/defaults.go``): every
       container and init container without a request for a resource it limits gets
       request = limit; then every ResourceList is rounded up to a multiple of 1m
       (``SetDefaults_ResourceList``, templates included);
    2. with ``limit_ranges`` (the LimitRanges of the Pod's namespace), LimitRanger's
       container defaults (``merge_limit_range_defaults``), in mutating admission;
    3. the pod-level defaults, only when ``spec.resources`` is set, which v1.37 runs in
       ``PrepareForCreate`` after admission (``PodLevelResourcesFixDefaulting``, on):
       ``_default_pod_level``, from the rounded container values. (1.34-1.36 ran a
       narrower form at decoding, before rounding and LimitRanger; the oracles run on
       1.37: e2e/test_oracle_apiserver.py, e2e/test_oracle_limitranger.py.)

    Pod *templates* get no request defaulting (only the rounding); apply this to the Pod
    a template makes. New values are written as exact quantity strings. ``minor`` below
    37: the 1.34-1.36 order (``_default_pod_level_before_137`` at decoding, then the
    rounding, then LimitRanger, then the decoding defaults again as every read of the
    stored Pod applies them), as the oracles find it on v1.35.4. ``minor`` 38 and
    later: a container's zero cpu or memory limit leaves that pod-level limit unset
    (``_default_pod_level``).
    """
    out = copy_for_defaulting(pod)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    _default_container_lists(spec)
    if minor < 37:
        _default_pod_level_before_137(spec)
        _round_lists(spec)
        merge_limit_range_defaults(spec, limit_ranges)
        # What the API server answers and every later read returns is decoded again,
        # with the decoding defaults: the pod-level ones then see LimitRanger's values
        # (as the limitranger oracle found then on v1.35.4: a pod-level cpu request from a LimitRange's
        # container defaultRequest).
        _default_container_lists(spec)
        _default_pod_level_before_137(spec)
        _round_lists(spec)
        return out
    _round_lists(spec)  # decoding: SetDefaults_ResourceList, before any admission plugin
    merge_limit_range_defaults(spec, limit_ranges)
    _default_pod_level(spec, minor)  # PrepareForCreate, from the rounded container values
    _round_lists(spec)  # what a LimitRange read from files (not stored yet) brings unrounded
    return out


def _copy_resource_map(resources: dict[str, Any]) -> dict[str, Any]:
    return {k: dict(v) if isinstance(v, dict) else v for k, v in resources.items()}


def copy_for_defaulting(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of what defaulting writes — the spec, its container lists, each container
    and its ``resources`` maps, the pod-level ``resources`` and ``overhead`` — sharing
    everything else (env, probes, volumes) with ``pod``. A deep copy of the whole Pod
    cost ~0.5 ms a review on the admission path (rules call this several times)."""
    out = dict(pod)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    spec = out["spec"] = dict(spec)
    for key in ("containers", "initContainers"):
        items = spec.get(key)
        if isinstance(items, list):
            copied = []
            for item in items:
                if isinstance(item, dict):
                    item = dict(item)
                    if isinstance(item.get("resources"), dict):
                        item["resources"] = _copy_resource_map(item["resources"])
                copied.append(item)
            spec[key] = copied
    if isinstance(spec.get("resources"), dict):
        spec["resources"] = _copy_resource_map(spec["resources"])
    if isinstance(spec.get("overhead"), dict):
        spec["overhead"] = dict(spec["overhead"])
    return out


def _default_container_lists(spec: dict[str, Any]) -> None:
    """Step 1 of ``default_pod``, in place."""
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                _default_container_requests(container)


def _partially_set_cpu_memory_limits(spec: Mapping[str, Any]) -> set[str]:
    """cpu and memory, where some init or regular container (sidecars included) sets no
    limit or a zero one: v1.38.0-beta.0 component-helpers ``resource/helpers.go``
    ``omitPartiallySetCPUMemLimits`` leaves them out of ``AggregateContainerLimits``
    (kubernetes #141014: the kubelet treats such a container as unlimited)."""
    out: set[str] = set()
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or []:
            if not isinstance(container, Mapping):
                continue
            resources = container.get("resources")
            limits = resources.get("limits") if isinstance(resources, Mapping) else None
            for name in ("cpu", "memory"):
                value = limits.get(name) if isinstance(limits, Mapping) else None
                try:
                    if value is None or parse_quantity(str(value)) == 0:
                        out.add(name)
                except QuantityError:
                    continue  # the API server refuses it first
    return out


def _default_pod_level(spec: dict[str, Any], minor: int = NEWEST_MINOR) -> None:
    """Step 3 of ``default_pod``, in place: v1.37.2's ``podutil.DefaultPodLevelResources``
    (``pkg/api/pod/util.go``), whenever ``spec.resources`` has requests or limits:

    1. ``defaultHugePagePodLevelLimits``: a pod-level hugepages limit from the containers'
       aggregate, unless a pod-level hugepages request is set;
    2. ``defaultPodLevelRequests``: a missing cpu/memory request is the containers'
       aggregate request, then any other missing request of a limited resource is the
       pod-level limit (no pod-level limit needed, unlike 1.34-1.36's ``defaultPodRequests``);
    3. ``defaultPodLevelLimits``: a resource with a pod-level request and no pod-level
       limit, limited by every container (init containers and sidecars included), gets
       max(pod-level request, the containers' aggregate limit). From ``minor`` 38 a
       container's zero cpu or memory limit counts as unset there: no pod-level limit
       for it (``_partially_set_cpu_memory_limits``; 1.37 summed the zero).
    """
    resources = spec.get("resources")
    if not isinstance(resources, dict):
        return
    limits_raw = resources.get("limits") if isinstance(resources.get("limits"), dict) else None
    requests_raw = resources.get("requests") if isinstance(resources.get("requests"), dict) else None
    if not limits_raw and not requests_raw:
        return
    pod_limits = dict(limits_raw or {})
    aggregate_limits = aggregate_container_limits(spec)
    if minor >= 38:
        for name in _partially_set_cpu_memory_limits(spec):
            aggregate_limits.pop(name, None)
    for name, value in aggregate_limits.items():
        if not name.startswith(_HUGEPAGES) or name in (requests_raw or {}):
            continue
        pod_limits.setdefault(name, _canonical(value))
    pod_requests_out = dict(requests_raw or {})
    for name, value in aggregate_container_requests(spec).items():
        # IsOvercommitAllowed: not hugepages (and not other non-overcommittable ones).
        if name not in pod_requests_out and name in ("cpu", "memory"):
            pod_requests_out[name] = _canonical(value)
    for name, value in pod_limits.items():
        if name not in pod_requests_out and is_supported_pod_level_resource(name):
            pod_requests_out[name] = value
    every = [c for key in ("initContainers", "containers") for c in spec.get(key) or []
             if isinstance(c, dict)]
    for name, request in pod_requests_out.items():
        if name in pod_limits or not is_supported_pod_level_resource(name) or not every:
            continue
        if not all(isinstance(c.get("resources"), dict)
                   and isinstance(c["resources"].get("limits"), dict)
                   and name in c["resources"]["limits"] for c in every):
            continue
        aggregate = aggregate_limits.get(name)
        if aggregate is None:
            continue
        pod_limits[name] = request if parse_quantity(request) > aggregate else _canonical(aggregate)
    if pod_limits:
        resources["limits"] = pod_limits
    if pod_requests_out:
        resources["requests"] = pod_requests_out


def _default_pod_level_before_137(spec: dict[str, Any]) -> None:
    """The pod-level defaults of Kubernetes 1.34-1.36, in place (``SetDefaults_Pod`` at
    decoding, before the 1m rounding, from the unrounded container values; v1.35.4
    ``pkg/apis/core/v1/defaults.go``): ``defaultHugePagePodLimits``, then
    ``defaultPodRequests`` only when pod-level *limits* exist; no pod-level limit
    defaulting."""
    resources = spec.get("resources")
    if not isinstance(resources, dict):
        return
    limits_raw = resources.get("limits") if isinstance(resources.get("limits"), dict) else None
    requests_raw = resources.get("requests") if isinstance(resources.get("requests"), dict) else None
    # defaultHugePagePodLimits
    if limits_raw or requests_raw:
        pod_limits = dict(limits_raw or {})
        for name, value in aggregate_container_limits(spec).items():
            if not name.startswith(_HUGEPAGES) or name in (requests_raw or {}):
                continue
            pod_limits.setdefault(name, _canonical(value))
        if pod_limits:
            resources["limits"] = pod_limits
            limits_raw = pod_limits
    # defaultPodRequests
    if not limits_raw:
        return
    pod_requests_out = dict(requests_raw or {})
    for name, value in aggregate_container_requests(spec).items():
        # IsOvercommitAllowed: not hugepages (and not other non-overcommittable ones).
        if name not in pod_requests_out and name in ("cpu", "memory"):
            pod_requests_out[name] = _canonical(value)
    for name, value in limits_raw.items():
        if name not in pod_requests_out and is_supported_pod_level_resource(name):
            pod_requests_out[name] = value
    if pod_requests_out:
        resources["requests"] = pod_requests_out


def effective_pod_requests(pod_or_spec: Mapping[str, Any], *, is_pod: bool = True,
                           minor: int = NEWEST_MINOR) -> ResourceList:
    """What the scheduler will charge for the pod made from this spec: API
    defaulting (``default_pod``) and then ``pod_requests``. A template spec
    becomes a Pod before it is scheduled, so it is defaulted the same way."""
    spec = pod_or_spec.get("spec") if is_pod else pod_or_spec
    if not isinstance(spec, Mapping):
        return {}
    if not is_pod:
        # A template is stored with its resource lists rounded; its Pods are made
        # from that stored template.
        rounded = copy_for_defaulting({"spec": spec})["spec"]
        _round_lists(rounded)
        spec = rounded
    defaulted = default_pod({"spec": spec}, minor=minor)["spec"]
    return pod_requests(defaulted)


# ------------------------------------------------- LimitRanger's container defaults


def limit_range_items(limit_range: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = limit_range.get("spec")
    limits = spec.get("limits") if isinstance(spec, Mapping) else None
    return [i for i in limits or [] if isinstance(i, Mapping)]


def defaulted_limit_range_item(item: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """SetDefaults_LimitRangeItem (type Container): default from max, defaultRequest
    from default, then from min."""
    default = dict(item.get("default") or {})
    default_request = dict(item.get("defaultRequest") or {})
    for key, value in (item.get("max") or {}).items():
        default.setdefault(key, value)
    for key, value in default.items():
        default_request.setdefault(key, value)
    for key, value in (item.get("min") or {}).items():
        default_request.setdefault(key, value)
    return {"default": default, "defaultRequest": default_request}


def _container_defaults(limit_range: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``defaultContainerResourceRequirements``: (limits, requests) of one LimitRange's
    ``type: Container`` items (a later item's value replaces an earlier one's)."""
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    for item in limit_range_items(limit_range):
        if item.get("type") == "Container":
            d = defaulted_limit_range_item(item)
            requests.update(d["defaultRequest"])
            limits.update(d["default"])
    return limits, requests


def merge_limit_range_defaults(spec: dict[str, Any],
                               limit_ranges: Iterable[Mapping[str, Any]]) -> None:
    """``PodMutateLimitFunc`` for every LimitRange in turn, in place on a spec whose
    containers and resources maps the caller owns (``copy_for_defaulting``): each
    container and init container gets every default limit and request it does not set
    (``mergeContainerResources``; a value set by an earlier LimitRange is kept)."""
    for lr in limit_ranges:
        limits, requests = _container_defaults(lr)
        if not limits and not requests:
            continue
        for key in ("containers", "initContainers"):
            for container in spec.get(key) or []:
                if not isinstance(container, dict):
                    continue
                res = container.get("resources")
                if not isinstance(res, dict):  # absent, or null as a manifest may write it
                    res = container["resources"] = {}
                for which, defaults in (("limits", limits), ("requests", requests)):
                    current = res.get(which)
                    if not isinstance(current, dict):
                        current = {}
                        res[which] = current
                    for name, value in defaults.items():
                        current.setdefault(name, value)


LIMIT_RANGER_ANNOTATION = "kubernetes.io/limit-ranger"


def limit_ranger_pod(pod: Mapping[str, Any],
                     limit_ranges: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of a *Pod* as LimitRanger leaves it before the mutating webhooks see it:
    for each LimitRange in turn, every container and init container gets the default
    limits and requests it does not set, and the ``kubernetes.io/limit-ranger``
    annotation says what was set (``mergePodResourceRequirements`` and
    ``mergeContainerResources``, ``plugin/pkg/admission/limitranger/admission.go`` lines
    236-292 at v1.37.2: requests before limits, names sorted, containers before init
    containers; a later LimitRange that sets anything rewrites the annotation), after
    decoding gave every limited resource its request (no default request is set for
    it; the request itself is left to ``default_pod``). The Pod
    itself is returned when no LimitRange sets anything. ``envelope check`` judges a
    Pod this way, as the webhook receives it."""
    out: dict[str, Any] | None = None
    for lr in limit_ranges:
        limits, requests = _container_defaults(lr)
        if not limits and not requests:
            continue
        if out is None:
            out = copy_for_defaulting(pod)
        spec = out.get("spec")
        if not isinstance(spec, dict):
            return out
        notes: list[str] = []
        for key, word in (("containers", "container"), ("initContainers", "init container")):
            for container in spec.get(key) or []:
                if not isinstance(container, dict):
                    continue
                res = container.get("resources")
                set_by: dict[str, list[str]] = {}
                # decoding (SetDefaults_Pod) ran first: a resource the container limits
                # has its request already, and LimitRanger sets none for it
                limited = res.get("limits") if isinstance(res, dict) else None
                written = dict(limited) if isinstance(limited, dict) else {}
                for which, defaults in (("limits", limits), ("requests", requests)):
                    current = res.get(which) if isinstance(res, dict) else None
                    if which == "limits":
                        written_here: dict[str, Any] = {}
                    else:
                        written_here = written
                    missing = {n: v for n, v in defaults.items()
                               if not (isinstance(current, dict) and n in current)
                               and n not in written_here}
                    if not missing:
                        continue
                    if not isinstance(res, dict):
                        res = container["resources"] = {}
                    res[which] = {**(current if isinstance(current, dict) else {}), **missing}
                    set_by[which] = list(missing)
                for which, word_of in (("requests", "request"), ("limits", "limit")):
                    if set_by.get(which):
                        notes.append(f"{', '.join(sorted(set_by[which]))} {word_of} for "
                                     f"{word} {container.get('name')}")
        if notes:
            meta = out["metadata"] = dict(out.get("metadata") or {})
            meta["annotations"] = {**(meta.get("annotations") or {}),
                                   LIMIT_RANGER_ANNOTATION: "LimitRanger plugin set: "
                                   + "; ".join(notes)}
    return dict(pod) if out is None else out


def apply_limit_range_defaults(spec: Mapping[str, Any],
                               limit_ranges: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of the pod spec with LimitRanger's container defaults filled in
    (``merge_limit_range_defaults``)."""
    out: dict[str, Any] = copy_for_defaulting({"spec": spec})["spec"]
    merge_limit_range_defaults(out, limit_ranges)
    return out


def limit_range_default(limit_ranges: Iterable[Mapping[str, Any]], section: str,
                        name: str) -> tuple[str, Any] | None:
    """Which LimitRange gives a container that sets no ``section`` (``limits`` or
    ``requests``) of ``name`` its value, and the value: the first that has one, as
    ``merge_limit_range_defaults`` applies them. None when none does."""
    for lr in limit_ranges:
        limits, requests = _container_defaults(lr)
        found = (limits if section == "limits" else requests).get(name)
        if found is not None:
            meta = lr.get("metadata")
            return (str(meta.get("name", "")) if isinstance(meta, Mapping) else ""), found
    return None
