"""app/intree/validating.py: which validate rules become ValidatingAdmissionPolicies under
which policy, their domain, the validating webhook's partition (as a list of entries, a
JSON patch and the chart's rendering), the server's /validate/in-tree/<rules> path and
`envelope webhook-config --in-tree --split-patch`.

That the policies answer every write in their domain as /validate does (refusal text,
warning text behind the API server's prefix) is proved on the real API server in
e2e/test_intree_equivalence.py; here, the compiler's bookkeeping and the text it shares
with the rule."""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from app.cli import main
from app.core.config import Mode, Policy
from app.core.engine import evaluate
from app.core.ruleset import default_ruleset
from app.intree import FACT_LABEL, FACT_VALUE, compile_in_tree
from app.intree.chartfile import render
from app.intree.validating import (
    _TAIL,
    VALIDATE_PATH,
    compile_validating,
    partition,
    policy_name,
    renamed,
    warning_prefix,
    webhook_json_patch,
    webhook_partition,
)
from app.rules.base import Subject
from app.serve.server import create_app
from tests.conftest import container, workload
from tests.helpers.chart import CHART, NAMESPACE, RELEASE, chart_values, deep_merge, helm

RULES = default_ruleset()
RULE = "memory-request-equals-limit"
FACT = {"key": FACT_LABEL, "operator": "In", "values": [FACT_VALUE]}
MAP_API = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"


def policy(**data: Any) -> Policy:
    return Policy.model_validate(data)


def warn() -> Policy:
    return policy(rules={RULE: "warn"})


def test_the_default_policy_denies_in_namespaces_with_the_fact() -> None:
    compiled = compile_validating(RULES, Policy())
    assert compiled.rules == {RULE: Mode.ENFORCE} and compiled.warned == ()
    vap, binding = compiled.manifests
    assert (vap["kind"], binding["kind"]) == ("ValidatingAdmissionPolicy",
                                              "ValidatingAdmissionPolicyBinding")
    assert vap["metadata"]["name"] == binding["spec"]["policyName"] == policy_name(RULE)
    assert binding["spec"]["validationActions"] == ["Deny"]
    # the rule reads LimitRanges: bound only where the fact says there is none, guards or not
    assert compiled.namespace_requirements == [FACT]
    assert FACT in binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    guards_off = policy(rules={"quota-needs-cpu-limits": "off", "limitrange-needs-cpu-limits": "off"})
    assert compile_validating(RULES, guards_off).namespace_requirements == [FACT]
    spec = vap["spec"]
    assert {op for r in spec["matchConstraints"]["resourceRules"] for op in r["operations"]} == {"CREATE"}
    assert spec["validations"][0]["reason"] == "Forbidden"  # 403, as the webhook's refusal
    assert spec["matchConditions"][0]["expression"] == compiled.domains[RULE]
    assert compiled.domains[RULE].startswith('request.operation == "CREATE"')
    assert "namespaceObject" not in compiled.domains[RULE]
    # the Deny message joins every finding as app.serve.admission.decide does
    assert f"[{RULE}]" in spec["validations"][0]["messageExpression"]
    assert ".join(\"; \")" in spec["validations"][0]["messageExpression"]
    # enforce needs no split: the policy refuses before the webhook is called
    assert len(partition(compiled)) == 1 and webhook_json_patch(compiled, "x.validate.io") == []


def test_what_stays_in_the_webhook_and_why() -> None:
    why = compile_validating(RULES, Policy()).not_compiled
    assert RULE not in why
    assert "before any admission plugin" in why["quantities"]
    assert "$(VAR)" in why["env-envelope-consistency"]
    for cross in ("pod-fits-node", "namespace-memory-composition", "limitrange-default-below-request"):
        assert "reads other objects" in why[cross]
    off = compile_validating(RULES, policy(rules={RULE: "off"}))
    assert off.rules == {} and off.manifests == [] and RULE not in off.not_compiled
    capped = compile_validating(RULES, policy(defaultMode="warn"))
    assert capped.rules == {RULE: Mode.WARN}


def test_the_tail_is_the_rules_own_wording() -> None:
    """The policy builds the rule's message from the label, the two quantities as written
    and this tail: what the rule says for one mismatched container must be exactly that."""
    obj = workload("Deployment", [container("app", requests={"memory": "1Gi"},
                                            limits={"memory": "2Gi"})])
    subject = Subject(group="apps", version="v1", kind="Deployment", namespace="team-a", obj=obj)
    found = evaluate(RULES, subject, _empty_view(), Policy(), "validate").errors
    assert [f.message for f in found if f.rule == RULE] == [
        'container "app": memory request 1Gi differs from limit 2Gi' + _TAIL]


def _empty_view() -> Any:
    from app.cluster.view import StaticView
    return StaticView()


def test_warn_mode_warns_once_and_partitions_the_webhook() -> None:
    compiled = compile_validating(RULES, warn())
    assert compiled.warned == (RULE,)
    vap, binding = compiled.manifests
    assert binding["spec"]["validationActions"] == ["Warn"]
    message = vap["spec"]["validations"][0]["messageExpression"]
    assert message.startswith(json.dumps(f"envelope[{RULE}]: "))  # as decide() words a warning
    # one warning per finding in the webhook, one per validation in a policy: the domain
    # holds writes with at most one finding
    assert "<= 1" in compiled.domains[RULE]
    entries = partition(compiled)
    assert [e.suffix for e in entries] == ["", "-outside", "-in-tree"]
    assert entries[0].requirements == [{**FACT, "operator": "NotIn"}]
    assert entries[1].requirements == entries[2].requirements == [FACT]
    assert compiled.skip_domain() == f"({compiled.domains[RULE]})"
    assert entries[1].conditions[0]["expression"] == f"!({compiled.skip_domain()})"
    assert entries[2].conditions[0]["expression"] == compiled.skip_domain()
    assert [e.path for e in entries] == ["/validate", "/validate", f"{VALIDATE_PATH}{RULE}"]
    assert warning_prefix(RULE) == (f"Validation failed for ValidatingAdmissionPolicy "
                                    f"'{policy_name(RULE)}' with binding '{policy_name(RULE)}': ")


def test_exceptions_for_the_rule_leave_their_writes_to_the_webhook() -> None:
    by_labels = {"rules": [RULE], "objectSelector": {"matchLabels": {"team": "legacy"}}}
    by_namespace = {"rules": ["*"], "namespaceSelector": {"matchLabels": {"tier": "exempt"}}}
    other = {"rules": ["cpu-limits"], "namespaces": ["x"]}
    compiled = compile_validating(RULES, policy(rules={RULE: "warn"},
                                                exceptions=[by_labels, by_namespace, other]))
    domain = compiled.domains[RULE]
    assert '"team" in' in domain and '"x"' not in domain  # an exception for another rule
    exempt = {"key": "tier", "operator": "NotIn", "values": ["exempt"]}
    assert compiled.namespace_requirements == [FACT, exempt]
    entries = partition(compiled)
    assert [e.suffix for e in entries] == ["", "-exempt0", "-outside", "-in-tree"]
    # the namespaces the exception may exempt: with the fact, outside the binding — whole
    assert entries[1].requirements == [FACT, {**exempt, "operator": "In"}]
    assert entries[1].conditions == [] and entries[1].path == "/validate"
    assert entries[3].requirements == [FACT, exempt]
    # no exemptions allowed: the annotation is not read
    plain = compile_validating(RULES, policy(allowObjectExemptions=False)).domains[RULE]
    assert "envelope.io/exempt" not in plain
    assert "envelope.io/exempt" in compile_validating(RULES, Policy()).domains[RULE]


def _hook(name: str = "workloads.validate.envelope.io") -> dict[str, Any]:
    return {"name": name, "namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]},
        "clientConfig": {"service": {"name": "envelope", "namespace": "e", "path": "/validate"}},
        "rules": [], "sideEffects": "None", "admissionReviewVersions": ["v1"]}


def _apply(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 test, copy, add and replace, on JSON pointers without escapes."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = op["path"].lstrip("/").split("/")
        node = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if op["op"] == "test":
            assert node[int(last) if isinstance(node, list) else last] == op["value"]
            continue
        value = copy.deepcopy(op["value"]) if "value" in op else _get(doc, op["from"])
        if isinstance(node, list):
            if last == "-":
                node.append(value)
            elif op["op"] == "replace":
                node[int(last)] = value
            else:
                node.insert(int(last), value)
        else:
            node[last] = value
    return doc


def _get(doc: Any, pointer: str) -> Any:
    for key in pointer.lstrip("/").split("/"):
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return copy.deepcopy(doc)


def test_the_partition_splits_every_write_once_with_unique_names() -> None:
    compiled = compile_validating(RULES, policy(rules={RULE: "warn"}, exceptions=[
        {"rules": [RULE], "namespaceSelector": {"matchExpressions": [
            {"key": "tier", "operator": "Exists"}]}}]))
    hooks = webhook_partition(_hook(), compiled)
    names = [h["name"] for h in hooks]
    assert len(set(names)) == len(names) == 4 and names[0] == "workloads.validate.envelope.io"
    assert all(n.endswith(".validate.envelope.io") for n in names)
    assert hooks[-1]["clientConfig"]["service"]["path"] == f"{VALIDATE_PATH}{RULE}"
    assert hooks[0]["clientConfig"]["service"]["path"] == "/validate"
    # the url form keeps the host
    by_url = webhook_partition({**_hook(), "clientConfig": {"url": "https://h:8443/validate"}}, compiled)
    assert by_url[-1]["clientConfig"]["url"] == f"https://h:8443{VALIDATE_PATH}{RULE}"
    # the JSON patch, applied to a configuration holding the hook, gives the same entries
    config = {"webhooks": [_hook(), _hook("quotas.validate.envelope.io")]}
    patched = _apply(config, webhook_json_patch(compiled, "workloads.validate.envelope.io"))
    assert patched["webhooks"] == [*hooks, _hook("quotas.validate.envelope.io")]
    with pytest.raises(AssertionError):  # the first operation tests the name
        _apply({"webhooks": [_hook("other.validate.io")]},
               webhook_json_patch(compiled, "workloads.validate.envelope.io"))
    assert renamed("a.b.c", "-x") == "a-x.b.c"


def _review(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
                        "operation": "CREATE", "namespace": "team-a", "object": obj}}


class Client:
    """The app in-process (httpx's ASGI transport), as tests/serve/test_admission_handler.py."""

    def __init__(self, policy: Policy) -> None:
        self.app = create_app(RULES, policy)

    def request(self, method: str, path: str, body: Any = None) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await client.request(method, path, json=body)
        return asyncio.run(go())

    def post(self, path: str, json: Any) -> httpx.Response:
        return self.request("POST", path, json)

    def get(self, path: str) -> httpx.Response:
        return self.request("GET", path)


def test_the_server_skips_exactly_the_rules_its_path_names() -> None:
    client = Client(warn())
    bad = workload("Deployment", [container("app", requests={"memory": "1Gi", "cpu": "1"},
                                            limits={"memory": "2Gi"})])
    whole = client.post("/validate", json=_review(bad)).json()["response"]
    assert whole["allowed"] and any(RULE in w for w in whole["warnings"])
    skipped = client.post(f"{VALIDATE_PATH}{RULE}", json=_review(bad)).json()["response"]
    assert skipped["allowed"] and not any(RULE in w for w in skipped.get("warnings") or [])
    # the other rules still run there
    assert client.post(f"{VALIDATE_PATH}{RULE}", json=_review(bad)).status_code == 200
    for wrong in ("pod-fits-node", "no-such-rule", f"{RULE},quantities", ""):
        answer = client.post(f"{VALIDATE_PATH}{wrong}", json=_review(bad))
        if wrong == "":
            assert answer.status_code in (400, 404, 405)
            continue
        assert answer.status_code == 400, wrong
        assert RULE in answer.json()["error"]
    assert client.get(f"{VALIDATE_PATH}{RULE}").status_code == 405
    # the mode on the server does not matter: the path says what the policy answers
    enforcing = Client(Policy())
    refused = enforcing.post("/validate", json=_review(bad)).json()["response"]
    assert not refused["allowed"] and RULE in refused["status"]["message"]
    assert enforcing.post(f"{VALIDATE_PATH}{RULE}", json=_review(bad)).json()["response"]["allowed"]


def test_the_cli_needs_a_split_patch_for_a_warn_policy(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump({"rules": {RULE: "warn"}}))
    assert main(["webhook-config", "--in-tree", "--config", str(config)]) == 2
    assert "--split-patch" in capsys.readouterr().err
    out = tmp_path / "split.json"
    assert main(["webhook-config", "--in-tree", "--config", str(config), "--split-patch", str(out),
                 "--exclude-namespace", "envelope"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    compiled = compile_validating(RULES, warn(), excluded_namespaces=["kube-system", "envelope"])
    assert [d["kind"] for d in docs] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                                         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                                         "MutatingWebhookConfiguration"]
    assert docs[2:4] == compiled.manifests
    assert json.loads(out.read_text()) == webhook_json_patch(compiled, "workloads.validate.envelope.io")


def _render(chart: Path, values: dict[str, Any]) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(deep_merge({"image": {"local": True}}, values), f)
    proc = helm("template", RELEASE, str(chart), "--namespace", NAMESPACE, "-f", f.name,
                "--skip-tests", "--kube-version", "1.37.2", "--api-versions", MAP_API)
    Path(f.name).unlink()
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_chart_renders_the_policies_and_the_partition(tmp_path: Path) -> None:
    """The chart's default policy: the Deny policy and one validating entry. A chart whose
    default policy warns (its files/intree.yaml regenerated): the Warn policy and the
    partition, as webhook_partition makes it of the single entry."""
    docs = _render(CHART, {"inTree": {"enabled": True}})
    excluded = ["kube-system", NAMESPACE]
    want = compile_validating(RULES, Policy.model_validate(chart_values()["policy"]),
                              excluded_namespaces=excluded).manifests
    got = [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert [d["spec"] for d in got] == [w["spec"] for w in want]
    single = next(d for d in docs if d["kind"] == "ValidatingWebhookConfiguration")["webhooks"]
    assert single[0]["name"] == "workloads.validate.envelope.io"

    chart = tmp_path / "envelope"
    shutil.copytree(CHART, chart)
    values = yaml.safe_load((chart / "values.yaml").read_text())
    values["policy"]["rules"] = {RULE: "warn"}
    (chart / "values.yaml").write_text(yaml.safe_dump(values))
    (chart / "files" / "intree.yaml").write_text(render(RULES, chart / "values.yaml"))
    warned = _render(chart, {"inTree": {"enabled": True}})
    compiled = compile_validating(RULES, Policy.model_validate(values["policy"]),
                                  excluded_namespaces=excluded)
    binding = next(d for d in warned if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["validationActions"] == ["Warn"]
    hooks = next(d for d in warned if d["kind"] == "ValidatingWebhookConfiguration")["webhooks"]
    assert hooks[:3] == webhook_partition(single[0], compiled)
    assert hooks[3:] == single[1:]
    # a safe install raises every entry of the partition, not only the first
    safe = _render(chart, {"inTree": {"enabled": True}, "webhooks": {"safeInstall": True}})
    config = next(d for d in safe if d["kind"] == "ValidatingWebhookConfiguration")
    wanted = json.loads(config["metadata"]["annotations"]["envelope.io/failure-policies"])
    assert {h["name"] for h in config["webhooks"]} <= set(wanted)
    # the mutating side is what the MAP compiler says for the same policy
    assert compile_in_tree(RULES, Policy.model_validate(values["policy"])).rules == (
        "cpu-limits", "memory-limit")
