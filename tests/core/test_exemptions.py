"""Exceptions: rules that do not apply to an object, by policy or by the object's own
annotation — reported as skipped with the reason, counted and logged, never silent."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.cluster.view import StaticView
from app.core.config import ConfigError, Policy, load_policy
from app.serve.server import Metrics, create_app
from tests.conftest import RULES, container, run, workload

BAD_MEMORY = container(requests={"memory": "1Gi"}, limits={"memory": "2Gi", "cpu": "2"})


def deployment(namespace: str = "team-a", labels: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    obj = workload("Deployment", [BAD_MEMORY], namespace=namespace, annotations=annotations)
    if labels is not None:
        obj["metadata"]["labels"] = labels
    return obj


def policy(**exception: Any) -> Policy:
    return Policy.model_validate({"exceptions": [{"rules": ["memory-request-equals-limit"],
                                                  **exception}]})


def rules_hit(result: Any) -> set[str]:
    return {f.rule for f in result.errors}


def test_without_an_exception_the_rule_denies() -> None:
    assert rules_hit(run(deployment())) == {"memory-request-equals-limit"}


@pytest.mark.parametrize(("exception", "obj", "exempt"), [
    ({"namespaces": ["team-a"]}, deployment("team-a"), True),
    ({"namespaces": ["team-b"]}, deployment("team-a"), False),
    ({"kinds": ["Deployment"]}, deployment(), True),
    ({"kinds": ["apps/Deployment"]}, deployment(), True),
    ({"kinds": ["StatefulSet"]}, deployment(), False),
    ({"objectSelector": {"matchLabels": {"tier": "batch"}}}, deployment(labels={"tier": "batch"}), True),
    ({"objectSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]}},
     deployment(labels={"tier": "batch"}), False),
    ({"namespaces": ["team-a"], "kinds": ["StatefulSet"]}, deployment(), False),  # every condition
])
def test_policy_exceptions(exception: dict[str, Any], obj: dict[str, Any], exempt: bool) -> None:
    result = run(obj, policy(reason="migration until Q3", **exception))
    if exempt:
        assert rules_hit(result) == set()
        assert result.skipped == {"memory-request-equals-limit":
                                  "policy exceptions[0]: migration until Q3"}
        assert result.changes, "other rules still run (cpu-limits strips the CPU limit)"
    else:
        assert rules_hit(result) == {"memory-request-equals-limit"} and not result.skipped


def test_namespace_selector_reads_the_namespace_labels() -> None:
    namespaces = [{"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "team-a", "labels": {"envelope.io/tier": "legacy"}}}]
    selected = policy(namespaceSelector={"matchLabels": {"envelope.io/tier": "legacy"}})
    assert run(deployment("team-a"), selected, view=StaticView(namespaces)).skipped
    # a namespace the view does not hold exempts nothing
    assert not run(deployment("team-b"), selected, view=StaticView(namespaces)).skipped


def test_the_object_can_exempt_itself_unless_the_policy_forbids_it() -> None:
    obj = deployment(annotations={"envelope.io/exempt": "memory-request-equals-limit, pod-fits-node"})
    result = run(obj)
    assert rules_hit(result) == set()
    assert result.skipped == {"memory-request-equals-limit": "annotation envelope.io/exempt",
                              "pod-fits-node": "annotation envelope.io/exempt"}
    strict = Policy.model_validate({"allowObjectExemptions": False})
    assert rules_hit(run(obj, strict)) == {"memory-request-equals-limit"}
    everything = deployment(annotations={"envelope.io/exempt": "*"})
    assert rules_hit(run(everything)) == {"memory-request-equals-limit"}  # only rule ids


def test_an_exemption_on_the_workload_is_copied_to_its_pod_template() -> None:
    """Only the template's annotations reach the Pods (app/k8s/podmodel.py): a Deployment
    exempting itself gets the annotation copied into its template (template-opt-outs),
    so its Pods are exempt too; with that rule off, it is told its Pods are still judged."""
    only_workload = deployment(annotations={"envelope.io/exempt": "memory-request-equals-limit"})
    result = run(only_workload)
    assert rules_hit(result) == set()
    assert result.obj["spec"]["template"]["metadata"]["annotations"] == {
        "envelope.io/exempt": "memory-request-equals-limit"}
    assert not [f for f in result.warnings if "still judges" in f.message]
    off = Policy.model_validate({"rules": {"template-opt-outs": "off"}})
    said = [f for f in run(only_workload, off).warnings if f.rule == "memory-request-equals-limit"]
    assert len(said) == 1 and "spec.template" not in said[0].message
    assert "still judges every Pod it makes" in said[0].message
    both = workload("Deployment", [BAD_MEMORY], namespace="team-a",
                    annotations={"envelope.io/exempt": "memory-request-equals-limit"},
                    template_annotations={"envelope.io/exempt": "memory-request-equals-limit"})
    assert not [f for f in run(both).warnings if "still judges" in f.message]
    assert not [c for c in run(both).changes if c.rule == "template-opt-outs"]
    pod = workload("Pod", [BAD_MEMORY], annotations={"envelope.io/exempt": "memory-request-equals-limit"})
    assert not [f for f in run(pod).warnings if "still judges" in f.message]
    # a template with its own value keeps it (and is told which rule does not reach)
    other = workload("Deployment", [BAD_MEMORY], namespace="team-a",
                     annotations={"envelope.io/exempt": "memory-request-equals-limit"},
                     template_annotations={"envelope.io/exempt": "pod-fits-node"})
    kept = run(other)
    assert kept.obj["spec"]["template"]["metadata"]["annotations"] == {
        "envelope.io/exempt": "pod-fits-node"}
    assert [f for f in kept.warnings if "still judges" in f.message]
    # where objects may not exempt themselves, nothing is copied
    closed = Policy.model_validate({"allowObjectExemptions": False})
    assert not [c for c in run(only_workload, closed).changes if c.rule == "template-opt-outs"]


def test_the_keep_cpu_limit_opt_out_on_the_workload_reaches_its_pods() -> None:
    obj = workload("Deployment", [container(limits={"cpu": "2", "memory": "1Gi"})],
                   annotations={"envelope.io/keep-cpu-limit": "true"})
    result = run(obj)
    assert [op["path"] for op in result.patch] == [
        "/metadata/annotations/envelope.io~1mutations", "/spec/template/metadata"]
    assert result.obj["spec"]["template"]["metadata"]["annotations"] == {
        "envelope.io/keep-cpu-limit": "true"}
    assert result.obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"
    # the Pod its controller makes carries the template's annotations: the CPU limit stays
    pod = workload("Pod", [container(limits={"cpu": "2", "memory": "1Gi"})],
                   annotations=result.obj["spec"]["template"]["metadata"]["annotations"])
    assert run(pod).patch == []
    # a CronJob's also go to its Jobs' metadata, which the Job controller does not need but
    # the Job's own exemption does
    cron = run(workload("CronJob", [BAD_MEMORY], namespace="team-a",
                        annotations={"envelope.io/exempt": "memory-request-equals-limit"}))
    assert cron.obj["spec"]["jobTemplate"]["metadata"]["annotations"] == \
        cron.obj["spec"]["jobTemplate"]["spec"]["template"]["metadata"]["annotations"] == \
        {"envelope.io/exempt": "memory-request-equals-limit"}
    # "false", or an opt-out already on the template, is not copied
    for own, template in (({"envelope.io/keep-cpu-limit": "false"}, None),
                          ({"envelope.io/keep-cpu-limit": "true"},
                           {"envelope.io/keep-cpu-limit": "true"})):
        again = workload("Deployment", [container(limits={"memory": "1Gi"})],
                         annotations=own, template_annotations=template)
        assert not [c for c in run(again).changes if c.rule == "template-opt-outs"]


@pytest.mark.parametrize(("text", "says"), [
    ("exceptions: [{rules: [nope], namespaces: [a]}]", "exceptions[0].rules: unknown rule id(s) 'nope'"),
    ("exceptions: [{rules: [pod-fits-node]}]", "needs at least one of namespaces"),
    ("exceptions: [{rules: [pod-fits-node], objectSelector: {matchLabel: {a: b}}}]", "matchLabel"),
    ("exceptions: [{rules: [], kinds: [Pod]}]", "rules"),
])
def test_bad_exceptions_stop_startup_with_the_key(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="exceptions") as caught:
        load_policy(path, {}, RULES)
    assert says in str(caught.value)


def test_check_shows_the_skip_with_its_reason(tmp_path: Path) -> None:
    import yaml

    (tmp_path / "d.yaml").write_text(yaml.safe_dump(deployment(
        annotations={"envelope.io/exempt": "memory-request-equals-limit"})))
    out = subprocess.run([sys.executable, "-m", "app", "check", "-f", str(tmp_path / "d.yaml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "skip    memory-request-equals-limit: exempt (annotation envelope.io/exempt)" in out.stdout
    out = subprocess.run([sys.executable, "-m", "app", "check", "-f", str(tmp_path / "d.yaml"),
                          "-o", "json"], capture_output=True, text=True, timeout=60)
    [entry] = json.loads(out.stdout)["objects"]
    assert entry["skipped"] == [{"rule": "memory-request-equals-limit",
                                 "reason": "annotation envelope.io/exempt"}]


def test_an_exempted_write_is_counted_and_logged(capsys: pytest.CaptureFixture[str]) -> None:
    metrics = Metrics()
    app = create_app(RULES, Policy(), metrics=metrics)
    obj = deployment(annotations={"envelope.io/exempt": "memory-request-equals-limit"})
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u-9", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                          "operation": "CREATE", "namespace": "team-a", "name": "web", "object": obj}}

    async def post() -> dict[str, Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.post("/validate", content=json.dumps(review),
                                         headers={"content-type": "application/json"})
        return dict(response.json()["response"])

    answer = asyncio.run(post())
    assert answer["uid"] == "u-9" and answer["allowed"] is True
    assert metrics.registry.get_sample_value(
        "envelope_rule_exemptions_total", {"rule": "memory-request-equals-limit"}) == 1.0
    logged = [json.loads(line) for line in capsys.readouterr().err.splitlines() if '"u-9"' in line]
    assert logged and logged[0]["exempted"] == {
        "memory-request-equals-limit": "annotation envelope.io/exempt"}
