"""The chart's PrometheusRule and Grafana dashboard: rendered, checked by promtool,
and fired by synthetic series in `promtool test rules`."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.audit import AuditMetrics
from app.serve.server import Metrics
from tests.helpers.chart import CHART, render

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "e2e" / "controlplane" / "build-promtool.sh"
ON = {"monitoring": {"prometheusRule": {"enabled": True},
                     "grafanaDashboard": {"enabled": True}}}


def rules_of(values: dict[str, Any] | None = None) -> dict[str, Any]:
    return render(values or ON).one("PrometheusRule")


def dashboard() -> dict[str, Any]:
    cm = next(d for d in render(ON).docs
              if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    return json.loads(cm["data"]["envelope.json"])


def test_off_by_default() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in render().docs}
    assert not any(k == "PrometheusRule" or n.endswith("-dashboard") for k, n in kinds)


def _exprs() -> list[str]:
    exprs = [r["expr"] for g in rules_of()["spec"]["groups"] for r in g["rules"]]
    exprs += [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]
    return exprs


def test_every_envelope_metric_used_exists() -> None:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",), "summary": ("_sum", "_count", "")}
    # labelled metrics export no sample before their first use: names from the families
    from app.serve.failurepolicy import PolicyMetrics  # `serve` registers them beside Metrics

    metrics = Metrics()
    PolicyMetrics(metrics.registry)
    exported = {family.name + suffix for registry in (metrics.registry, AuditMetrics().registry)
                for family in registry.collect() for suffix in suffixes.get(family.type, ("",))}
    used = {m for e in _exprs() for m in re.findall(r"\benvelope_[a-z_]+", e)}
    assert used, "no Envelope metric used"
    assert used <= exported, used - exported


def test_dashboard_is_a_grafana_dashboard_file() -> None:
    board = dashboard()
    assert board["uid"] == "envelope" and board["title"] == "Envelope"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        if panel["type"] == "row":  # a row groups the panels below it; it queries nothing
            assert "targets" not in panel
        else:
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
    assert (CHART / "dashboards" / "envelope.json").is_file()


def test_latency_threshold_follows_the_webhook_timeout() -> None:
    def threshold(values: dict[str, Any]) -> str:
        rule = next(r for r in rules_of(values)["spec"]["groups"][0]["rules"]
                    if r["alert"] == "EnvelopeWebhookLatencyNearTimeout")
        return rule["expr"].strip().rsplit(">", 1)[1].strip()

    assert threshold(ON) == "4"
    assert threshold({**ON, "webhooks": {"timeoutSeconds": 3}}) == "2.4"


def _alerts(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [r for g in rules_of(values)["spec"]["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_names_its_runbook_and_links_only_where_the_installer_said() -> None:
    """Each alert's ``runbook`` annotation names its page in the repository (which
    exists); ``runbook_url`` is there only when the installer gave a base
    (``links.docsBaseURL`` or ``runbookBaseURL``): no link to a host the project does
    not control (issue 35)."""
    alerts = _alerts()
    assert len(alerts) == 8
    index = (ROOT / "docs" / "runbooks" / "README.md").read_text()
    for rule in alerts:
        assert "runbook_url" not in rule["annotations"], rule["annotations"]
        page = ROOT / rule["annotations"]["runbook"]
        assert page == ROOT / "docs" / "runbooks" / f"{rule['alert']}.md"
        assert page.is_file(), f"{rule['alert']}: {page.relative_to(ROOT)} does not exist"
        assert page.read_text().startswith(f"# {rule['alert']}\n"), page
        assert f"({rule['alert']}.md)" in index, f"docs/runbooks/README.md does not list {rule['alert']}"
    docs = {"links": {"docsBaseURL": "https://git.example.com/platform/envelope/-/blob/v0.1.0/"},
            "monitoring": {"prometheusRule": {"enabled": True}}}
    urls = {r["alert"]: r["annotations"]["runbook_url"] for r in _alerts(docs)}
    assert urls["EnvelopeNoReadyReplica"] == \
        "https://git.example.com/platform/envelope/-/blob/v0.1.0/docs/runbooks/EnvelopeNoReadyReplica.md"
    assert len(urls) == 8


def test_runbook_base_url_can_point_elsewhere() -> None:
    for extra in ({}, {"links": {"docsBaseURL": "https://git.example.com/envelope"}}):
        values = {**extra, "monitoring": {"prometheusRule": {
            "enabled": True, "runbookBaseURL": "https://wiki.example.com/envelope/"}}}
        urls = {r["alert"]: r["annotations"]["runbook_url"] for r in _alerts(values)}
        assert urls["EnvelopeNoReadyReplica"] == "https://wiki.example.com/envelope/EnvelopeNoReadyReplica.md"
        assert all(u.startswith("https://wiki.example.com/envelope/Envelope") for u in urls.values())


# ----------------------------------------------------------------- promtool (e2e)

def promtool() -> Path:
    override = os.environ.get("ENVELOPE_PROMTOOL_BIN")
    if override:
        return Path(override) / "promtool"
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not done.stdout.strip():
        pytest.fail(f"{BUILD.name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
                    pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1]) / "promtool"


NS = "envelope-system"
HOOK = "workloads.validate.envelope.io"
LATENCY = "apiserver_admission_webhook_admission_duration_seconds_bucket"


def _tests(rules: dict[str, Any]) -> dict[str, Any]:
    by_name = {r["alert"]: r for r in rules["spec"]["groups"][0]["rules"]}

    def annotations(alert: str, **values: str) -> dict[str, str]:
        out = {}
        for key, text in by_name[alert]["annotations"].items():
            for placeholder, value in values.items():
                text = text.replace("{{ " + placeholder + " }}", value)
            out[key] = text
        return out

    return {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": f'envelope_certificate_expiry_timestamp_seconds{{namespace="{NS}",pod="a"}}',
             "values": "259200x180"},  # 3 days after the epoch: expires within 7 days
            {"series": f'envelope_certificate_expiry_timestamp_seconds{{namespace="{NS}",pod="b"}}',
             "values": "100000000x180"},
            {"series": f'kube_deployment_status_replicas_available{{namespace="{NS}",deployment="envelope"}}',
             "values": "0x30"},
            {"series": f'envelope_watch_synced{{namespace="{NS}",pod="a",kind="Node"}}', "values": "0x30"},
            {"series": f'envelope_watch_synced{{namespace="{NS}",pod="a",kind="LimitRange"}}',
             "values": "1x30"},
            {"series": f'apiserver_admission_webhook_rejection_count{{name="{HOOK}",'
                       f'error_type="calling_webhook_error"}}', "values": "0+60x30"},
            {"series": 'apiserver_admission_webhook_rejection_count{name="other.example.com",'
                       'error_type="calling_webhook_error"}', "values": "0+60x30"},
            {"series": f'envelope_webhook_failure_policy_lowered{{namespace="{NS}",pod="a",'
                       f'configuration="envelope",webhook="{HOOK}"}}', "values": "0x30"},
            {"series": f'envelope_webhook_failure_policy_resets_total{{namespace="{NS}",pod="a",'
                       'configuration="envelope"}', "values": "0 1 2 3 4 5 6 7 8 9 10x20"},
            {"series": f'envelope_webhook_failure_policy_lowered{{namespace="{NS}",pod="a",'
                       f'configuration="other",webhook="{HOOK}"}}', "values": "0 1x30"},
            {"series": f'{LATENCY}{{name="{HOOK}",le="2.5"}}', "values": "0x30"},
            {"series": f'{LATENCY}{{name="{HOOK}",le="10"}}', "values": "0+100x30"},
            {"series": f'{LATENCY}{{name="{HOOK}",le="+Inf"}}', "values": "0+100x30"},
            # quota trees: pool rtx 2 cards over, pool a100 fits, a department over (not a pool)
            {"series": f'envelope_quota_overcommit{{namespace="{NS}",pool="rtx",department="",'
                       f'resource="gpu"}}', "values": "2x30"},
            {"series": f'envelope_quota_overcommit{{namespace="{NS}",pool="a100",department="",'
                       f'resource="gpu"}}', "values": "0x30"},
            {"series": f'envelope_quota_overcommit{{namespace="{NS}",pool="a100",department="d",'
                       f'resource="gpu"}}', "values": "3x30"},
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "EnvelopeQuotaPoolOvercommitted", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "EnvelopeQuotaPoolOvercommitted", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "namespace": NS, "pool": "rtx"},
                "exp_annotations": annotations("EnvelopeQuotaPoolOvercommitted", **{
                    "$labels.pool": "rtx", "$value": "2"})}]},
            {"eval_time": "2h", "alertname": "EnvelopeCertificateExpiresSoon", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "namespace": NS, "pod": "a"},
                "exp_annotations": annotations("EnvelopeCertificateExpiresSoon", **{
                    "$labels.pod": "a", "$value | humanizeDuration": "2d 22h 0m 0s"})}]},
            {"eval_time": "4m", "alertname": "EnvelopeNoReadyReplica", "exp_alerts": []},
            {"eval_time": "10m", "alertname": "EnvelopeNoReadyReplica", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "namespace": NS, "deployment": "envelope"},
                "exp_annotations": annotations("EnvelopeNoReadyReplica")}]},
            {"eval_time": "20m", "alertname": "EnvelopeWatchNotSynced", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "namespace": NS, "pod": "a", "kind": "Node"},
                "exp_annotations": annotations("EnvelopeWatchNotSynced", **{
                    "$labels.pod": "a", "$labels.kind": "Node"})}]},
            {"eval_time": "20m", "alertname": "EnvelopeWebhookErrors", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "name": HOOK},
                "exp_annotations": annotations("EnvelopeWebhookErrors", **{"$labels.name": HOOK})}]},
            # A GitOps sync lowering it every minute (resets), and one that stays lowered.
            {"eval_time": "5m", "alertname": "EnvelopeFailurePolicyLowered", "exp_alerts": []},
            {"eval_time": "15m", "alertname": "EnvelopeFailurePolicyLowered", "exp_alerts": [
                {"exp_labels": {"severity": "warning", "namespace": NS, "configuration": c},
                 "exp_annotations": annotations("EnvelopeFailurePolicyLowered",
                                                **{"$labels.configuration": c})}
                for c in ("envelope", "other")]},
            {"eval_time": "20m", "alertname": "EnvelopeWebhookLatencyNearTimeout", "exp_alerts": [{
                "exp_labels": {"severity": "warning", "name": HOOK},
                "exp_annotations": annotations("EnvelopeWebhookLatencyNearTimeout", **{
                    "$labels.name": HOOK, "$value | humanizeDuration": "9.925s"})}]},
        ],
    }]}


@pytest.mark.e2e
def test_promtool_checks_and_fires_the_alerts(tmp_path: Path) -> None:
    tool = promtool()
    rules = rules_of()
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rules["spec"]["groups"]}))
    check = subprocess.run([str(tool), "check", "rules", "rules.yaml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 8 rules found" in check.stdout + check.stderr
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(_tests(rules), sort_keys=False))
    test = subprocess.run([str(tool), "test", "rules", "tests.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0, test.stdout + test.stderr
