"""The in-tree policy as bench/apiserver.py's ``intree-map`` and ``envelope-intree`` rounds
set it up (bench/peers/intree.py), and the objects they time (bench/peers/objects.py):
the pure helpers, without an API server."""

from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.core.frontdoor import subject_of
from app.core.ruleset import default_ruleset
from app.intree import FACT_LABEL, FACT_VALUE, compile_in_tree

PEERS = Path(__file__).resolve().parents[2] / "bench" / "peers"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_peers_{name}", PEERS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


intree = _load("intree")
objects = _load("objects")

ISOLATED = {"key": "envelope.test/isolated", "operator": "DoesNotExist"}
SELECTOR = {"matchExpressions": [
    {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
     "values": ["kube-system", "envelope-e2e-system"]},
    ISOLATED]}


def _chart_docs(selector: dict[str, Any] = SELECTOR) -> list[dict[str, Any]]:
    """The shape of the chart's rendered webhook configurations."""
    def hook(name: str, conditions: bool) -> dict[str, Any]:
        h: dict[str, Any] = {"name": name, "namespaceSelector": copy.deepcopy(selector),
                             "clientConfig": {"url": f"https://127.0.0.1:1/{name}"}}
        if conditions:
            h["matchConditions"] = [{"name": "envelope-may-mutate", "expression": "old"}]
        return h
    return [{"kind": "MutatingWebhookConfiguration",
             "webhooks": [hook("workloads.mutate.envelope.io", True)]},
            {"kind": "ValidatingWebhookConfiguration",
             "webhooks": [hook("workloads.validate.envelope.io", False)]}]


def test_the_policy_and_binding_select_the_chart_webhooks_namespaces() -> None:
    compiled = intree.compiled_default(["kube-system", "envelope-e2e-system"])
    policy, binding = intree.chart_manifests(compiled, SELECTOR)
    assert policy["kind"] == "MutatingAdmissionPolicy"
    assert policy["spec"]["matchConstraints"]["namespaceSelector"] == SELECTOR
    expressions = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expressions == [*SELECTOR["matchExpressions"],
                           {"key": FACT_LABEL, "operator": "In", "values": [FACT_VALUE]}]
    # the compilation itself is the chart's: the default rule set and policy
    assert policy["spec"]["matchConditions"] == compile_in_tree(default_ruleset(), Policy()).manifests[0][
        "spec"]["matchConditions"]
    assert SELECTOR["matchExpressions"][-1] == ISOLATED, "the caller's selector was not modified"


def test_a_compilation_for_other_namespaces_is_refused() -> None:
    compiled = intree.compiled_default(["kube-system"])
    with pytest.raises(ValueError, match="envelope-e2e-system"):
        intree.chart_manifests(compiled, SELECTOR)


def test_the_setup_reads_the_selector_and_reduces_only_the_mutating_webhook() -> None:
    setup = intree.InTreeSetup("envelope-intree", _chart_docs())
    mutating, validating = setup.webhooks
    assert mutating["webhooks"][0]["matchConditions"] == [
        {"name": "envelope-may-mutate", "expression": setup.compiled.webhook_condition}]
    assert validating == _chart_docs()[1]
    assert intree.InTreeSetup("intree-map", _chart_docs()).webhooks == []
    with pytest.raises(ValueError, match="unknown"):
        intree.InTreeSetup("map", _chart_docs())
    with pytest.raises(ValueError, match="no MutatingWebhookConfiguration"):
        intree.webhook_selector(_chart_docs()[1:])


