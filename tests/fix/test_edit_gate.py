"""``envelope check --fail-on change``: a manifest the webhook would mutate fails the run,
and every format says so; Envelope's own examples and CI example pass the gate."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pytest

from app.cli import main

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "docs" / "schemas" / "check-output.v1.json").read_text())

MUTATED = """\
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: shop
spec:
  template:
    spec:
      containers:
      - name: app
        image: nginx
        resources:
          limits: {cpu: 500m, memory: 1Gi}
"""


@pytest.fixture
def manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deploy.yaml").write_text(MUTATED)
    return "deploy.yaml"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(["check", *args])
    return status, capsys.readouterr().out


def test_change_fails_only_with_fail_on_change(manifest: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, manifest)[0] == 0
    assert run(capsys, "--fail-on", "warning", manifest)[0] == 0
    status, out = run(capsys, "--fail-on", "change", manifest)
    assert status == 1
    assert ("fail-on change: 1 object(s) would be mutated by the webhook" in out
            and "envelope fix" in out)


def test_github_annotates_the_objects_line_with_the_patch(manifest: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "-o", "github", "--fail-on", "change", manifest)
    assert status == 1
    line = next(x for x in out.splitlines() if "would mutate" in x)
    assert line.startswith("::error file=deploy.yaml,line=5,title=envelope[cpu-limits] would mutate::")
    assert "CPU limit 500m removed" in line
    patch = json.loads(line.split("%0Apatch: ")[1].split("%0A")[0])
    assert {"op": "remove", "path": "/spec/template/spec/containers/0/resources/limits/cpu"} in patch
    # without the gate the mutation is still shown, as a notice
    _, out = run(capsys, "-o", "github", manifest)
    assert any(x.startswith("::notice file=deploy.yaml,line=5,") for x in out.splitlines())


def test_json_says_what_it_failed_on(manifest: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "-o", "json", "--fail-on", "change", manifest)
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert status == 1 and doc["failOn"] == "change" and doc["failed"] is True
    assert doc["summary"]["mutated"] == 1
    doc = json.loads(run(capsys, "-o", "json", manifest)[1])
    assert doc["failOn"] == "error" and doc["failed"] is False


def test_sarif_and_junit_fail_on_the_change(manifest: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out = run(capsys, "-o", "sarif", "--fail-on", "change", manifest)
    run_ = json.loads(out)["runs"][0]
    levels = {r["ruleId"]: r["level"] for r in run_["results"]}
    assert levels["cpu-limits"] == "error" and run_["invocations"][0]["exitCode"] == 1
    _, out = run(capsys, "-o", "sarif", manifest)
    assert {r["level"] for r in json.loads(out)["runs"][0]["results"]} == {"note"}
    status, out = run(capsys, "-o", "junit", "--fail-on", "change", manifest)
    suite = ET.fromstring(out).find("testsuite")
    assert status == 1 and suite is not None and suite.get("failures") == "1"
    failure = suite.find("testcase[@name='Deployment shop/web']/failure")
    assert failure is not None and "would be mutated" in (failure.get("message") or "")


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").iterdir()
                                          if p.is_dir() and p.name != "ci"))
def test_the_examples_hold_no_change(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The examples show findings on purpose, but nothing the webhook would rewrite: the
    mutation gate adds no failure to them."""
    path = str(ROOT / "examples" / example)
    doc = json.loads(run(capsys, "-o", "json", "--fail-on", "change", path)[1])
    assert doc["summary"]["mutated"] == 0, [o["name"] for o in doc["objects"] if o["patch"]]


def test_the_ci_example_gates_on_change() -> None:
    workflow = (ROOT / "examples" / "ci" / "envelope.yaml").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "--fail-on change" in workflow
    assert "--fail-on change" in readme
