"""``envelope audit`` without a cluster: judging objects as they stand, the reports it
makes (validated against the upstream PolicyReport CRD schema vendored in the chart),
sharding, skipping controller-owned objects, and the metrics.

The same functions against a real kube-apiserver: e2e/test_audit.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import yaml
from prometheus_client import generate_latest

from app.audit import Audit, AuditMetrics, judge, judged_for, policy_of, policy_reports, summary_text
from app.audit import judging as judging_mod
from app.audit import reports as reports_mod
from app.audit import watch as watch_mod
from app.cluster.view import StaticView
from tests.helpers.audit import CPU_LIMIT, DEPLOYMENT, GOOD, MEMORY_SPLIT, RULES, deployment, run

CRDS = Path(__file__).resolve().parents[2] / "charts" / "envelope" / "files" / "crds"


def schema(kind: str) -> dict[str, Any]:
    """The v1alpha2 openAPIV3Schema of the upstream CRD, as JSON Schema (OpenAPI's
    ``format: int32/int64`` are ignored by jsonschema; the rest is the same)."""
    plural = {"PolicyReport": "policyreports", "ClusterPolicyReport": "clusterpolicyreports"}[kind]
    crd = yaml.safe_load((CRDS / f"wgpolicyk8s.io_{plural}.yaml").read_text())
    assert crd["spec"]["names"]["kind"] == kind
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    assert version["served"]
    return version["schema"]["openAPIV3Schema"]


def validate(report: dict[str, Any]) -> None:
    jsonschema.Draft7Validator(schema(report["kind"])).validate(
        orjson.loads(orjson.dumps(report)))  # what goes on the wire


def test_every_judged_kind_has_a_list_path() -> None:
    kinds = {(j.group, j.kind) for j in judged_for(RULES)}
    assert kinds == RULES.kinds


def test_results_say_rule_result_numbers_and_patch() -> None:
    found = run([CPU_LIMIT, MEMORY_SPLIT, GOOD])
    by = {(r.name, r.rule): r for r in found.results}
    assert set(by) == {("cpu", "cpu-limits"), ("mem", "memory-request-equals-limit")}
    mem = by[("mem", "memory-request-equals-limit")]
    assert mem.result == "fail"
    assert "1Gi" in mem.message and "2Gi" in mem.message
    cpu = by[("cpu", "cpu-limits")]
    assert cpu.result == "warn" and "would change" in cpu.message and "CPU limit 2" in cpu.message
    props = dict(cpu.properties)
    assert {"op": "remove", "path": "/spec/template/spec/containers/0/resources/limits/cpu"} in \
        orjson.loads(props["patch"])  # the whole object's patch (with its annotation, if any)
    # Passes: every applicable rule that said nothing, counted per namespace and rule.
    assert found.passes[("team-a", "memory-request-equals-limit")] == 2
    assert found.passes[("team-a", "cpu-limits")] == 2
    assert found.objects == 3


def test_warn_mode_gives_warn_results() -> None:
    found = run([MEMORY_SPLIT], {"ENVELOPE_RULE_MEMORY_REQUEST_EQUALS_LIMIT": "warn"})
    (r,) = found.results
    assert (r.rule, r.result, dict(r.properties)["mode"]) == (
        "memory-request-equals-limit", "warn", "warn")


def test_off_rules_are_not_reported() -> None:
    found = run([MEMORY_SPLIT], {"ENVELOPE_RULE_MEMORY_REQUEST_EQUALS_LIMIT": "off"})
    assert not found.results
    assert ("team-a", "memory-request-equals-limit") not in found.passes


def test_exempt_objects_are_skip_results_with_the_reason() -> None:
    from app.core.config import Policy

    policy = Policy.model_validate({"exceptions": [
        {"rules": ["memory-request-equals-limit"], "namespaces": ["team-a"],
         "reason": "legacy batch"}]})
    annotated = deployment("note", MEMORY_SPLIT["spec"]["template"]["spec"]["containers"][0][
        "resources"], namespace="team-b", annotations={"envelope.io/exempt": "memory-request-equals-limit"})
    # On the pod template too, so the Pods are exempt as well (else the workload is told
    # its Pods are still judged: tests/core/test_exemptions.py).
    annotated["spec"]["template"].setdefault("metadata", {}).setdefault("annotations", {})[
        "envelope.io/exempt"] = "memory-request-equals-limit"
    objs = [MEMORY_SPLIT, annotated]
    view = StaticView(objs, RULES.indexes)
    found = Audit()
    for obj in objs:
        judge(RULES, view, policy, obj, DEPLOYMENT, found)
    skips = {(r.namespace, r.rule): r for r in found.results if r.result == "skip"}
    assert set(skips) == {("team-a", "memory-request-equals-limit"),
                          ("team-b", "memory-request-equals-limit")}
    assert "policy exceptions[0]: legacy batch" in skips[("team-a", "memory-request-equals-limit")].message
    assert "envelope.io/exempt" in skips[("team-b", "memory-request-equals-limit")].message
    assert not [r for r in found.results if r.result == "fail"]
    for report in policy_reports(found):
        validate(report)
        assert report["summary"]["skip"] == 1


def test_a_delegated_exception_is_a_skip_result_naming_it() -> None:
    """An EnvelopeException the policy allows: the excused finding is ``skip`` with the
    exception's name in the PolicyReport, not a failure; one naming a rule the policy does
    not delegate is itself a ``fail`` of exception-allowed (family exceptions)."""
    from app.core.config import Policy

    policy = Policy.model_validate({"delegatedExceptions": {
        "allowedRules": ["memory-request-equals-limit"], "namespaces": ["*"]}})
    exception = {"apiVersion": "envelope.io/v1alpha1", "kind": "EnvelopeException",
                 "metadata": {"name": "vendor", "namespace": "team-a", "uid": "uid-x"},
                 "spec": {"rules": ["memory-request-equals-limit"],
                          "match": {"names": [MEMORY_SPLIT["metadata"]["name"]]},
                          "reason": "vendor chart"}}
    wider = {**exception, "metadata": {**exception["metadata"], "name": "wider", "uid": "uid-y"},
             "spec": {**exception["spec"], "rules": ["pod-fits-node"]}}
    view = StaticView([MEMORY_SPLIT, exception, wider], RULES.indexes)
    found = Audit()
    judge(RULES, view, policy, MEMORY_SPLIT, DEPLOYMENT, found)
    [kind] = [k for k in judged_for(RULES) if k.kind == "EnvelopeException"]
    for obj in (exception, wider):
        judge(RULES, view, policy, obj, kind, found)
    by_rule = {(r.name, r.rule): r for r in found.results}
    skip = by_rule[(MEMORY_SPLIT["metadata"]["name"], "memory-request-equals-limit")]
    assert skip.result == "skip"
    assert skip.message == "exempt: EnvelopeException team-a/vendor: vendor chart"
    assert by_rule[("wider", "exception-allowed")].result == "fail"
    assert ("vendor", "exception-allowed") not in by_rule
    for report in policy_reports(found):
        validate(report)
    assert policy_of("exception-allowed") == ("envelope-exceptions", "Delegated exceptions")


def test_reports_validate_against_the_upstream_crd_schema() -> None:
    queue = {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
             "metadata": {"name": "q", "uid": "uid-q"},
             "spec": {"resources": {"gpu": {"quota": -5, "limit": -1, "overQuotaWeight": 1}}}}
    found = run([CPU_LIMIT, MEMORY_SPLIT, GOOD, deployment("b", GOOD["spec"]["template"]["spec"][
        "containers"][0]["resources"], namespace="team-b"), queue])
    reports = policy_reports(found)
    kinds = {(r["kind"], r["metadata"].get("namespace")) for r in reports}
    assert kinds == {("PolicyReport", "team-a"), ("PolicyReport", "team-b"),
                     ("ClusterPolicyReport", None)}
    for report in reports:
        validate(report)
        assert report["apiVersion"] == "wgpolicyk8s.io/v1alpha2"
        for result in report["results"]:
            assert result["rule"] in RULES and result["source"] == "envelope"
            assert (result["policy"], result["category"]) == policy_of(result["rule"])
    team_a = next(r for r in reports if r["metadata"].get("namespace") == "team-a")
    assert team_a["summary"]["fail"] == 1 and team_a["summary"]["warn"] == 1
    assert team_a["summary"]["pass"] == sum(n for (ns, _), n in found.passes.items()
                                            if ns == "team-a")
    team_b = next(r for r in reports if r["metadata"].get("namespace") == "team-b")
    assert team_b["results"] == [] and team_b["summary"]["pass"] > 0  # fixed: empty report
    cluster = next(r for r in reports if r["kind"] == "ClusterPolicyReport")
    assert cluster["results"] and all(
        x["resources"][0]["kind"] == "Queue" and "namespace" not in x["resources"][0]
        for x in cluster["results"])


def test_the_schema_check_can_fail() -> None:
    report = policy_reports(run([MEMORY_SPLIT]))[0]
    report["results"][0]["result"] = "refused"
    with pytest.raises(jsonschema.ValidationError):
        validate(report)
    report = policy_reports(run([MEMORY_SPLIT]))[0]
    report["results"][0]["properties"]["n"] = 3  # properties are strings upstream
    with pytest.raises(jsonschema.ValidationError):
        validate(report)


def test_large_namespaces_are_sharded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reports_mod, "REPORT_BYTES", 2000)
    bad = [deployment(f"mem-{i}", MEMORY_SPLIT["spec"]["template"]["spec"]["containers"][0][
        "resources"]) for i in range(10)]
    found = run(bad)
    reports = policy_reports(found)
    names = [r["metadata"]["name"] for r in reports]
    assert names[0] == "envelope-audit" and len(names) > 2 and names[1] == "envelope-audit-2"
    assert sum(len(r["results"]) for r in reports) == len(found.results) == 10
    assert sum(r["summary"]["fail"] for r in reports) == 10
    assert sum(r["summary"]["pass"] for r in reports[1:]) == 0
    for r in reports:
        validate(r)
        assert len(orjson.dumps(r["results"])) <= 2000 + 1000


def test_controller_owned_objects_are_skipped() -> None:
    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "x",
              "controller": True}]
    assert judging_mod._owned({"metadata": {"ownerReferences": owner}}, "Pod")
    assert not judging_mod._owned({"metadata": {"ownerReferences": owner}}, "Deployment")
    not_controller = [{**owner[0], "controller": False}]
    assert not judging_mod._owned({"metadata": {"ownerReferences": not_controller}}, "Pod")


def test_metrics_follow_the_last_audit() -> None:
    metrics = AuditMetrics()
    metrics.observe(run([MEMORY_SPLIT, CPU_LIMIT]))
    text = generate_latest(metrics.registry).decode()
    assert ('envelope_audit_violations{namespace="team-a",result="fail",'
            'rule="memory-request-equals-limit"} 1.0') in text
    assert "envelope_audit_last_success_timestamp_seconds" in text
    metrics.observe(run([GOOD]))  # fixed: the series leaves
    text = generate_latest(metrics.registry).decode()
    assert 'rule="memory-request-equals-limit"' not in text
    assert "envelope_audit_objects 1.0" in text


def test_summary_text_names_rule_namespace_and_counts() -> None:
    text = summary_text(run([MEMORY_SPLIT, CPU_LIMIT]))
    assert "fail  Deployment team-a/mem memory-request-equals-limit:" in text
    assert "memory-request-equals-limit" in text and "team-a" in text
    assert "2 objects audited" in text and "1 fail, 1 warn" in text


def test_a_status_update_is_not_a_change_for_the_audit_trigger() -> None:
    from app.cluster.view import Store

    trim = watch_mod._fingerprint("Deployment")
    store = Store()
    store.add(trim({**GOOD, "status": {"replicas": 1}}), "Deployment")
    before = store.version("Deployment")
    store.add(trim({**GOOD, "status": {"replicas": 2},
                    "metadata": {**GOOD["metadata"], "resourceVersion": "9"}}), "Deployment")
    assert store.version("Deployment") == before  # a heartbeat: no audit
    store.add(trim(MEMORY_SPLIT | {"metadata": GOOD["metadata"]}), "Deployment")
    assert store.version("Deployment") != before  # the spec changed: audit


def test_an_object_too_deep_for_orjson_is_fingerprinted_by_its_generation() -> None:
    """A WorkerPool 1,100 levels deep (the API server stores custom resources up to
    10,000) failed the whole watch of its kind: the audit never synced."""
    deep: dict[str, Any] = {}
    node = deep
    for _ in range(1_100):
        node["x"] = {}
        node = node["x"]
    trim = watch_mod._fingerprint("WorkerPool")

    def pool(generation: int, status: str) -> dict[str, Any]:
        return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
                "metadata": {"name": "deep", "namespace": "a", "generation": generation,
                             "resourceVersion": status},
                "spec": {"template": deep}, "status": {"ready": status}}

    first, heartbeat, changed = trim(pool(1, "1")), trim(pool(1, "2")), trim(pool(2, "3"))
    assert first["h"] == heartbeat["h"]  # a status update: no audit
    assert first["h"] != changed["h"]  # the spec changed (the API server moved generation)


def test_results_are_grouped_by_family_for_policy_reporter() -> None:
    """One policy and one category per family, as the rule reference groups rules: Policy
    Reporter's per-policy and per-category views are not one flat list."""
    found = run([CPU_LIMIT, MEMORY_SPLIT])
    results = [r for report in policy_reports(found) for r in report.get("results", [])]
    assert {(r["policy"], r["category"]) for r in results} >= {
        ("envelope-workloads", "Workload resources")}
    assert policy_of("kai-pool-capacity") == ("envelope-quotas", "GPU quota trees")
    assert policy_of("actor-placement") == ("envelope-actors", "Actor sandboxes")
    assert policy_of("internal") == ("envelope", "Envelope")
