"""app/intree/: which rules are compiled under which policy, what the domain leaves to the
webhook, the manifests' shape, and `envelope webhook-config --in-tree`.

That the generated policy answers every write in its domain exactly as /mutate does is
proved on the real API server in e2e/test_intree_equivalence.py; here, the compiler's
bookkeeping."""

from __future__ import annotations

import json

import pytest
import yaml

from app.chart.matchconditions import MUTATING_WEBHOOK, mutate_expression
from app.cli import main
from app.core.config import Policy
from app.core.ruleset import RuleSet, default_ruleset
from app.intree import FACT_LABEL, FACT_VALUE, NotCompilable, compile_in_tree
from app.intree.compile import FACT_LEASE_CONDITION, POLICY_NAME, fact_lease_expression
from app.intree.validating import compile_validating
from app.k8s.kinds import KINDS
from app.k8s.podspec import WORKLOAD_KINDS
from app.rules.base import rule, rules_of

RULES = default_ruleset()


def policy(data: dict[str, object] | None = None, **rules: str) -> Policy:
    return Policy.model_validate({**(data or {}),
                                  "rules": {k.replace("_", "-"): v for k, v in rules.items()}})


def _map(compiled_manifests: list[dict[str, object]]) -> dict[str, object]:
    found = [m for m in compiled_manifests if m["kind"] == "MutatingAdmissionPolicy"]
    assert len(found) == 1
    return found[0]


