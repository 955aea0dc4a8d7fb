"""The shared envelope arithmetic: container resources and string envelopes.

CPU is time-shared, memory is not. A CPU limit throttles even on an idle node, so
limits carry no CPU; memory over the limit is an OOM kill, so the memory request
equals the memory limit. Every other limit is kept exactly as written.

Functions here are pure (or mutate only the dict they are handed) and know
nothing about HTTP, policy modes or Kubernetes kinds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from app.k8s.defaulting import default_pod, effective_pod_requests
from app.k8s.quantity import QuantityError, parse_quantity
from app.k8s.util import shown

__all__ = [
    "EnvelopeString",
    "Pair",
    "PairError",
    "compare_quantities",
    "is_integer_cpu",
    "move_cpu_limit_to_request",
    "move_pod_level_cpu_limit",
    "parse_envelope_string",
    "pod_amount",
    "pod_level_cpu_request_default",
    "without_written_cpu",
]


def move_cpu_limit_to_request(resources: dict[str, Any]) -> tuple[object, bool] | None:
    """Remove ``limits.cpu``; keep the CPU request it implied.

    Pod templates do not default requests from limits, so a template container with
    only ``limits.cpu: 7`` gets Pods with a CPU request of 7 *because of the limit*.
    When no CPU request is written, the removed limit becomes the request.
    Returns ``(removed value, request written)`` or ``None`` when there was no CPU
    limit. Only ``resources`` is changed.
    """
    limits = resources.get("limits")
    if not isinstance(limits, dict) or "cpu" not in limits:
        return None
    value = limits.pop("cpu")
    requests = resources.get("requests")
    if isinstance(requests, dict) and "cpu" in requests:
        return value, False
    if not isinstance(requests, dict):
        requests = {}
        resources["requests"] = requests
    requests["cpu"] = value
    return value, True


def compare_quantities(a: object, b: object) -> int:
    """-1, 0 or 1 as quantity ``a`` is below, equal to or above ``b``."""
    qa, qb = parse_quantity(a), parse_quantity(b)
    return (qa > qb) - (qa < qb)


def is_integer_cpu(value: object) -> bool:
    """True for whole cores (``2``, ``2000m``): what the CPU manager pins exclusively."""
    try:
        q = parse_quantity(value)
    except QuantityError:
        return False
    return q > 0 and q == q.to_integral_value()


@dataclass(frozen=True)
class Pair:
    """One ``key=value`` pair of a string envelope, as written (trimmed)."""

    text: str
    key: str
    value: str
    span: tuple[int, int] = (0, 0)
    """Where ``value`` lies in the envelope's ``raw``: what a message may not show when
    it came from another variable (``app.k8s.envexpand.Source``)."""


class PairError(QuantityError):
    """A chunk of a string envelope that is not ``key=value``; ``span`` is where it
    lies in the string."""

    def __init__(self, message: str, span: tuple[int, int]) -> None:
        super().__init__(message)
        self.span = span


@dataclass(frozen=True)
class EnvelopeString:
    """A string envelope such as ``"cpu=7,memory=29Gi"``: what a runtime inside the pod
    reads to size itself, which must say what the pod's resources say.

    Keys are matched case-insensitively and whole, so ``cpuset=0-3`` is not ``cpu``.
    """

    raw: str
    pairs: tuple[Pair, ...]

    def get(self, key: str) -> str | None:
        found = self.pair(key)
        return None if found is None else found.value

    def pair(self, key: str) -> Pair | None:
        """The first pair of ``key`` (the one :meth:`get` and :meth:`quantity` read)."""
        for pair in self.pairs:
            if pair.key.lower() == key:
                return pair
        return None

    def quantity(self, key: str) -> Decimal | None:
        value = self.get(key)
        return None if value is None else parse_quantity(value)

    def without_cpu(self) -> str:
        """The limits string with every ``cpu`` pair removed, other pairs kept in order.

        A string holding only CPU pairs is returned unchanged: an empty limits
        envelope reads as "unset" downstream, which mirrors the requests back and
        resurrects the CPU limit. An empty string stays empty.
        """
        kept = [p.text for p in self.pairs if p.key.lower() != "cpu"]
        if len(kept) == len(self.pairs) or not kept:
            return self.raw
        return ",".join(kept)


def without_written_cpu(text: str) -> str | None:
    """``text`` with every pair whose key is written ``cpu`` removed, whatever its value
    holds: ``"cpu=$(CPU), memory=29Gi"`` -> ``"memory=29Gi"`` (seed 000's installer drops
    a pair by its key, so a cpu limit from another variable is dropped too). Chunks are
    kept as written otherwise (trimmed, empty ones left out), including those whose key
    is not written out (``$(PAIR)``: what it expands to is only known expanded). None
    when no pair is dropped, or when every pair would be (a cpu-only envelope stays as
    written: an empty one reads as "unset" downstream, see
    :meth:`EnvelopeString.without_cpu`)."""
    kept: list[str] = []
    dropped = False
    for chunk in text.split(","):
        item = chunk.strip()
        if not item:
            continue
        key, sep, _ = item.partition("=")
        if sep and "$" not in key and key.strip().lower() == "cpu":
            dropped = True
            continue
        kept.append(item)
    if not dropped or not kept:
        return None
    return ",".join(kept)


def _pairs(text: str) -> Iterator[Pair]:
    at = 0
    for chunk in text.split(","):
        begin, at = at, at + len(chunk) + 1
        item = chunk.strip()
        if not item:
            continue
        begin += len(chunk) - len(chunk.lstrip())
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PairError(f"{shown(item)} is not a key=value pair", (begin, begin + len(item)))
        start = begin + len(key) + 1 + len(value) - len(value.lstrip())
        stripped = value.strip()
        yield Pair(text=item, key=key.strip(), value=stripped, span=(start, start + len(stripped)))


def parse_envelope_string(text: str) -> EnvelopeString:
    """Parse ``"cpu=7, memory=29Gi"``; raises :class:`QuantityError` on a bad pair.

    Short strings are cached (the result is immutable): every review parses each
    envelope twice or more, and a cluster's pod templates repeat a few strings. Long
    ones are not, so a caller cannot make the cache hold megabytes."""
    return _parse_cached(text) if len(text) <= 256 else _parse_envelope(text)


def _parse_envelope(text: str) -> EnvelopeString:
    return EnvelopeString(raw=text, pairs=tuple(_pairs(text)))


_parse_cached = lru_cache(maxsize=4096)(_parse_envelope)


def _amount(resources: Any, section: str, name: str) -> Decimal | None:
    """A container's amount of ``name``: for requests, the request or else the limit it
    defaults from (as Pods do); for limits, the limit."""
    if not isinstance(resources, dict):
        return None
    value = (resources.get(section) or {}).get(name)
    if value is None and section == "requests":
        value = (resources.get("limits") or {}).get(name)
    return None if value is None else parse_quantity(value)


def pod_amount(spec: dict[str, Any], name: str, section: str = "requests") -> Decimal:
    """What a pod asks of a node (or a quota) for one resource, by Kubernetes' rules.

    Containers add up; restartable init containers (sidecars) add to the total and to
    every later init container; the pod needs the larger of that sum and its largest
    init step; overhead is added (``k8s.io/component-helpers/resource.PodRequests``; to a
    limit only when it is not zero, ``PodLimits``).
    With pod-level ``spec.resources``, requests are those of the Pod the API server
    makes of this spec: a missing pod-level request defaults to the containers'
    aggregate request when any container asks for the resource, and to the pod-level
    limit only when none does (``pkg/apis/core/v1/defaults.go``, see
    ``app.k8s.defaulting.default_pod``); pod-level limits replace the aggregate limit.
    """
    if section == "requests" and isinstance(spec.get("resources"), dict):
        return effective_pod_requests(spec, is_pod=False).get(name, Decimal(0))
    pod_level = _amount(spec.get("resources"), section, name) if section == "limits" else None
    if pod_level is None:
        total = Decimal(0)
        for c in spec.get("containers") or []:
            total += _amount(c.get("resources") if isinstance(c, dict) else None,
                             section, name) or 0
        sidecars = Decimal(0)
        init_peak = Decimal(0)
        for c in spec.get("initContainers") or []:
            if not isinstance(c, dict):
                continue
            amount = _amount(c.get("resources"), section, name) or Decimal(0)
            if c.get("restartPolicy") == "Always":
                total += amount
                sidecars += amount
                step = sidecars
            else:
                step = amount + sidecars
            init_peak = max(init_peak, step)
        pod_level = max(total, init_peak)
    overhead = (spec.get("overhead") or {}).get(name)
    if overhead is None or (section == "limits" and not pod_level):
        return pod_level  # PodLimits adds the overhead to non-zero limits only
    return pod_level + parse_quantity(overhead)


def pod_level_cpu_request_default(spec: dict[str, Any]) -> object | None:
    """The pod-level CPU request the API server gives a Pod made from ``spec`` when
    ``spec.resources`` sets no CPU request: the containers' aggregate CPU request
    when any container (after request-from-limit defaulting) asks for CPU, else the
    pod-level CPU limit; None without pod-level limits (nothing is defaulted then).
    (``pkg/apis/core/v1/defaults.go`` ``defaultPodRequests``; ``app.k8s.scheduling``.)"""
    resources = spec.get("resources")
    if not isinstance(resources, dict) or not isinstance(resources.get("limits"), dict):
        return None
    if isinstance(resources.get("requests"), dict) and "cpu" in resources["requests"]:
        request: object = resources["requests"]["cpu"]
        return request
    defaulted = default_pod({"spec": spec})["spec"].get("resources") or {}
    return (defaulted.get("requests") or {}).get("cpu")


def move_pod_level_cpu_limit(spec: dict[str, Any]) -> tuple[object, object | None] | None:
    """Remove ``spec.resources.limits.cpu`` and write the pod-level CPU request the
    Pod would have had with the limit in place (``pod_level_cpu_request_default``),
    so stripping the limit does not change the request. Returns ``(removed value,
    request written or None)`` or None when there was no pod-level CPU limit."""
    resources = spec.get("resources")
    if not isinstance(resources, dict):
        return None
    limits = resources.get("limits")
    if not isinstance(limits, dict) or "cpu" not in limits:
        return None
    request = pod_level_cpu_request_default(spec)
    value = limits.pop("cpu")
    requests = resources.get("requests")
    if isinstance(requests, dict) and "cpu" in requests:
        return value, None
    if request is None:
        return value, None
    if not isinstance(requests, dict):
        requests = {}
        resources["requests"] = requests
    requests["cpu"] = request
    return value, request
