"""Policy configuration: a mode per rule, names the rules read, the failure mode.

One YAML file (``--config``), overridable by environment variables:

- ``ENVELOPE_FAILURE_MODE=deny|allow``
- ``ENVELOPE_RULE_<RULE_ID>=enforce|warn|off`` (rule id upper-cased, ``-`` -> ``_``)

Invalid configuration raises :class:`ConfigError` naming the bad key, which stops
startup.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

__all__ = ["ConfigError", "Mode", "Policy", "load_policy"]


class Mode(StrEnum):
    ENFORCE = "enforce"
    WARN = "warn"
    OFF = "off"


class ConfigError(ValueError):
    """Configuration that cannot be used; the message names the key."""


class EnvelopeEnv(BaseModel):
    """Container env vars that carry string envelopes (``cpu=7,memory=29Gi``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    limits: str = "RESOURCE_LIMITS"
    requests: str = "RESOURCE_REQUESTS"


def _quantity(value: str) -> str:
    from app.quantity import parse_quantity

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


class NodeSettings(BaseModel):
    """What a node keeps back from its allocatable before pods are judged to fit."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    reserve_cpu: Quantity = Field("0", alias="reserveCpu")
    reserve_memory: Quantity = Field("0", alias="reserveMemory")
    sandbox_parent_reserve_memory: Quantity = Field("0", alias="sandboxParentReserveMemory")
    """Per-node memory for sandbox parents (seed 001), used when the
    ``node-sandbox-reserve`` rule is on."""


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    rules: dict[str, Mode] = Field(default_factory=dict)
    """Mode per rule id; rules not listed use their own default."""
    envelope_env: EnvelopeEnv = Field(default_factory=EnvelopeEnv, alias="envelopeEnv")
    opt_out_annotation: str = Field("envelope.io/keep-cpu-limit", alias="optOutAnnotation")
    failure_mode: Literal["deny", "allow"] = Field("deny", alias="failureMode")
    """What an internal error in a rule answers: ``deny`` (with the reason) or ``allow``."""
    actors: ActorSettings = Field(default_factory=ActorSettings)
    nodes: NodeSettings = Field(default_factory=NodeSettings)

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, value: dict[str, Mode]) -> dict[str, Mode]:
        from app.rules import RULES  # late import: rules import this module

        unknown = sorted(set(value) - set(RULES))
        if unknown:
            raise ValueError(f"unknown rule id(s) {unknown}; known: {sorted(RULES)}")
        return value

    def mode(self, rule_id: str) -> Mode:
        try:
            return self._modes[rule_id]
        except KeyError:  # a rule registered after the first call (tests import families late)
            from app.rules.base import RULES

            return self.rules.get(rule_id, RULES[rule_id].default_mode)

    @cached_property
    def _modes(self) -> dict[str, Mode]:
        """Every registered rule's mode, computed once: ``mode()`` is on the hot path."""
        from app.rules import RULES

        return {rid: self.rules.get(rid, rule.default_mode) for rid, rule in RULES.items()}


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    from app.rules import RULES

    by_env = {"ENVELOPE_RULE_" + rid.upper().replace("-", "_"): rid for rid in RULES}
    data: dict[str, Any] = {}
    for key, value in environ.items():
        if key == "ENVELOPE_FAILURE_MODE":
            data["failureMode"] = value
        elif key.startswith("ENVELOPE_RULE_"):
            if key not in by_env:
                raise ConfigError(f"{key}: no such rule; known: {sorted(by_env)}")
            data.setdefault("rules", {})[by_env[key]] = value
    return data


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "(top level)"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def load_policy(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Policy:
    """Read the policy file (if any), then apply environment overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = loaded
    overrides = _env_overrides(os.environ if environ is None else environ)
    if overrides:
        rules = {**(data.get("rules") or {}), **overrides.pop("rules", {})}
        data = {**data, **overrides, **({"rules": rules} if rules else {})}
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc
