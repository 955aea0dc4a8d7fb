"""The rule reference (docs/rules/): a page per rule, generated from its declaration and
app/ruledocs/data/<id>.yaml, whose examples are run here: the failing one must draw the
rule's finding, the fixed one must not, and the committed pages must be what the
generator writes (so a page whose example stops doing what it says fails here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.cli.check import run_check
from app.core.config import Policy
from app.render import render
from app.render.reports import Report
from app.ruledocs import (
    CPU_LIMIT_RULES,
    docs_url,
    family,
    help_for,
    help_uri,
    load_doc,
    pages,
    rule_page_names,
    run_example,
)
from tests.conftest import RULES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "rules"
IDS = sorted(RULES)


def envelope(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ENVELOPE_DOCS_URL", None)
    return subprocess.run([sys.executable, "-m", "app", *args], text=True, capture_output=True,
                          timeout=60, env=env)


def test_every_rule_has_an_entry_and_a_page() -> None:
    assert rule_page_names() == set(RULES), "app/ruledocs/data/<id>.yaml per rule, no other"
    assert {p.name for p in DOCS.glob("*.md")} == {f"{r}.md" for r in RULES} | {"README.md"}


def test_the_committed_pages_are_the_generated_ones() -> None:
    stale = [name for name, text in pages(RULES).items()
             if not (DOCS / name).exists() or (DOCS / name).read_text(encoding="utf-8") != text]
    assert not stale, f"docs/rules/ is stale ({', '.join(stale)}): run `python -m app.ruledocs`"


@pytest.mark.parametrize("rule_id", IDS)
def test_the_failing_example_fails_and_the_fix_passes(rule_id: str) -> None:
    example = load_doc(rule_id).example
    failing = run_example(RULES, example, "failing")
    fixed = run_example(RULES, example, "fixed")
    assert not failing.internal and not fixed.internal, (failing.internal, fixed.internal)
    assert example.expect in failing.by(rule_id), failing.lines()
    assert not fixed.by(rule_id), fixed.lines()
    if example.expect == "error":
        assert RULES[rule_id].default_mode.value == "enforce" or example.policy, rule_id
    # the fix is clean: no rule refuses it
    assert not [f for f in fixed.findings if f.severity == "error"], fixed.lines()


CREATE = [r for r in IDS if r in rule_page_names() and load_doc(r).example.operation == "CREATE"]


@pytest.mark.parametrize("rule_id", CREATE)
def test_create_examples_give_the_same_answer_through_envelope_check(
        rule_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`envelope check` on a file holding the cluster objects and the manifest says about
    the manifest what the page says."""
    example = load_doc(rule_id).example
    for which in ("failing", "fixed"):
        path = tmp_path / f"{which}.yaml"
        manifest = getattr(example, which).strip()
        path.write_text(f"{example.cluster.strip()}\n---\n{manifest}\n" if example.cluster.strip()
                        else manifest + "\n")
        run_check([str(path)], RULES, Policy.model_validate(example.policy), "json")
        objects = json.loads(capsys.readouterr().out)["objects"]
        written = objects[-1]  # the manifest is the last document
        assert written["document"] == len(objects)
        said = {(f["severity"], f["rule"], f["message"]) for f in written["findings"]}
        said |= {("change", c["rule"], c["message"]) for c in written["changes"]}
        engine = {(f.severity, f.rule, f.message) for f in run_example(RULES, example, which).findings}
        refused = {f for f in engine if f[:2] == ("error", "quantities")}
        if refused:  # the API server refuses the object before admission: check says only that
            engine = refused
        assert said == engine, (which, said ^ engine)


def test_every_rule_has_a_family_and_only_cpu_limit_rules_hint_keep_cpu_limit() -> None:
    families = {rid: family(r) for rid, r in RULES.items()}
    assert set(families.values()) == {"workloads", "quotas", "actors", "exceptions"}
    assert all(families[r] == "quotas" for r in IDS if r.startswith("kai-"))
    assert all(families[r] == "actors" for r in IDS if r.startswith("actor-"))
    for rid, rule in RULES.items():
        text = help_for(rule)["text"]
        assert ("keep-cpu-limit" in text) is (rid in CPU_LIMIT_RULES), rid
        assert f"rules: {{{rid}: enforce|warn|off}}" in text
    assert "docs/quotas.md" in help_for(RULES["kai-guarantee-sum"])["text"]
    assert "WorkerPools" in help_for(RULES["actor-placement"])["text"]