def _sample(family: str, value: float, **labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"apiserver_admission_{family}{{{inner}}} {value}"


MUTATE, VALIDATE = "workloads.mutate.envelope.io", "workloads.validate.envelope.io"
METRICS = "\n".join([
    "# HELP apiserver_admission_webhook_request_total [ALPHA] ...",
    _sample("webhook_request_total", 40, code="200", name=MUTATE, operation="CREATE", type="admit"),
    _sample("webhook_request_total", 90, code="200", name=VALIDATE, operation="CREATE", type="validating"),
    _sample("webhook_request_total", 2, code="403", name=VALIDATE, rejected="true", type="validating"),
    _sample("controller_admission_duration_seconds_sum", 0.5, name="MutatingAdmissionPolicy",
            operation="CREATE", type="admit"),
    _sample("controller_admission_duration_seconds_count", 100, name="MutatingAdmissionPolicy",
            operation="CREATE", type="admit"),
    _sample("controller_admission_duration_seconds_sum", 0.25, name="MutatingAdmissionPolicy",
            operation="UPDATE", type="admit"),
    _sample("match_condition_evaluation_seconds_sum", 0.125, kind="webhook", name=MUTATE, type="admit"),
    _sample("step_admission_duration_seconds_sum", 9, operation="CREATE", type="admit"),
])


def test_admission_counters_sum_by_what_a_round_tells_apart() -> None:
    assert intree.admission_counters(METRICS) == {
        "calls:admit": 40.0, "calls:validating": 92.0, "plugin:MutatingAdmissionPolicy": 0.75,
        "match:webhook": 0.125}
    before = intree.admission_counters(METRICS)
    after = {**before, "calls:admit": 60.0, "plugin:MutatingAdmissionPolicy": 1.75,
             "plugin:LimitRanger": 0.01}
    assert intree.per_create(before, after, 20) == {
        "calls:admit": 1.0, "plugin:MutatingAdmissionPolicy": 50.0, "plugin:LimitRanger": 0.5}


def _envelope_answer(written: dict[str, Any]) -> dict[str, Any]:
    result = check_object(default_ruleset(), subject_of(written), StaticView(), Policy())
    stored = result.obj
    return {**objects.comparable(stored, bookkeeping=True), "warnings": [f.message for f in result.findings]}


def test_the_burstable_object_is_mutated_without_a_warning_and_the_timed_one_warns() -> None:
    timed, burstable = objects.timed_deployment(), objects.burstable_deployment()
    warned = check_object(default_ruleset(), subject_of(timed), StaticView(), Policy())
    assert [f.rule for f in warned.findings] == ["cpu-limits"]
    result = check_object(default_ruleset(), subject_of(burstable), StaticView(), Policy())
    assert result.findings == [] and result.patch
    shipper = result.obj["spec"]["template"]["spec"]["containers"][2]["resources"]
    assert shipper == {"limits": {"memory": "128Mi", "ephemeral-storage": "2Gi"},
                       "requests": {"memory": "128Mi", "cpu": "250m"}}


def test_the_domain_verdict_tells_the_three_answers_apart() -> None:
    written = objects.burstable_deployment()
    envelope = _envelope_answer(written)
    left = {**objects.comparable(written, bookkeeping=True), "warnings": []}
    assert intree.domain_verdict(envelope, {**envelope, "warnings": []}, written).startswith("in the domain")
    assert intree.domain_verdict(envelope, left, written).startswith("outside the domain")
    half = copy.deepcopy(left)
    del half["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    with pytest.raises(RuntimeError, match="neither"):
        intree.domain_verdict(envelope, half, written)


def _row(p50: float, cpu: float = 5.0) -> dict[str, float]:
    return {"p50": p50, "cpu:kube-apiserver": cpu}


def test_target_ratios() -> None:
    median = {("none", "burstable", 1): _row(4.0), ("map", "burstable", 1): _row(6.0, 7.0),
              ("envelope-intree", "burstable", 1): _row(6.2, 8.0), ("intree-map", "burstable", 1): _row(7.0),
              ("none", "compliant", 1): _row(4.0), ("go-h2", "compliant", 1): _row(4.0),
              ("envelope-intree", "compliant", 1): _row(5.0)}
    rows = {(r["object"], r["round"]): r for r in intree.target_ratios(median)}
    assert set(rows) == {("burstable", "envelope-intree"), ("burstable", "intree-map"),
                         ("compliant", "envelope-intree")}
    met = rows[("burstable", "envelope-intree")]
    assert (met["added"], met["added_against"], met["met"]) == (pytest.approx(2.2), 2.0, True)
    assert met["ratio"] == pytest.approx(1.1) and (met["cpu"], met["cpu_against"]) == (8.0, 7.0)
    assert rows[("burstable", "intree-map")]["met"] is None  # reported only
    # the Go pair added nothing: no ratio, and a positive addition misses "≤ its"
    compliant = rows[("compliant", "envelope-intree")]
    assert compliant["ratio"] is None and compliant["met"] is False
    median[("envelope-intree", "burstable", 1)] = _row(6.3)
    assert not next(r for r in intree.target_ratios(median)
                    if (r["object"], r["round"]) == ("burstable", "envelope-intree"))["met"]
