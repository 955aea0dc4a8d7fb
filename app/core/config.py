"""Policy configuration: a mode per rule, names the rules read, the failure mode.

One YAML file (``--config``), overridable by environment variables:

- ``ENVELOPE_FAILURE_MODE=deny|allow``
- ``ENVELOPE_DEFAULT_MODE=enforce|warn|off`` (the ``defaultMode`` ceiling)
- ``ENVELOPE_RULE_<RULE_ID>=enforce|warn|off`` (rule id upper-cased, ``-`` -> ``_``)

Invalid configuration raises :class:`ConfigError` naming the bad key, which stops
startup.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Iterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from app.k8s.quantity import parse_quantity
from app.k8s.selectors import StrictLabelSelector

__all__ = ["ConfigError", "DelegatedExceptions", "KnownRules", "MemoryBelowLimit", "Mode", "Policy",
           "capped", "load_policy", "parse_policy"]


class KnownRules(Protocol):
    """What the policy is checked against: the rule ids and their environment variables.
    :class:`app.core.ruleset.RuleSet` is one; it sits above this module in the layers
    (docs/architecture.md), so it is named here by what is asked of it."""

    def __iter__(self) -> Iterator[str]: ...

    def unknown(self, rule_ids: Iterable[str]) -> list[str]: ...

    def env_names(self) -> dict[str, str]: ...


class Mode(StrEnum):
    ENFORCE = "enforce"
    WARN = "warn"
    OFF = "off"


#: The order of modes, for ``defaultMode``'s ceiling: off < warn < enforce.
_STRENGTH = {Mode.OFF: 0, Mode.WARN: 1, Mode.ENFORCE: 2}


def capped(mode: Mode, ceiling: Mode | None) -> Mode:
    """``mode``, lowered to ``ceiling`` when that is weaker (``defaultMode``)."""
    if ceiling is None or _STRENGTH[mode] <= _STRENGTH[ceiling]:
        return mode
    return ceiling


class ConfigError(ValueError):
    """Configuration that cannot be used; the message names the key."""


class EnvelopeEnv(BaseModel):
    """Container env vars that carry string envelopes (``cpu=7,memory=29Gi``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    limits: str = "RESOURCE_LIMITS"
    requests: str = "RESOURCE_REQUESTS"


def _quantity(value: str) -> str:
    if parse_quantity(value) < 0:
        raise ValueError(f"{value!r} is negative")
    return value


Quantity = Annotated[str, AfterValidator(_quantity)]


class ActorSettings(BaseModel):
    """Micro-VM sizing: guest RAM = memory limit - VMM reserve, and below the guest
    minimum the VM cannot boot. The runtime's ``--vmm-mem-reserve-mib`` changes the
    reserve, so both are settings, never literals."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    vmm_reserve: Quantity = Field("128Mi", alias="vmmReserve")
    guest_minimum: Quantity = Field("128Mi", alias="guestMinimum")


class Taint(BaseModel):
    """A node taint, as in a Node's ``spec.taints``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeShape(BaseModel):
    """A node an autoscaler can create that does not exist yet (issue 12, class 10): an
    empty node with this allocatable, labels and taints (e.g. one per instance type of a
    Karpenter NodePool or per cluster-autoscaler node group). ``pod-fits-node`` warns
    instead of refusing a pod that fits no current node but fits one of these."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    name: str = Field(min_length=1)
    """Named in messages: ``would fit a node that <name> can create``."""
    allocatable: dict[str, Quantity] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)


class NodeSettings(BaseModel):
    """What a node keeps back from its allocatable before pods are judged to fit."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    reserve_cpu: Quantity = Field("0", alias="reserveCpu")
    reserve_memory: Quantity = Field("0", alias="reserveMemory")
    sandbox_parent_reserve_memory: Quantity = Field("0", alias="sandboxParentReserveMemory")
    """Per-node memory kept for sandbox parent processes (the runtime that hosts
    sandboxes outside any pod's cgroup), added to ``reserve_memory`` by ``pod-fits-node``;
    0 leaves it off."""
    autoscaled_shapes: list[NodeShape] = Field(default_factory=list, alias="autoscaledShapes")
    """Nodes an autoscaler can add (see :class:`NodeShape`); the reserves apply to them too."""
    name_in_messages: bool = Field(False, alias="nameInMessages")
    """Whether messages may name nodes and Karpenter NodePools, and say the room left
    under a NodePool's limits (cluster-scoped: a namespace user usually cannot read
    them). Off: ``pod-fits-node`` describes the closest node's shape instead, and says
    "a Karpenter NodePool" without its name or what is left under its limits."""


class RuleException(BaseModel):
    """Where rules do not apply: every condition given must hold (namespaces, selectors,
    kinds), like a Kyverno PolicyException. Exempted objects are reported as ``skip``
    with the reason, logged and counted, never silently passed."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    rules: list[str] = Field(min_length=1)
    """Rule ids, or ``"*"`` for every rule."""
    namespaces: list[str] | None = None
    namespace_selector: StrictLabelSelector | None = Field(None, alias="namespaceSelector")
    """Labels of the object's Namespace (the view must hold Namespaces: ``envelope serve``
    watches them when an exception uses this; ``envelope check`` reads them from the files)."""
    object_selector: StrictLabelSelector | None = Field(None, alias="objectSelector")
    """Labels of the object itself (``metadata.labels``; of the old object on DELETE)."""
    kinds: list[str] | None = None
    """``Kind`` or ``group/Kind`` (``Deployment``, ``apps/Deployment``, ``kai.resources/Project``)."""
    reason: str = ""

    @model_validator(mode="after")
    def _narrowed(self) -> RuleException:
        if not (self.namespaces or self.namespace_selector or self.object_selector or self.kinds):
            raise ValueError("an exception needs at least one of namespaces, namespaceSelector, "
                             "objectSelector, kinds (to turn a rule off everywhere, set its mode "
                             "to off)")
        return self


class MemoryBelowLimit(BaseModel):
    """Where a memory request below its limit is written equal (rule ``memory-below-limit``,
    mutate phase) instead of being refused by ``memory-request-equals-limit``: for stacks
    the platform does not own (vendor charts, operator-made workloads). Every condition
    given must hold, as in a :class:`RuleException`; ``namespaces: ["*"]`` is every
    namespace."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    action: Literal["raise-request", "lower-limit"] = "raise-request"
    """``raise-request``: the request becomes the limit (the pods keep the memory the
    vendor allowed them, now reserved: it may no longer fit a node or a quota);
    ``lower-limit``: the limit becomes the request (the pods may be OOM-killed sooner)."""
    namespaces: list[str] | None = None
    namespace_selector: StrictLabelSelector | None = Field(None, alias="namespaceSelector")
    """Labels of the object's Namespace (e.g. ``envelope.io/memory: raise-request``, set by
    whoever may label namespaces)."""

    @model_validator(mode="after")
    def _narrowed(self) -> MemoryBelowLimit:
        if not (self.namespaces or self.namespace_selector):
            raise ValueError("memoryBelowLimit needs namespaces (\"*\" for every namespace) or "
                             "a namespaceSelector")
        return self