def test_the_default_policy_compiles_both_enforced_mutations() -> None:
    compiled = compile_in_tree(RULES, Policy())
    assert compiled.rules == ("cpu-limits", "memory-limit")
    assert set(compiled.not_compiled) == {"env-envelope-cpu", "quota-needs-cpu-limits",
                                          "limitrange-needs-cpu-limits", "downward-cpu-limit",
                                          "template-opt-outs"}
    kinds = [m["kind"] for m in compiled.manifests]
    assert kinds == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    binding = compiled.manifests[1]
    assert binding["spec"]["policyName"] == POLICY_NAME
    spec = _map(compiled.manifests)["spec"]
    assert spec["mutations"][0]["patchType"] == "JSONPatch"  # type: ignore[index]
    assert spec["matchConditions"][0]["expression"] == compiled.domain  # type: ignore[index]
    # the guards are on (warn): only namespaces with the fact, in the binding (a
    # matchCondition sees no namespaceObject)
    fact = {"key": FACT_LABEL, "operator": "In", "values": [FACT_VALUE]}
    assert compiled.namespace_requirements == [fact]
    assert fact in binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert "namespaceObject" not in compiled.domain
    # the fact expires: the policy reads the keeper's Lease and answers only before it lapses
    assert spec["paramKind"] == {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
    assert binding["spec"]["paramRef"] == {"namespace": "envelope", "name": "envelope-leader-facts",
                                           "parameterNotFoundAction": "Allow"}
    assert spec["matchConditions"][1] == {  # type: ignore[index]
        "name": FACT_LEASE_CONDITION, "expression": fact_lease_expression()}
    # env-envelope-cpu is on and not compiled: string envelopes are left to the webhook
    assert 'e.name == "RESOURCE_LIMITS"' in compiled.domain


def test_every_workload_kind_is_matched_on_create_and_update() -> None:
    spec = _map(compile_in_tree(RULES, Policy()).manifests)["spec"]
    rules = spec["matchConstraints"]["resourceRules"]  # type: ignore[index]
    matched = {(group, resource) for r in rules for group in r["apiGroups"] for resource in r["resources"]}
    expected = {(k.group, k.resource) for k in KINDS if (k.group, k.kind) in WORKLOAD_KINDS}
    assert matched == expected and len(expected) == len(WORKLOAD_KINDS)
    assert all(r["operations"] == ["CREATE", "UPDATE"] for r in rules)


def test_the_webhook_keeps_exactly_what_the_domain_leaves() -> None:
    p = policy(quota_needs_cpu_limits="off", limitrange_needs_cpu_limits="off")
    compiled = compile_in_tree(RULES, p)
    old = mutate_expression(RULES, p)
    assert compiled.webhook_condition == f"({old}) && !({compiled.domain})"
    # where the binding selects fewer namespaces than the webhook, the webhook keeps all
    assert compile_in_tree(RULES, Policy()).webhook_condition == mutate_expression(RULES, Policy())
    patch = compiled.webhook_patch()
    assert patch["webhooks"][0]["name"] == MUTATING_WEBHOOK
    assert patch["webhooks"][0]["matchConditions"][0]["expression"] == compiled.webhook_condition


def test_guards_off_drop_the_namespace_fact() -> None:
    compiled = compile_in_tree(RULES, policy(quota_needs_cpu_limits="off",
                                             limitrange_needs_cpu_limits="off"))
    assert FACT_LABEL not in compiled.domain
    assert set(compiled.not_compiled) == {"env-envelope-cpu", "downward-cpu-limit",
                                          "template-opt-outs"}
    # no fact, no Lease to read
    assert all("paramKind" not in m["spec"] and "paramRef" not in m["spec"]
               for m in compiled.manifests)


def test_warn_mode_is_not_compiled_and_leaves_its_writes_to_the_webhook() -> None:
    compiled = compile_in_tree(RULES, policy(cpu_limits="warn"))
    assert compiled.rules == ("memory-limit",)
    assert "cannot warn" in compiled.not_compiled["cpu-limits"]
    expression = json.dumps(compiled.manifests)
    assert "/limits/cpu" not in expression  # no CPU patch at all
    # every CPU limit is outside the domain: one more clause on it than when enforced
    pod_cpu = '"cpu" in s.resources.limits'
    enforced = compile_in_tree(RULES, Policy()).domain
    assert compiled.domain.count(pod_cpu) == enforced.count(pod_cpu) + 1
    assert compile_in_tree(RULES, policy(memory_limit="warn")).rules == ("cpu-limits",)


def test_nothing_enforced_generates_nothing() -> None:
    p = policy(cpu_limits="warn", memory_limit="off")
    compiled = compile_in_tree(RULES, p)
    assert compiled.manifests == [] and compiled.rules == () and compiled.domain == "false"
    assert compiled.webhook_condition == mutate_expression(RULES, p)


def test_the_default_mode_ceiling_applies() -> None:
    assert compile_in_tree(RULES, Policy.model_validate({"defaultMode": "warn"})).rules == ()


def test_exceptions_for_a_compiled_rule_leave_their_objects_to_the_webhook() -> None:
    p = policy({"exceptions": [
        {"rules": ["cpu-limits"], "namespaces": ["legacy"], "kinds": ["apps/Deployment"]},
        {"rules": ["*"], "objectSelector": {"matchLabels": {"team": "x"},
                                            "matchExpressions": [{"key": "t", "operator": "NotIn",
                                                                  "values": ["a"]}]}},
        {"rules": ["pod-fits-node"], "namespaces": ["ignored"]},
    ]})
    domain = compile_in_tree(RULES, p).domain
    assert 'request.namespace in ["legacy"]' in domain
    assert '(request.kind.group + "/" + request.kind.kind) in ["apps/Deployment"]' in domain
    assert '"team" in (has(object.metadata.labels)' in domain
    assert '!("t" in ' in domain
    assert '"ignored"' not in domain  # an exception of a rule the policy does not apply


def test_namespace_selector_exceptions_are_the_bindings() -> None:
    p = policy({"exceptions": [
        {"rules": ["*"], "namespaceSelector": {"matchLabels": {"tier": "exempt"}}},
        {"rules": ["memory-limit"], "namespaceSelector": {"matchExpressions": [
            {"key": "legacy", "operator": "Exists"}]}},
        {"rules": ["cpu-limits"], "namespaceSelector": {"matchLabels": {"a": "b"}}, "kinds": ["Pod"]},
    ]}, quota_needs_cpu_limits="off", limitrange_needs_cpu_limits="off")
    compiled = compile_in_tree(RULES, p)
    assert compiled.namespace_requirements == [
        {"key": "tier", "operator": "NotIn", "values": ["exempt"]},
        {"key": "legacy", "operator": "DoesNotExist"}]
    assert "namespaceObject" not in compiled.domain
    assert 'request.kind.kind in ["Pod"]' in compiled.domain  # the rest of the third
    assert compiled.webhook_condition == mutate_expression(RULES, p)


def test_object_exemptions_and_opt_out_values() -> None:
    domain = compile_in_tree(RULES, Policy()).domain
    assert '"envelope.io/exempt" in object.metadata.annotations' in domain
    assert "^[!-~]*$" in domain  # an opt-out with spaces or non-ASCII goes to the webhook
    off = compile_in_tree(RULES, Policy.model_validate({"allowObjectExemptions": False})).domain
    assert "envelope.io/exempt" not in off


def test_the_mutations_annotation_follows_the_policy() -> None:
    default = json.dumps(compile_in_tree(RULES, Policy()).manifests)
    assert 'jsonpatch.escapeKey(\\"envelope.io/mutations\\")' in default
    assert 'object.kind != \\"Pod\\"' in default
    pods = json.dumps(compile_in_tree(RULES, Policy.model_validate({"annotatePods": True})).manifests)
    assert 'object.kind != \\"Pod\\"' not in pods
    none = json.dumps(compile_in_tree(RULES, Policy.model_validate({"mutationsAnnotation": ""})).manifests)
    assert "escapeKey" not in none


def test_excluded_namespaces_are_the_bindings() -> None:
    compiled = compile_in_tree(RULES, Policy(), excluded_namespaces=("kube-system", "envelope", "envelope"))
    for manifest in compiled.manifests:
        spec = manifest["spec"]
        selector = (spec.get("matchConstraints") or spec.get("matchResources"))["namespaceSelector"]
        assert selector["matchExpressions"][0]["values"] == ["kube-system", "envelope"]


def test_an_unknown_mutate_rule_refuses_compilation() -> None:
    @rule("new-mutation", "mutate", WORKLOAD_KINDS, RULES["cpu-limits"].default_mode, "something new")
    def new_mutation(subject, obj, view, policy):  # type: ignore[no-untyped-def]
        return []

    rules = RuleSet([*RULES.values(), *rules_of({"new_mutation": new_mutation})],
                    RULES.copiers, RULES.indexes, RULES.updates)
    with pytest.raises(NotCompilable, match="new-mutation"):
        compile_in_tree(rules, Policy())
    assert compile_in_tree(rules, policy(new_mutation="off")).rules == ("cpu-limits", "memory-limit")


def test_cli_prints_the_policy_binding_and_reduced_webhook(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["webhook-config", "--in-tree", "--exclude-namespace", "envelope"]) == 0
    out = capsys.readouterr()
    docs = list(yaml.safe_load_all(out.out))
    assert [d["kind"] for d in docs] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                                         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                                         "MutatingWebhookConfiguration"]
    excluded = ["kube-system", "envelope"]
    assert docs == [*compile_in_tree(RULES, Policy(), excluded_namespaces=excluded).manifests,
                    *compile_validating(RULES, Policy(), excluded_namespaces=excluded).manifests,
                    compile_in_tree(RULES, Policy()).webhook_patch()]
    assert "env-envelope-cpu stays in the webhook" in out.err
    assert "pod-fits-node stays in the webhook" in out.err
    assert main(["webhook-config", "--in-tree", "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["kind"] == "List" and len(listed["items"]) == 5
