"""``memory-below-limit`` (the policy's ``memoryBelowLimit``) and ``envelope fix --memory``:
a memory request below its limit is written equal to it, only where the policy selects
the namespace, said as a warning with both values and the difference; the validating
rules (``memory-request-equals-limit``, ``namespace-memory-composition``,
``pod-fits-node``) judge the raised request; and the vendored third-party stacks
(tests/data/thirdparty/) go from refused to clean."""

from __future__ import annotations

import copy
import dataclasses
import difflib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.chart.matchconditions import mutate_expression
from app.cli import main
from app.cluster.view import StaticView
from app.core.config import ConfigError, Policy, load_policy
from app.core.engine import check_object, evaluate
from app.core.ruleset import default_ruleset
from app.fix.edit import fix_paths, with_memory_action
from app.k8s.podspec import holders
from app.k8s.quantity import parse_quantity
from tests.conftest import container, resources_of, run, subject, workload
from tests.helpers.namespace import node, quota
from tests.helpers.workloads import KINDS, containers

RULES = default_ruleset()
RULE = "memory-below-limit"
THIRDPARTY = Path(__file__).parent.parent / "data" / "thirdparty"
STACKS = sorted(THIRDPARTY.glob("*.yaml"))


def policy(**choice: Any) -> Policy:
    return Policy.model_validate({"memoryBelowLimit": choice})


def deployment(ns: str = "team-a", replicas: int = 1) -> dict[str, Any]:
    obj = workload("Deployment", [container("app", requests={"cpu": "100m", "memory": "128Mi"},
                                            limits={"memory": "256Mi"})],
                   init=[container("init", requests={"memory": "64Mi"}, limits={"memory": "1Gi"})],
                   namespace=ns)
    obj["spec"]["replicas"] = replicas
    return obj


def namespace(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def test_off_by_default_the_rule_changes_nothing_and_the_validating_rule_refuses() -> None:
    result = run(deployment())
    assert result.patch == [] or all("memory" not in op["path"] for op in result.patch)
    assert [f.rule for f in result.errors] == ["memory-request-equals-limit"] * 2


def test_raises_each_request_to_its_limit_with_a_warning_naming_both_and_the_gap() -> None:
    result = run(deployment(), policy(namespaces=["team-a"]))
    assert result.errors == []
    assert resources_of(result.obj)["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert resources_of(result.obj, field="initContainers")["requests"] == {"memory": "1Gi"}
    warnings = [f.message for f in result.warnings if f.rule == RULE]
    assert warnings == [
        'initContainer "init": memory request raised from 64Mi to 1Gi (+960Mi) to equal its '
        "limit (policy memoryBelowLimit; memory-request-equals-limit)",
        'container "app": memory request raised from 128Mi to 256Mi (+128Mi) to equal its limit '
        "(policy memoryBelowLimit; memory-request-equals-limit)"]
    assert result.obj["metadata"]["annotations"]["envelope.io/mutations"] == \
        "memory-below-limit:init,app"


def test_lower_limit_writes_the_limit_down_to_the_request() -> None:
    result = run(deployment(), policy(namespaces=["*"], action="lower-limit"))
    assert result.errors == []
    assert resources_of(result.obj)["limits"] == {"memory": "128Mi"}
    assert [f.message for f in result.warnings if f.rule == RULE][1].startswith(
        'container "app": memory limit lowered from 256Mi to 128Mi (-128Mi)')


def test_only_in_the_namespaces_it_selects() -> None:
    view = StaticView([namespace("team-a", {"envelope.io/memory": "raise-request"}),
                       namespace("team-b", {})])
    chosen = policy(namespaceSelector={"matchLabels": {"envelope.io/memory": "raise-request"}})
    raised = check_object(RULES, subject(deployment("team-a")), view, chosen)
    kept = check_object(RULES, subject(deployment("team-b")), view, chosen)
    unknown = check_object(RULES, subject(deployment("team-c")), view, chosen)
    assert raised.errors == []
    assert {f.rule for f in kept.errors} == {"memory-request-equals-limit"}
    assert {f.rule for f in unknown.errors} == {"memory-request-equals-limit"}
    listed = run(deployment("team-b"), policy(namespaces=["team-a"]))
    assert {f.rule for f in listed.errors} == {"memory-request-equals-limit"}


def test_warn_mode_changes_nothing_and_says_so() -> None:
    chosen = Policy.model_validate({"memoryBelowLimit": {"namespaces": ["*"]},
                                    "rules": {RULE: "warn"}})
    result = run(deployment(), chosen)
    assert resources_of(result.obj)["requests"]["memory"] == "128Mi"
    assert any(f.message.startswith("not applied (memory-below-limit in warn mode)")
               for f in result.warnings)
    assert not any(f.rule == RULE and "raised" in f.message and "not applied" not in f.message
                   for f in result.warnings)


def test_a_request_above_its_limit_is_left_to_the_api_server() -> None:
    obj = workload("Pod", [container(requests={"memory": "2Gi"}, limits={"memory": "1Gi"})])
    result = run(obj, policy(namespaces=["*"]))
    assert resources_of(result.obj)["requests"]["memory"] == "2Gi"
    assert [f.rule for f in result.errors] == ["memory-request-equals-limit"]


def test_pod_level_limit_without_a_request_gets_the_request() -> None:
    obj = workload("Pod", [container(requests={"memory": "100Mi"}, limits={"memory": "100Mi"})],
                   pod_resources={"limits": {"memory": "1Gi"}})
    assert [f.rule for f in run(obj).errors] == ["memory-request-equals-limit"]
    result = run(obj, policy(namespaces=["*"]))
    assert result.errors == []
    assert result.obj["spec"]["resources"]["requests"] == {"memory": "1Gi"}
    assert "raised from 100Mi (the containers' sum the API server defaults) to 1Gi (+924Mi)" in \
        next(f.message for f in result.warnings if f.rule == RULE)


def test_a_resize_is_not_raised() -> None:
    old = workload("Pod", [container(requests={"memory": "1Gi"}, limits={"memory": "1Gi"})])
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["resources"] = {"requests": {"memory": "1Gi"},
                                                 "limits": {"memory": "2Gi"}}
    subj = dataclasses.replace(subject(new, "UPDATE", old), subresource="resize")
    result = evaluate(RULES, subj, StaticView(), policy(namespaces=["*"]), "mutate")
    assert not any(f.rule == RULE for f in result.changes)


def test_composition_and_pod_fits_node_count_the_raised_request() -> None:
    # 3 replicas of 256Mi requests fit a 1Gi quota and a 512Mi node; raised to 1Gi each,
    # neither does, and both rules say so.
    obj = workload("Deployment", [container("app", requests={"memory": "256Mi"},
                                            limits={"memory": "1Gi"})])
    obj["spec"]["replicas"] = 3
    view = StaticView([quota({"requests.memory": "1Gi"}), node("n1", "8", "768Mi")])
    skipped = Policy.model_validate({"rules": {"memory-request-equals-limit": "off"}})
    before = check_object(RULES, subject(obj), view, skipped)
    assert [f.rule for f in [*before.errors, *before.warnings]] == []
    raised = Policy.model_validate({"rules": {"memory-request-equals-limit": "off"},
                                    "memoryBelowLimit": {"namespaces": ["*"]}})
    after = check_object(RULES, subject(obj), view, raised)
    said = [*after.errors, *after.warnings]  # composition warns by default
    assert {"namespace-memory-composition", "pod-fits-node"} <= {f.rule for f in said}, said
    assert any("3Gi" in f.message for f in said if f.rule == "namespace-memory-composition")
    assert any("1Gi" in f.message for f in after.errors if f.rule == "pod-fits-node")


def test_the_policy_needs_a_namespace_condition() -> None:
    with pytest.raises(ConfigError, match="memoryBelowLimit needs namespaces"):
        load_policy_text("memoryBelowLimit: {action: raise-request}\n")
    with pytest.raises(ConfigError, match="action"):
        load_policy_text("memoryBelowLimit: {action: raise, namespaces: ['*']}\n")


def load_policy_text(text: str) -> Policy:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(text)
        f.flush()
        return load_policy(f.name, {}, RULES)


def test_the_webhook_is_sent_what_it_may_raise() -> None:
    """matchConditions: only with the choice is a write with memory apart sent for it."""
    assert "requests[\"memory\"] == " not in mutate_expression(RULES, Policy())
    assert "requests[\"memory\"] == " in mutate_expression(RULES, policy(namespaces=["x"]))


# --- the mutation as a property: exactly the memory values apart change --------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(KINDS), containers("c", apart=True), containers("init", apart=True),
       st.sampled_from(["raise-request", "lower-limit"]))
def test_only_memory_apart_changes(kind: str, main_containers: list[dict[str, Any]],
                                   init: list[dict[str, Any]], action: str) -> None:
    obj = workload(kind, main_containers, init or None)
    original = copy.deepcopy(obj)
    chosen = Policy.model_validate({"memoryBelowLimit": {"namespaces": ["*"], "action": action},
                                    "rules": {r: "off" for r in RULES if r != RULE}})
    subj = subject(obj)
    result = evaluate(RULES, subj, StaticView(), chosen, "mutate")
    assert obj == original  # the admitted object is never changed
    mutated = result.obj
    for before, after in zip(holders(subj, original), holders(subj, mutated), strict=True):
        req = (before.resources.get("requests") or {}).get("memory")
        lim = (before.resources.get("limits") or {}).get("memory")
        apart = req is not None and lim is not None and parse_quantity(req) < parse_quantity(lim)
        expected = copy.deepcopy(before.resources)
        if apart and action == "raise-request":
            expected["requests"]["memory"] = lim
        elif apart:
            expected["limits"]["memory"] = req
        assert after.resources == expected, (before.resources, after.resources)
    changed = [f for f in result.changes if f.rule == RULE]
    apart = 0
    for h in holders(subj, original):
        r = (h.resources.get("requests") or {}).get("memory")
        lim = (h.resources.get("limits") or {}).get("memory")
        apart += r is not None and lim is not None and parse_quantity(r) < parse_quantity(lim)
    assert len(changed) == apart


# --- the third-party stacks -----------------------------------------------------------------

def _errors(path: Path, chosen: Policy) -> int:
    from app.cluster.static import Loaded, load_text

    loaded = Loaded()
    load_text(path.read_text(), str(path), loaded)
    view = StaticView([m.obj for m in loaded.manifests], RULES.indexes)
    count = 0
    for m in loaded.manifests:
        meta = m.obj["metadata"]
        group, _, version = m.obj["apiVersion"].rpartition("/")
        subj = type(subject(m.obj))(group, version, m.obj["kind"], "CREATE",
                                    meta.get("namespace", ""), meta.get("name", ""), m.obj)
        result = check_object(RULES, subj, view, chosen)
        count += sum(1 for f in result.errors if f.rule == "memory-request-equals-limit")
    return count


@pytest.mark.parametrize("stack", STACKS, ids=[p.stem for p in STACKS])
def test_third_party_stacks_are_refused_then_raised(stack: Path, tmp_path: Path) -> None:
    assert _errors(stack, Policy()) > 0
    assert _errors(stack, policy(namespaces=["*"])) == 0
    # envelope fix --memory raise-request writes it: only memory request lines (and the
    # mutations annotation, and the CPU limits cpu-limits removes) change, and the fixed
    # file has nothing left for memory-request-equals-limit
    copy_ = tmp_path / stack.name
    copy_.write_text(stack.read_text())
    assert main(["fix", "--memory", "raise-request", str(copy_)]) == 0
    fixed = copy_.read_text()
    assert _errors(copy_, Policy()) == 0
    diff = [line for line in difflib.unified_diff(stack.read_text().splitlines(),
                                                  fixed.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    for line in diff:
        body = line[1:].strip()
        assert body.startswith(("memory:", "cpu:", "envelope.io/mutations:", "annotations:",
                                "requests:", "limits:")), line
    # without --memory nothing memory-related is written, whatever the policy says
    results, _ = fix_paths([str(stack)], RULES, with_memory_action(policy(namespaces=["*"]), None))
    assert "memory-below-limit" not in results[0].fixed