class DelegatedExceptions(BaseModel):
    """What namespace owners may exempt their own workloads from with an
    ``EnvelopeException`` (envelope.io/v1alpha1, namespaced, RBAC-gated: docs/configuration.md
    "Delegated exceptions"). Unset: nothing; every EnvelopeException is refused by
    ``exception-allowed`` and none is honoured. Every condition given must hold, as in a
    :class:`MemoryBelowLimit`; ``namespaces: ["*"]`` is every namespace."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    allowed_rules: list[str] = Field(min_length=1, alias="allowedRules")
    """Rule ids an EnvelopeException may name (never ``"*"``: the platform names each)."""
    namespaces: list[str] | None = None
    namespace_selector: StrictLabelSelector | None = Field(None, alias="namespaceSelector")
    """Labels of the EnvelopeException's (and the workload's) Namespace."""

    @model_validator(mode="after")
    def _narrowed(self) -> DelegatedExceptions:
        if not (self.namespaces or self.namespace_selector):
            raise ValueError("delegatedExceptions needs namespaces (\"*\" for every namespace) "
                             "or a namespaceSelector")
        if "*" in self.allowed_rules:
            raise ValueError("delegatedExceptions.allowedRules names rule ids; \"*\" is not "
                             "allowed (name each rule namespace owners may exempt from)")
        return self

    def selects(self, namespace: str | None, labels: Mapping[str, str] | None) -> bool:
        """Whether namespace owners of ``namespace`` (its Namespace's ``labels``; None when
        unknown, which matches no selector) may except."""
        if not namespace:
            return False
        if self.namespaces and "*" not in self.namespaces and namespace not in self.namespaces:
            return False
        return self.namespace_selector is None or (
            labels is not None and self.namespace_selector.matches(dict(labels)))

    def where(self) -> str:
        """The namespaces it delegates to, as a message says them."""
        parts = []
        if self.namespaces:
            parts.append("every namespace" if "*" in self.namespaces
                         else "namespaces " + ", ".join(self.namespaces))
        if self.namespace_selector is not None:
            parts.append("namespaces whose labels match delegatedExceptions.namespaceSelector")
        return " and ".join(parts)


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    rules: dict[str, Mode] = Field(default_factory=dict)
    """Mode per rule id; rules not listed use their own default, capped by ``defaultMode``."""
    default_mode: Mode | None = Field(None, alias="defaultMode")
    """The most a rule not listed in ``rules`` does: ``warn`` runs every rule whose own
    default is ``enforce`` in ``warn`` (warn-first adoption in one value), ``off`` turns
    every unlisted rule off, ``enforce`` or unset leaves each rule's own default. A rule
    listed in ``rules`` has exactly the mode given there; a rule off by default stays off."""
    envelope_env: EnvelopeEnv = Field(default_factory=EnvelopeEnv, alias="envelopeEnv")
    opt_out_annotation: str = Field("envelope.io/keep-cpu-limit", alias="optOutAnnotation")
    failure_mode: Literal["deny", "allow"] = Field("deny", alias="failureMode")
    """What an internal error in a rule answers: ``deny`` (with the reason) or ``allow``."""
    actors: ActorSettings = Field(default_factory=ActorSettings)
    nodes: NodeSettings = Field(default_factory=NodeSettings)
    exceptions: list[RuleException] = Field(default_factory=list)
    allow_object_exemptions: bool = Field(True, alias="allowObjectExemptions")
    """Honour ``exemptAnnotation`` on objects. Anyone who may edit an object may write it,
    so a platform that does not trust its tenants with that turns it off."""
    exempt_annotation: str = Field("envelope.io/exempt", alias="exemptAnnotation")
    """Rule ids (comma-separated) an object exempts itself from."""
    mutations_annotation: str = Field("envelope.io/mutations", alias="mutationsAnnotation")
    """Written on every object Envelope mutates, in the same patch, naming what changed
    (``cpu-limits:app,sidecar;memory-limit:app``); "" writes nothing."""
    memory_below_limit: MemoryBelowLimit | None = Field(None, alias="memoryBelowLimit")
    """Where ``memory-below-limit`` writes a memory request below its limit equal to it
    (off: nowhere; ``memory-request-equals-limit`` refuses it)."""
    admission_plugins: list[Literal["ExtendedResourceToleration"]] = Field(
        default_factory=list, alias="admissionPlugins")
    """Admission plugins the cluster's kube-apiserver enables beyond its defaults that
    change Pods before the webhook (app/k8s/podmodel.py ``admit``): ``ExtendedResourceToleration``
    (off upstream, on in GKE) tolerates the taint of each extended resource a Pod
    requests, so ``pod-fits-node`` judges template Pods with those tolerations."""
    delegated_exceptions: DelegatedExceptions | None = Field(None, alias="delegatedExceptions")
    """What namespace owners may exempt with EnvelopeException objects (unset: nothing)."""
    annotate_pods: bool = Field(False, alias="annotatePods")
    """Also annotate Pods (off: their template's owner already carries it, and a Pod
    annotation per pod is noise in every ``kubectl get -o yaml``)."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _env_overrides(environ: Mapping[str, str], rules: KnownRules) -> dict[str, Any]:
    """The ``ENVELOPE_FAILURE_MODE`` and ``ENVELOPE_RULE_*`` overrides, each value checked
    here so that an error names the variable that holds it (not the file, not "defaults")."""
    by_env = rules.env_names()
    data: dict[str, Any] = {}
    modes = [m.value for m in Mode]
    for key, value in sorted(environ.items()):
        if key == "ENVELOPE_FAILURE_MODE":
            if value not in ("deny", "allow"):
                raise ConfigError(f"{key}={value!r}: not a failure mode; use deny or allow"
                                  f"{did_you_mean(value, ('deny', 'allow'))}")
            data["failureMode"] = value
        elif key == "ENVELOPE_DEFAULT_MODE":
            if value not in modes:
                raise ConfigError(f"{key}={value!r}: not a mode; use enforce, warn or off"
                                  f"{did_you_mean(value, modes)}")
            data["defaultMode"] = value
        elif key.startswith("ENVELOPE_RULE_"):
            if key not in by_env:
                raise ConfigError(f"{key}: no such rule{did_you_mean(key, by_env)}; known: "
                                  f"{sorted(by_env)}")
            if value not in modes:
                raise ConfigError(f"{key}={value!r}: not a mode; use enforce, warn or off"
                                  f"{did_you_mean(value, modes)}")
            data.setdefault("rules", {})[by_env[key]] = value
    return data


