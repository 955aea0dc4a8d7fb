"""The string envelopes of the workload family: ``env-envelope-cpu`` (drop the cpu pair of
``RESOURCE_LIMITS="cpu=7,memory=29Gi"``) and ``env-envelope-consistency`` (the two
envelopes agree on memory; a CPU limit covers the request).

Each value is judged as the container sees it: the last entry of its name after the
kubelet's ``$(VAR)`` expansion (``app/k8s/envexpand.py``); text that came from another
variable is named, never shown. Parsing is ``app/rules/envelope.py``; rule pages:
docs/rules/.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.cluster.view import ClusterView
from app.core.config import Mode, Policy
from app.k8s.envexpand import EnvValue, container_env, references
from app.k8s.podspec import WORKLOAD_KINDS, containers, pod_resources, well_formed
from app.k8s.quantity import QuantityError, parse_quantity
from app.k8s.util import cut, shown
from app.rules.base import Finding, Ratchet, Subject, change, error, rule, warning
from app.rules.envelope import EnvelopeString, PairError, parse_envelope_string, without_written_cpu
from app.rules.workloads.cpu import keeps_cpu_limit

_WRITTEN_LIMIT = 200
"""How much of an env value as written a message shows (a string envelope is tens of
characters; the rest is cut, with its length)."""


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
