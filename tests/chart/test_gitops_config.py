"""`envelope gitops-config` and docs/gitops.md: the page shows exactly what the command
prints, and what the command prints follows the rule set and the policy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from app.chart.gitops import WEBHOOKS, argocd_config, flux_config, touched_paths
from app.core.config import Policy
from tests.conftest import RULES

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "gitops.md"
BLOCK = re.compile(r"<!-- generated: envelope gitops-config (--argocd|--flux) -->\n```yaml\n(.*?)```\n",
                   re.S)


def command(flag: str) -> str:
    done = subprocess.run([sys.executable, "-m", "app", "gitops-config", flag], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_the_page_shows_what_the_command_prints() -> None:
    blocks = dict(BLOCK.findall(DOC.read_text()))
    assert set(blocks) == {"--argocd", "--flux"}, "docs/gitops.md lost a generated block"
    for flag, text in blocks.items():
        assert text == command(flag), f"docs/gitops.md is stale: regenerate with " \
                                      f"`envelope gitops-config {flag}`"


def test_argo_ignores_what_envelope_removes_or_rewrites_and_nothing_it_only_adds() -> None:
    docs = list(yaml.safe_load_all(argocd_config(RULES, Policy())))
    entries = {(e["group"], e["kind"]): e["jqPathExpressions"] for e in docs[0]["spec"]["ignoreDifferences"]}
    assert entries[("apps", "Deployment")] == [
        '.spec.template.spec.containers[]?.env[]? | select(.name == "RESOURCE_LIMITS") | .value',
        ".spec.template.spec.containers[]?.resources.limits.cpu",
        # init containers and restartable sidecars: the string envelope too (issue 37)
        '.spec.template.spec.initContainers[]?.env[]? | select(.name == "RESOURCE_LIMITS") | .value',
        ".spec.template.spec.initContainers[]?.resources.limits.cpu",
        ".spec.template.spec.resources.limits.cpu"]
    assert entries[("batch", "CronJob")][1] == \
        ".spec.jobTemplate.spec.template.spec.containers[]?.resources.limits.cpu"
    assert len(entries) == 8  # every workload kind the mutating rules judge
    for paths in entries.values():
        assert not [p for p in paths if "limits.memory" in p or "requests" in p or "annotations" in p]
    assert docs[0]["spec"]["syncPolicy"]["syncOptions"] == ["RespectIgnoreDifferences=true"]
    hooks = docs[1]["spec"]["ignoreDifferences"]
    assert [(h["kind"], h["name"], h["jqPathExpressions"]) for h in hooks] == [
        (kind, "envelope", [".webhooks[]?.failurePolicy"]) for kind in WEBHOOKS]


def test_the_fields_follow_the_rule_modes_and_names() -> None:
    added = {t.path for t in touched_paths(RULES, Policy()) if t.kind == "Deployment" and t.op == "add"}
    assert ".spec.template.spec.containers[]?.resources.limits.memory" in added
    assert ".spec.template.spec.containers[]?.resources.requests.cpu" in added
    assert '.metadata.annotations["envelope.io/mutations"]' in added
    off = Policy.model_validate({"rules": {"cpu-limits": "off", "env-envelope-cpu": "off"}})
    assert [t for t in touched_paths(RULES, off) if t.op != "add"] == []
    assert "jqPathExpressions" not in argocd_config(RULES, off).split("---")[0]
    renamed = Policy.model_validate({"envelopeEnv": {"limits": "SIZE"}})
    assert 'select(.name == "SIZE")' in argocd_config(RULES, renamed)
    # warn mode changes nothing in the cluster: nothing to ignore
    warn = Policy.model_validate({"rules": {"cpu-limits": "warn", "env-envelope-cpu": "warn"}})
    assert [t for t in touched_paths(RULES, warn) if t.op != "add"] == []


def test_flux_pointers_cover_every_webhook_of_each_configuration() -> None:
    spec = yaml.safe_load(flux_config("prod"))["spec"]["driftDetection"]
    assert spec["mode"] == "enabled"
    assert [(r["target"]["kind"], r["target"]["name"], r["paths"]) for r in spec["ignore"]] == [
        ("MutatingWebhookConfiguration", "prod-envelope", ["/webhooks/0/failurePolicy"]),
        ("ValidatingWebhookConfiguration", "prod-envelope",
         [f"/webhooks/{i}/failurePolicy" for i in range(3)])]


def test_the_webhook_order_is_the_charts() -> None:
    """Flux's pointers need each webhook's position: the chart's, with every family on."""
    from tests.helpers.chart import render

    rendered = render({"webhooks": {"quotas": {"enabled": True}, "actors": {"enabled": True}}})
    for kind, names in WEBHOOKS.items():
        assert tuple(w["name"] for w in rendered.one(kind)["webhooks"]) == names


def test_the_jq_paths_remove_the_string_envelope_from_every_container() -> None:
    """Issue 37 class 6, on an object: each ``jqPathExpressions`` entry run as Argo CD's
    normalizer runs it (``del(<expr>)``; jq here, gojq there) takes the rewritten
    RESOURCE_LIMITS value out of containers, init containers and restartable sidecars
    alike, and nothing else."""
    import json
    import shutil

    import pytest

    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("no jq binary")
    docs = list(yaml.safe_load_all(argocd_config(RULES, Policy())))
    paths = next(e["jqPathExpressions"] for e in docs[0]["spec"]["ignoreDifferences"]
                 if e["kind"] == "Deployment")
    env = [{"name": "RESOURCE_LIMITS", "value": "memory=1Gi"}, {"name": "OTHER", "value": "x"}]
    box = {"name": "c", "image": "i", "env": env, "resources": {"limits": {"memory": "1Gi"}}}
    live = {"spec": {"template": {"spec": {
        "containers": [box], "initContainers": [{**box, "name": "i"},
                                                {**box, "name": "s", "restartPolicy": "Always"}]}}}}
    out = live
    for path in paths:
        done = subprocess.run([jq, "-c", f"del({path})"], input=json.dumps(out), text=True,
                              capture_output=True, timeout=30, check=True)
        out = json.loads(done.stdout)
    spec = out["spec"]["template"]["spec"]
    for c in (*spec["containers"], *spec["initContainers"]):
        assert c["env"] == [{"name": "RESOURCE_LIMITS"}, {"name": "OTHER", "value": "x"}], c
        assert c["resources"] == {"limits": {"memory": "1Gi"}}
