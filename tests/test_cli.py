"""`envelope check` and configuration, through the real entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main
from app.config import ConfigError, Mode, load_policy
from tests.conftest import RULES

GOOD = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: team-a}
spec:
  template:
    spec:
      containers:
      - name: app
        image: x
        resources:
          limits: {cpu: "7", memory: 29Gi}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: team-a}
"""
BAD = """\
apiVersion: v1
kind: Pod
metadata: {name: api, namespace: team-a}
spec:
  containers:
  - name: api
    image: x
    resources:
      requests: {memory: 1Gi}
      limits: {memory: 2Gi}
"""


def envelope(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], input=stdin, text=True,
                          capture_output=True, timeout=60)


def test_clean_files_exit_0_and_json_shows_the_patch(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    out = envelope("check", "-f", str(tmp_path / "good.yaml"), "--output", "json")
    assert out.returncode == 0, out.stderr
    entries = json.loads(out.stdout)
    assert [(e["kind"], e["name"]) for e in entries] == [("Deployment", "web"),
                                                         ("ConfigMap", "settings")]
    web = entries[0]
    assert set(web) >= {"kind", "apiVersion", "namespace", "name", "findings", "patch"}
    assert {"op": "remove",
            "path": "/spec/template/spec/containers/0/resources/limits/cpu"} in web["patch"]
    assert [f["severity"] for f in web["findings"]] == ["warning"]  # Guaranteed -> Burstable
    assert entries[1]["patch"] == [] and entries[1]["findings"] == []


def test_errors_exit_1_over_a_directory_and_stdin(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "good.yaml").write_text(GOOD)
    (tmp_path / "a" / "bad.yml").write_text(BAD)
    (tmp_path / "a" / "notes.txt").write_text("not a manifest")
    out = envelope("check", "-f", str(tmp_path / "a"))
    assert out.returncode == 1
    assert "memory request 1Gi differs from limit 2Gi" in out.stdout
    assert "3 objects: 1 errors" in out.stdout
    out = envelope("check", "-f", "-", stdin=BAD)
    assert out.returncode == 1 and "<stdin>" in out.stdout


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("kind: [unclosed", "not valid YAML"),
        ("- a\n- b\n", "document 1: expected a Kubernetes object"),
        ("apiVersion: v1\nkind: Pod\n---\nmetadata: {}\n", "document 2: apiVersion is missing"),
    ],
)
def test_parse_errors_exit_2_naming_file_and_document(tmp_path: Path, text: str,
                                                      fragment: str) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    out = envelope("check", "-f", str(path))
    assert out.returncode == 2
    assert str(path) in out.stderr and fragment in out.stderr


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert envelope("check").returncode == 2
    assert envelope("check", "-f", str(tmp_path / "missing.yaml")).returncode == 2


def test_config_file_and_env_overrides(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("rules:\n  cpu-limits: warn\nfailureMode: allow\n"
                    "envelopeEnv: {limits: LIM}\n")
    policy = load_policy(path, {"ENVELOPE_RULE_MEMORY_LIMIT": "off"}, RULES)
    assert RULES.modes(policy)["cpu-limits"] is Mode.WARN
    assert RULES.modes(policy)["memory-limit"] is Mode.OFF
    assert RULES.modes(policy)["memory-request-equals-limit"] is Mode.ENFORCE
    assert policy.failure_mode == "allow"
    assert policy.envelope_env.limits == "LIM"
    assert policy.envelope_env.requests == "RESOURCE_REQUESTS"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("rules:\n  cpu-limit: warn\n", "unknown rule id(s) ['cpu-limit']"),
        ("rules:\n  cpu-limits: sometimes\n", "rules.cpu-limits"),
        ("failureMode: maybe\n", "failureMode"),
        ("optOutAnnotations: x\n", "optOutAnnotations"),
        ("- a\n", "expected a mapping"),
    ],
)
def test_invalid_config_names_the_key(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as info:
        load_policy(path, {}, RULES)
    assert fragment in str(info.value)
    assert main(["check", "--config", str(path), "-f", str(path)]) == 2


def test_unknown_env_rule_is_refused() -> None:
    with pytest.raises(ConfigError, match="ENVELOPE_RULE_NOPE"):
        load_policy(None, {"ENVELOPE_RULE_NOPE": "off"}, RULES)


def test_serve_without_certificates_refuses_to_start() -> None:
    out = envelope("serve", "--port", "0")
    assert out.returncode == 2 and "HTTPS only" in out.stderr