def _unknown_rules(where: str, unknown: list[str], rules: KnownRules) -> ConfigError:
    named = ", ".join(f"{rid!r}{did_you_mean(rid, rules)}" for rid in unknown)
    return ConfigError(f"{where}: unknown rule id(s) {named}; known: {sorted(rules)}")


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def load_policy(path: str | Path | None, environ: Mapping[str, str] | None, rules: KnownRules) -> Policy:
    """Read the policy file (if any), then apply environment overrides; every rule id
    must be one of ``rules``."""
    text: str | None = None
    if path:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    return parse_policy(text, str(path) if path else "defaults", environ, rules)


def parse_policy(text: str | bytes | None, source: str, environ: Mapping[str, str] | None,
                 rules: KnownRules) -> Policy:
    """:func:`load_policy` on a file's contents already read (``None``: no file), errors
    naming ``source``: the one loader, also for ``serve``'s reloads (app/serve/policyreload.py),
    which digest and parse the same bytes."""
    data: dict[str, Any] = {}
    if text is not None:
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{source}: expected a mapping at the top level")
        data = loaded
    overrides = _env_overrides(os.environ if environ is None else environ, rules)
    if overrides:
        modes = {**(data.get("rules") or {}), **overrides.pop("rules", {})}
        data = {**data, **overrides, **({"rules": modes} if modes else {})}
    try:
        policy = Policy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc
    unknown = rules.unknown(policy.rules)
    for i, exception in enumerate(policy.exceptions):
        bad = rules.unknown(r for r in exception.rules if r != "*")
        if bad:
            raise _unknown_rules(f"{source}: exceptions[{i}].rules", bad, rules)
    if policy.delegated_exceptions is not None:
        bad = rules.unknown(policy.delegated_exceptions.allowed_rules)
        if bad:
            raise _unknown_rules(f"{source}: delegatedExceptions.allowedRules", bad, rules)
    if unknown:
        raise _unknown_rules(f"{source}: rules", unknown, rules)
    return policy