def test_sarif_rules_carry_help_uri_and_their_family_hint() -> None:
    log = json.loads(render(Report([], list(RULES.values())), "sarif"))
    rules = {r["id"]: r for r in log["runs"][0]["tool"]["driver"]["rules"]}
    assert set(rules) == set(RULES)
    for rid, r in rules.items():
        assert r["helpUri"] == help_uri(rid) == f"{docs_url()}rules/{rid}.md"
        assert (ROOT / r["helpUri"]).is_file() or not r["helpUri"].startswith("docs/")
        assert ("keep-cpu-limit" in r["help"]["markdown"]) is (rid in CPU_LIMIT_RULES), rid
    assert "keep-cpu-limit" not in rules["kai-shrink"]["help"]["text"]
    assert "keep-cpu-limit" not in rules["actor-placement"]["help"]["text"]


def test_docs_url_is_configurable() -> None:
    assert help_uri("pod-fits-node", {}) == "docs/rules/pod-fits-node.md"
    assert help_uri("pod-fits-node", {"ENVELOPE_DOCS_URL": "https://example.org/envelope/v0.1.0/docs"}) \
        == "https://example.org/envelope/v0.1.0/docs/rules/pod-fits-node.md"


def test_envelope_rules_lists_every_rule_with_family_phase_and_default() -> None:
    out = envelope("rules")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["RULE", "FAMILY", "PHASE", "DEFAULT", "SUMMARY"]
    rows = {line.split()[0]: line.split()[1:4] for line in lines[1:-1]}
    assert rows == {rid: [family(r), r.phase, r.default_mode.value] for rid, r in RULES.items()}
    assert lines[-1].startswith(f"{len(RULES)} rules")
    data = json.loads(envelope("rules", "-o", "json", "--family", "actors").stdout)
    assert data["schemaVersion"] == 1
    assert {r["id"] for r in data["rules"]} == {r for r in RULES if r.startswith("actor-")}
    placement = next(r for r in data["rules"] if r["id"] == "actor-placement")
    assert placement == {"id": "actor-placement", "family": "actors", "phase": "validate",
                         "defaultMode": "enforce", "summary": RULES["actor-placement"].summary,
                         "operations": ["CREATE", "UPDATE"],
                         "kinds": [{"group": "ate.dev", "kind": "ActorTemplate"}],
                         "reads": ["WorkerPool"], "helpUri": "docs/rules/actor-placement.md"}


def test_envelope_explain_prints_the_page_and_refuses_unknown_ids() -> None:
    out = envelope("explain", "kai-guarantee-sum")
    assert out.returncode == 0, out.stderr
    assert out.stdout == (DOCS / "kai-guarantee-sum.md").read_text(encoding="utf-8")
    out = envelope("explain", "pod-fit-node")
    assert out.returncode == 2 and out.stdout == ""
    assert "unknown rule id 'pod-fit-node' (did you mean 'pod-fits-node'?)" in out.stderr


def test_configuration_links_every_rule_to_its_page() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for rid in RULES:
        row = next(line for line in text.splitlines() if line.startswith(f"| `{rid}` |"))
        assert row.endswith(f"| [{rid}.md](rules/{rid}.md) |"), row


def test_check_text_says_where_the_reporting_rules_are_explained(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    example = load_doc("memory-request-equals-limit").example
    (tmp_path / "pod.yaml").write_text(example.failing)
    assert run_check([str(tmp_path / "pod.yaml")], RULES, Policy(), "text") == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2] == ("why and how to fix: envelope explain RULE, or docs/rules/RULE.md, for "
                         "memory-request-equals-limit")
    (tmp_path / "pod.yaml").write_text(example.fixed)
    assert run_check([str(tmp_path / "pod.yaml")], RULES, Policy(), "text") == 0
    assert "envelope explain" not in capsys.readouterr().out  # nothing reported, nothing to explain
