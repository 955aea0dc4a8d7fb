"""``defaultMode``: one value that lowers every unlisted rule (warn-first adoption)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cluster.view import StaticView
from app.core.config import ConfigError, Mode, Policy, capped, load_policy
from app.core.engine import check_object
from app.core.ruleset import default_ruleset
from app.rules.base import Subject

RULES = default_ruleset()

DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "team"},
    "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
        "metadata": {"labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "nginx", "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"cpu": "2", "memory": "2Gi"}}}]}}},
}


def test_capped_only_lowers() -> None:
    assert [capped(m, None) for m in Mode] == list(Mode)
    assert capped(Mode.ENFORCE, Mode.WARN) is Mode.WARN
    assert capped(Mode.WARN, Mode.WARN) is Mode.WARN
    assert capped(Mode.OFF, Mode.WARN) is Mode.OFF
    assert capped(Mode.OFF, Mode.ENFORCE) is Mode.OFF
    assert capped(Mode.WARN, Mode.OFF) is Mode.OFF


def test_warn_lowers_every_enforcing_default_and_keeps_listed_modes() -> None:
    policy = Policy.model_validate({"defaultMode": "warn", "rules": {"pod-fits-node": "enforce",
                                                                    "memory-limit": "off"}})
    modes = RULES.modes(policy)
    for rid, rule in RULES.rules.items():
        if rid == "pod-fits-node":
            assert modes[rid] is Mode.ENFORCE
        elif rid == "memory-limit":
            assert modes[rid] is Mode.OFF
        elif rule.default_mode is Mode.OFF:
            assert modes[rid] is Mode.OFF, rid
        else:
            assert modes[rid] is Mode.WARN, rid
    assert any(r.default_mode is Mode.ENFORCE for r in RULES.rules.values())


def test_off_turns_every_unlisted_rule_off() -> None:
    modes = RULES.modes(Policy.model_validate({"defaultMode": "off", "rules": {"cpu-limits": "warn"}}))
    assert modes.pop("cpu-limits") is Mode.WARN
    assert set(modes.values()) == {Mode.OFF}


def test_unset_and_enforce_are_the_rules_own_defaults() -> None:
    own = {rid: r.default_mode for rid, r in RULES.rules.items()}
    assert RULES.modes(Policy()) == own
    assert RULES.modes(Policy.model_validate({"defaultMode": "enforce"})) == own


def test_warn_first_changes_nothing_and_says_what_it_would_do() -> None:
    subject = Subject("apps", "v1", "Deployment", "CREATE", "team", "web", DEPLOYMENT)
    enforced = check_object(RULES, subject, StaticView([]), Policy())
    warned = check_object(RULES, subject, StaticView([]), Policy.model_validate({"defaultMode": "warn"}))
    assert enforced.patch and not warned.patch
    said = [(f.rule, f.severity, f.message) for f in warned.findings]
    assert any(rule == "cpu-limits" and severity == "warning" and "warn mode" in message
               for rule, severity, message in said), said
    assert not any(severity == "error" for _, severity, _ in said), said


def test_environment_and_file(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("defaultMode: warn\n")
    assert load_policy(config, {}, RULES).default_mode is Mode.WARN
    assert load_policy(config, {"ENVELOPE_DEFAULT_MODE": "off"}, RULES).default_mode is Mode.OFF
    with pytest.raises(ConfigError, match=r"ENVELOPE_DEFAULT_MODE='wran'.*did you mean 'warn'"):
        load_policy(None, {"ENVELOPE_DEFAULT_MODE": "wran"}, RULES)
    config.write_text("defaultMode: strict\n")
    with pytest.raises(ConfigError, match="defaultMode"):
        load_policy(config, {}, RULES)
