"""Envelope's own custom resource: ``EnvelopeException`` (envelope.io/v1alpha1, namespaced),
by which a namespace owner exempts workloads of their namespace from named rules, as far
as the cluster policy's ``delegatedExceptions`` allows (app/core/config.py).

The shape follows Kyverno's PolicyException (https://kyverno.io/docs/exceptions:
``spec.exceptions[].{policyName,ruleNames}`` and ``spec.match.any[].resources.{kinds,names,
selector}``, names with ``*`` wildcards as in ``kyverno create exception --any
"kind=Pod,name=test-*"``), flattened to one match block, every condition given must hold;
Envelope has one policy, so ``spec.rules`` names rule ids. ``match`` needs ``names`` or
``selector`` (an exception never covers a whole namespace by accident).

The sizes below are the CRD schema's limits (charts/envelope/templates/exceptions.yaml)
and what the live view keeps of each object (``trim``), with :data:`MAX_BYTES` over the
whole ``spec``, so an exception costs the webhook at most about 16 KiB however large the
stored object is. An example and who may write one: docs/configuration.md, "Delegated
exceptions". No rules, no I/O.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from app.k8s.selectors import LabelSelector

__all__ = ["GROUP", "KIND", "MAX_BYTES", "MAX_ITEMS", "MAX_NAME", "MAX_REASON", "VERSION",
           "EnvelopeException", "parse", "trim"]

GROUP, VERSION, KIND = "envelope.io", "v1alpha1", "EnvelopeException"
MAX_ITEMS = 32
"""Most rules, kinds, names and selector entries kept (and allowed by the CRD schema)."""
MAX_NAME = 253
"""Longest rule id, kind or object name kept."""
MAX_REASON = 256
MAX_BYTES = 16 * 1024
"""Most JSON bytes of a ``spec``: the list and string limits alone would allow a selector
of 32 expressions of 32 values (a quarter of a MiB); one larger is refused by
``exception-allowed`` and kept by the live view as its size alone (honoured nowhere)."""


@dataclass(frozen=True)
class EnvelopeException:
    """One EnvelopeException, read."""

    namespace: str
    name: str
    rules: tuple[str, ...]
    kinds: tuple[str, ...]
    names: tuple[str, ...]
    selector: LabelSelector | None
    reason: str
    expires: datetime.datetime | None

    @property
    def ref(self) -> str:
        return f"EnvelopeException {self.namespace}/{self.name}"

    def expired(self, now: datetime.datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def matches(self, group: str, kind: str, name: str, labels: dict[str, str]) -> bool:
        """Whether it covers an object of ``group``/``kind`` named ``name`` with ``labels``
        (the caller checks the namespace)."""
        if self.kinds and not ({kind, f"{group}/{kind}"} & set(self.kinds)):
            return False
        if self.names and not any(wildcard_match(name, pattern) for pattern in self.names):
            return False
        return self.selector is None or self.selector.matches(labels)


def wildcard_match(name: str, pattern: str) -> bool:
    """``pattern`` covers ``name``: ``*`` any run of characters, ``?`` one, the rest
    literal. No compiled-pattern cache (``fnmatch`` keeps 32,768 by count, whatever
    their size): at most ``len(name) * len(pattern)`` steps, both at most MAX_NAME.
    ``parse`` bounds patterns; a name is bounded here: the mutating webhook sees a name
    before the API server validates it, and a name longer than any Kubernetes name
    (3 MB fit in a request) would cost seconds a pattern. It is covered by none; the
    API server refuses it anyway."""
    if len(name) > MAX_NAME:
        return False
    n = p = 0
    star, resume = -1, 0
    while n < len(name):
        if p < len(pattern) and pattern[p] in ("?", name[n]):
            n, p = n + 1, p + 1
        elif p < len(pattern) and pattern[p] == "*":
            star, resume, p = p, n, p + 1
        elif star >= 0:
            resume += 1
            n, p = resume, star + 1
        else:
            return False
    return all(c == "*" for c in pattern[p:])


def _strings(value: Any, limit: int = MAX_ITEMS) -> tuple[str, ...] | None:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limit or \
            not all(isinstance(v, str) and 0 < len(v) <= MAX_NAME for v in value):
        return None
    return tuple(value)


def _time(value: Any) -> datetime.datetime | None:
    text = value.replace("Z", "+00:00") if isinstance(value, str) else ""
    found = datetime.datetime.fromisoformat(text)  # ValueError: the caller says so
    return found if found.tzinfo is not None else found.replace(tzinfo=datetime.UTC)


def _size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except (orjson.JSONEncodeError, TypeError):
        return MAX_BYTES + 1


def parse(obj: Any) -> tuple[EnvelopeException | None, list[str]]:
    """The exception, or None and what is wrong with it (``spec.<field>: ...``). The API
    server's schema refuses the same when the chart's CRD is installed; files given to
    ``envelope check`` are read here only."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    spec = obj.get("spec") if isinstance(obj, dict) else None
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None, ["spec: missing; an EnvelopeException needs spec.rules and spec.match"]
    oversized = spec.get("oversized")
    size = oversized if isinstance(oversized, int) else _size(spec)
    if size > MAX_BYTES:
        return None, [f"spec: {size:,} bytes of JSON, over the {MAX_BYTES:,} an exception may "
                      f"hold; name fewer objects, or select them with fewer labels"]
    problems: list[str] = []
    rules = _strings(spec.get("rules"))
    if not rules:
        problems.append(f"spec.rules: a list of 1 to {MAX_ITEMS} rule ids is needed")
    match = spec.get("match")
    match = match if isinstance(match, dict) else {}
    kinds, names = _strings(match.get("kinds")), _strings(match.get("names"))
    if kinds is None:
        problems.append(f"spec.match.kinds: at most {MAX_ITEMS} kinds (Kind or group/Kind)")
    if names is None:
        problems.append(f"spec.match.names: at most {MAX_ITEMS} names of up to {MAX_NAME} "
                        f"characters")
    selector: LabelSelector | None = None
    if match.get("selector") is not None:
        try:
            selector = LabelSelector.model_validate(match["selector"])
            problems += [f"spec.match.selector: {p}" for p in selector.problems()]
        except ValidationError:
            problems.append("spec.match.selector: not a label selector (matchLabels, "
                            "matchExpressions)")
    if not names and selector is None:
        problems.append("spec.match: names or selector is needed (an exception covers named "
                        "workloads, never a whole namespace)")
    reason = spec.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON:
        problems.append(f"spec.reason: a string of at most {MAX_REASON} characters")
        reason = ""
    expires = None
    if spec.get("expires") is not None:
        try:
            expires = _time(spec["expires"])
        except ValueError:
            problems.append(f"spec.expires: {str(spec['expires'])[:64]!r} is not an RFC 3339 "
                            f"time (2027-01-01T00:00:00Z)")
    if problems or not rules:
        return None, problems
    return EnvelopeException(str(meta.get("namespace") or ""), str(meta.get("name") or ""),
                             rules, kinds or (), names or (), selector, reason, expires), []


def trim(obj: dict[str, Any]) -> dict[str, Any]:
    """What the live view keeps of an EnvelopeException: its name, namespace and
    resourceVersion, and ``spec`` with every list cut to :data:`MAX_ITEMS` entries and
    every string to its limit (the CRD schema allows no more; an object stored before
    the CRD was narrowed is kept cut, and read as it is kept); a spec still over
    :data:`MAX_BYTES` is kept as its size alone. So each costs the view at most about
    :data:`MAX_BYTES` plus its name, however large the stored object."""
    found_meta, found_spec = obj.get("metadata"), obj.get("spec")
    meta: dict[str, Any] = found_meta if isinstance(found_meta, dict) else {}
    spec: dict[str, Any] = found_spec if isinstance(found_spec, dict) else {}

    def cut(value: Any) -> Any:
        if isinstance(value, str):
            return value[:MAX_NAME]
        if isinstance(value, list):
            return [cut(v) for v in value[:MAX_ITEMS]]
        if isinstance(value, dict):
            return {str(k)[:MAX_NAME]: cut(v) for k, v in list(value.items())[:MAX_ITEMS]}
        return value if isinstance(value, bool | int | float) or value is None else str(value)[:MAX_NAME]

    found_match = spec.get("match")
    match: dict[str, Any] = found_match if isinstance(found_match, dict) else {}
    kept_spec: dict[str, Any] = {"rules": cut(spec.get("rules")),
                                 "match": {k: cut(match[k]) for k in ("kinds", "names", "selector")
                                           if k in match}}
    if isinstance(spec.get("reason"), str):
        kept_spec["reason"] = spec["reason"][:MAX_REASON]
    if "expires" in spec:
        kept_spec["expires"] = cut(spec["expires"])
    size = _size(kept_spec)
    if size > MAX_BYTES:  # parse() reads it as refused: honoured nowhere
        kept_spec = {"oversized": size}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {k: meta[k] for k in ("name", "namespace", "resourceVersion") if k in meta},
            "spec": kept_spec}
