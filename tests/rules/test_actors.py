"""Actor sandboxes: ActorTemplate and WorkerPool rules (ate.dev/v1alpha1)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from app.cluster.view import StaticView
from app.core.config import Policy, load_policy
from app.core.engine import Evaluation
from app.rules.actors import POOLS_BY_CLASS
from tests.conftest import RULES
from tests.helpers.actors import NS, ROOMY, by_rule, pool, run, template


def rules_of(result: Evaluation) -> set[str]:
    return {f.rule for f in result.findings}


ROOMY_GVISOR = pool({"cpu": "8", "memory": "16Gi"}, cls="gvisor", name="roomy-gvisor")


def test_rules_are_registered_with_their_defaults() -> None:
    defaults = {rid: RULES[rid].default_mode.value for rid in RULES if rid.startswith("actor-")}
    assert defaults == {
        "actor-no-requests": "enforce", "actor-limits": "enforce",
        "actor-microvm-memory-floor": "enforce", "actor-spec-immutable": "enforce",
        "actor-placement": "enforce", "actor-microvm-cpu-share": "warn",
        "actor-microvm-memory-headroom": "warn", "actor-pool-shrink": "warn",
        "actor-pool-resources": "enforce",
    }


# --------------------------------------------------------------------------- 1. limits only

@pytest.mark.parametrize(("resources", "refused"), [
    ({"limits": {"cpu": "1", "memory": "1Gi"}}, []),
    ({"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}, ["requests"]),
    ({"limits": {"memory": "1Gi"}, "requests": {}}, ["requests"]),
    ({"limits": {"memory": "1Gi"}, "claims": [{"name": "gpu"}]}, ["claims"]),
    ({"requests": {"cpu": "1"}, "claims": []}, ["requests", "claims"]),
])
def test_requests_and_claims_are_refused(resources: dict[str, Any], refused: list[str]) -> None:
    result = run(template(resources=resources), [ROOMY])
    assert by_rule(result, "actor-no-requests") == [
        f"error: actors are sized by spec.resources.limits only; remove spec.resources.{field}"
        for field in refused]


# --------------------------------------------------------------------------- 2. limits parse

@pytest.mark.parametrize(("limits", "cls", "problem"), [
    ({"cpu": "500m", "memory": "1Gi"}, "microvm", None),
    ({"cpu": 2, "memory": 1073741824}, "microvm", None),
    ({"cpu": "1", "nvidia.com/gpu": "1"}, "gvisor", None),
    ({"cpu": "0"}, "gvisor", "spec.resources.limits.cpu: '0' must be greater than zero"),
    ({"memory": "-1Gi"}, "gvisor", "spec.resources.limits.memory: '-1Gi' must be greater than zero"),
    ({"memory": "lots"}, "gvisor", "spec.resources.limits.memory: 'lots' is not a quantity"),
    ({"cpu": True}, "gvisor", "spec.resources.limits.cpu: expected a quantity, got True"),
    ({"ephemeral-storage": "1Gi"}, "gvisor",
     "spec.resources.limits.ephemeral-storage: not supported; actors take cpu, memory"),
    ({"nvidia.com/gpu": "1", "memory": "1Gi"}, "microvm",
     "spec.resources.limits.nvidia.com/gpu: only with sandboxClass gvisor; microvm has no GPU"),
    ({"nvidia.com/gpu": "500m"}, "gvisor",
     "spec.resources.limits.nvidia.com/gpu: '500m' must be a whole number of GPUs"),
])
def test_limits_parse_are_positive_and_named(limits: dict[str, Any], cls: str,
                                             problem: str | None) -> None:
    gpu_pool = pool({"nvidia.com/gpu": "1"}, cls="gvisor", name="gpu")
    result = run(template(limits, cls=cls), [ROOMY, ROOMY_GVISOR, gpu_pool])
    found = by_rule(result, "actor-limits")
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith(f"error: {problem}"), found
    assert result.internal_errors == []


def test_a_malformed_template_is_refused_by_one_rule_not_crashed_on() -> None:
    result = run(template(resources={"limits": ["cpu", "1"]}), [ROOMY])
    assert result.internal_errors == []
    assert [(f.rule, f.path) for f in result.errors] == [("actor-limits", "spec.resources.limits")]


def test_unknown_fields_are_kept_and_never_judged() -> None:
    obj = template({"cpu": "1", "memory": "1Gi"}, futureField={"anything": [1, 2]},
                   volumes=[{"name": "data", "durableDir": {}}])
    result = run(obj, [ROOMY])
    assert result.findings == [] and result.patch == []


# --------------------------------------------------------------------------- 3. micro-VM floor

@pytest.mark.parametrize(("limits", "cls", "refused"), [
    ({"memory": "255Mi"}, "microvm", True),
    ({"memory": "256Mi"}, "microvm", False),
    ({"memory": "0.25Gi"}, "microvm", False),
    ({"memory": "268435455"}, "microvm", True),
    ({"memory": "64Mi"}, "gvisor", False),
    ({"memory": "64Mi"}, None, False),  # sandboxClass defaults to gvisor
    ({"cpu": "1"}, "microvm", False),  # no memory limit: the runtime default applies
    (None, "microvm", False),  # no resources at all
])
def test_microvm_memory_floor_with_the_default_settings(limits: dict[str, Any] | None, cls: str | None,
                                                        refused: bool) -> None:
    result = run(template(limits, cls=cls), [ROOMY, ROOMY_GVISOR])
    found = by_rule(result, "actor-microvm-memory-floor")
    assert bool(found) is refused
    assert (result.errors != []) is refused


def test_floor_message_states_the_floor_and_how_it_is_made_up() -> None:
    result = run(template({"memory": "255Mi"}), [ROOMY])
    assert by_rule(result, "actor-microvm-memory-floor") == [
        "error: microvm limits.memory 255Mi is below the floor of "
        "256Mi (128Mi VMM reserve + 128Mi guest minimum)"]


@pytest.mark.parametrize(("memory", "refused"), [("256Mi", True), ("383Mi", True), ("384Mi", False)])
def test_a_changed_reserve_moves_the_floor(memory: str, refused: bool) -> None:
    policy = Policy.model_validate({"actors": {"vmmReserve": "256Mi"}})
    result = run(template({"memory": memory}), [ROOMY], policy=policy)
    found = by_rule(result, "actor-microvm-memory-floor")
    assert bool(found) is refused
    if refused:
        assert found[0].endswith("below the floor of 384Mi (256Mi VMM reserve + 128Mi guest minimum)")


def test_a_changed_guest_minimum_moves_the_floor() -> None:
    policy = Policy.model_validate({"actors": {"guestMinimum": "1Gi"}})
    assert by_rule(run(template({"memory": "1Gi"}), [ROOMY], policy=policy),
                   "actor-microvm-memory-floor") == [
        "error: microvm limits.memory 1Gi is below the floor of 1152Mi "
        "(128Mi VMM reserve + 1Gi guest minimum)"]


# --------------------------------------------------------------------------- 4. immutable spec

@pytest.mark.parametrize(("before", "after"), [
    (template({"memory": "1Gi"}), template({"memory": "1024Mi"})),
    (template({"cpu": "1"}), template({"cpu": "1000m"})),
    (template({"cpu": 2}), template({"cpu": "2"})),
    (template({"memory": "1Gi"}, cls=None), template({"memory": "1Gi"}, cls="gvisor")),
])
def test_update_compares_parsed_values(before: dict[str, Any], after: dict[str, Any]) -> None:
    result = run(after, [ROOMY, ROOMY_GVISOR], operation="UPDATE", old=before)
    assert result.findings == []


def test_update_changing_the_spec_is_refused_with_the_numbers() -> None:
    result = run(template({"memory": "2Gi"}), [ROOMY], operation="UPDATE",
                 old=template({"memory": "1Gi"}))
    assert by_rule(result, "actor-spec-immutable") == [
        "error: ActorTemplate spec is immutable (baked into snapshots); "
        "changed spec.resources.limits.memory 1Gi -> 2Gi"]
    assert [f.path for f in result.errors] == ["spec.resources.limits.memory"]


def test_update_names_the_first_change_and_counts_the_rest() -> None:
    after = template({"memory": "2Gi"}, cls="gvisor")
    after["spec"]["containers"][0]["image"] = "registry.example/agent@sha256:11"
    result = run(after, [ROOMY, ROOMY_GVISOR], operation="UPDATE", old=template({"memory": "1Gi"}))
    assert by_rule(result, "actor-spec-immutable") == [
        "error: ActorTemplate spec is immutable (baked into snapshots); "
        "changed spec.containers[0].image and 2 more"]


def test_metadata_only_updates_pass_even_when_the_template_no_longer_places() -> None:
    old = template({"memory": "4Gi"}, workerSelector={"matchLabels": {"tier": "big"}})
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "a"}
    new["metadata"]["finalizers"] = ["example.com/keep"]
    small = pool({"memory": "1Gi"}, labels={"tier": "big"})
    result = run(new, [small], operation="UPDATE", old=old)
    assert result.findings == []
    assert by_rule(run(new, [small]), "actor-placement") != []  # would not place on CREATE


def test_immutability_in_warn_mode_only_warns() -> None:
    policy = Policy.model_validate({"rules": {"actor-spec-immutable": "warn"}})
    result = run(template({"memory": "2Gi"}), [ROOMY], operation="UPDATE",
                 old=template({"memory": "1Gi"}), policy=policy)
    assert result.errors == []
    assert [f.rule for f in result.warnings] == ["actor-spec-immutable"]


# --------------------------------------------------------------------------- 5. placement

def test_placement_names_the_largest_capacity_on_offer() -> None:
    pools = [pool({"memory": "256Mi"}, name="small"), pool({"memory": "128Mi", "cpu": "4"}, name="tiny")]
    result = run(template({"memory": "512Mi"}), pools)
    assert by_rule(result, "actor-placement") == [
        "error: needs 512Mi memory; the largest microvm WorkerPool in team-a offers 256Mi"]
    assert [f.path for f in result.errors] == ["spec.resources.limits"]


def test_placement_reports_every_short_dimension() -> None:
    result = run(template({"cpu": "2", "memory": "512Mi"}), [pool({"cpu": "1", "memory": "256Mi"})])
    assert by_rule(result, "actor-placement") == [
        "error: needs 2 cpu, 512Mi memory; the largest microvm WorkerPool in team-a "
        "offers 1 cpu, 256Mi memory"]


def test_placement_needs_one_pool_that_fits_on_every_dimension() -> None:
    pools = [pool({"cpu": "4", "memory": "256Mi"}, name="wide"),
             pool({"cpu": "1", "memory": "4Gi"}, name="tall")]
    result = run(template({"cpu": "2", "memory": "512Mi"}), pools)
    assert by_rule(result, "actor-placement") == [
        "error: needs 2 cpu, 512Mi memory on one worker; "
        "no microvm WorkerPool in team-a offers all of it"]


@pytest.mark.parametrize(("limits", "capacity"), [
    ({"cpu": "2", "memory": "1Gi"}, {"cpu": "2", "memory": "1Gi"}),  # equal fits
    ({"cpu": "2", "memory": "1Gi"}, {"cpu": "2000m", "memory": "1024Mi"}),
    ({"cpu": "2", "memory": "1Gi"}, None),  # no limits on the pool: unconstrained
    ({"cpu": "2", "memory": "1Gi"}, {"memory": "2Gi"}),  # absent cpu: unconstrained
    ({"cpu": "2", "memory": "1Gi"}, {"cpu": "0", "memory": "2Gi"}),  # zero cpu: unconstrained
    ({"memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),  # actor without cpu: unconstrained
    (None, {"cpu": "1", "memory": "256Mi"}),  # actor without limits fits anywhere
])
def test_placement_fits(limits: dict[str, Any] | None, capacity: dict[str, Any] | None) -> None:
    result = run(template(limits, cls="gvisor"), [pool(capacity, cls="gvisor")])
    assert by_rule(result, "actor-placement") == []


def test_only_pools_of_the_same_class_and_namespace_count() -> None:
    elsewhere = [pool({"memory": "8Gi"}, cls="gvisor", name="other-class"),
                 pool({"memory": "8Gi"}, namespace="team-b", name="other-namespace")]
    result = run(template({"memory": "1Gi"}), elsewhere)
    assert result.errors == []
    assert by_rule(result, "actor-placement") == [
        "warning: no microvm WorkerPool in team-a yet; actors cannot be placed until one exists"]
    assert by_rule(run(template({"memory": "1Gi"}), [*elsewhere, pool({"memory": "512Mi"})]),
                   "actor-placement") == [
        "error: needs 1Gi memory; the largest microvm WorkerPool in team-a offers 512Mi"]


def test_a_gpu_actor_needs_a_pool_with_gpus() -> None:
    result = run(template({"nvidia.com/gpu": "1"}, cls="gvisor"), [ROOMY_GVISOR])
    assert by_rule(result, "actor-placement") == [
        "error: needs 1 GPU; the largest gvisor WorkerPool in team-a offers 0 GPU"]
    gpu_pool = pool({"nvidia.com/gpu": "2"}, cls="gvisor", name="gpu")
    assert by_rule(run(template({"nvidia.com/gpu": "1"}, cls="gvisor"), [gpu_pool]), "actor-placement") == []


LABELLED = [pool({"memory": "256Mi"}, name="small", labels={"tier": "small", "zone": "a"}),
            pool({"memory": "4Gi"}, name="big", labels={"tier": "big", "zone": "b"}),
            pool({"memory": "8Gi"}, name="bare")]


@pytest.mark.parametrize(("selector", "fits"), [
    (None, True),
    ({}, True),  # an empty selector selects every pool
    ({"matchLabels": {"tier": "big"}}, True),
    ({"matchLabels": {"tier": "small"}}, False),
    ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "c"]}]}, True),
    ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["big"]}]}, True),  # bare
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, True),
    ({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}, True),
    ({"matchLabels": {"zone": "a"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}, False),
])
def test_worker_selector_selects_pools_by_their_labels(selector: dict[str, Any] | None, fits: bool) -> None:
    obj = template({"memory": "1Gi"}, **({} if selector is None else {"workerSelector": selector}))
    found = by_rule(run(obj, LABELLED), "actor-placement")
    assert (found == []) is fits, found
    if not fits:
        assert found == ["error: needs 1Gi memory; the largest microvm WorkerPool in team-a matching "
                         "workerSelector offers 256Mi"]


def test_a_selector_matching_no_pool_is_refused() -> None:
    obj = template({"memory": "1Gi"}, workerSelector={"matchLabels": {"tier": "gpu"}})
    assert by_rule(run(obj, LABELLED), "actor-placement") == [
        "error: workerSelector tier=gpu matches none of the 3 microvm WorkerPools in team-a"]


def test_an_invalid_selector_is_refused() -> None:
    obj = template({"memory": "1Gi"}, workerSelector={
        "matchExpressions": [{"key": "tier", "operator": "In"},
                             {"key": "zone", "operator": "Exists", "values": ["a"]}]})
    result = run(obj, LABELLED)
    assert by_rule(result, "actor-placement") == ["error: workerSelector: tier In needs values",
                                                  "error: workerSelector: zone Exists takes no values"]
    assert result.internal_errors == []


@pytest.mark.parametrize(("mode", "expected"), [
    ("enforce", ["error: needs 512Mi memory; the largest microvm WorkerPool in team-a offers 256Mi"]),
    ("warn", ["warning: needs 512Mi memory; the largest microvm WorkerPool in team-a offers 256Mi"]),
    ("off", []),
])
def test_placement_modes(mode: str, expected: list[str]) -> None:
    policy = Policy.model_validate({"rules": {"actor-placement": mode}})
    result = run(template({"memory": "512Mi"}), [pool({"memory": "256Mi"})], policy=policy)
    assert by_rule(result, "actor-placement") == expected


def test_modes_come_from_the_environment_too() -> None:
    policy = load_policy(None, {"ENVELOPE_RULE_ACTOR_MICROVM_MEMORY_FLOOR": "warn",
                                "ENVELOPE_RULE_ACTOR_PLACEMENT": "off"}, RULES)
    result = run(template({"memory": "255Mi"}), [pool({"memory": "128Mi"})], policy=policy)
    assert result.errors == []
    assert [f.rule for f in result.warnings] == ["actor-microvm-memory-floor"]


class IndexOnlyView(StaticView):
    """Fails the test if a rule scans a kind instead of asking an index."""

    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        raise AssertionError(f"scanned {kind} in {namespace!r}; use an index")


def test_rules_read_the_cluster_through_indexes_only() -> None:
    cluster = [*LABELLED, *(pool({"memory": "1Gi"}, namespace=f"ns-{i}", name=f"p{i}") for i in range(50)),
               template({"memory": "512Mi"}, name="placed")]
    view = IndexOnlyView(cluster)
    assert len(view.by_index(POOLS_BY_CLASS, f"{NS}/microvm")) == 3
    assert run(template({"cpu": "1", "memory": "1Gi"}), view=view).errors == []
    shrunk = pool({"memory": "256Mi"}, name="big", labels={"tier": "big", "zone": "b"})
    result = run(shrunk, operation="UPDATE", old=LABELLED[1], view=view)
    assert result.internal_errors == []


def test_the_index_keeps_ate_objects_without_api_version_and_drops_other_groups() -> None:
    bare = pool({"memory": "256Mi"}, name="from-a-list")
    del bare["apiVersion"]
    foreign = {**pool({"memory": "8Gi"}, name="foreign"), "apiVersion": "example.com/v1"}
    assert by_rule(run(template({"memory": "512Mi"}), [bare, foreign]), "actor-placement") == [
        "error: needs 512Mi memory; the largest microvm WorkerPool in team-a offers 256Mi"]


# --------------------------------------------------------------------------- 6. warnings

@pytest.mark.parametrize(("actor", "worker", "warned"), [
    ({"cpu": "2", "memory": "512Mi"}, {"cpu": "2", "memory": "4Gi"}, True),
    ({"cpu": "2000m", "memory": "512Mi"}, {"cpu": "2", "memory": "4Gi"}, True),
    ({"cpu": "1500m", "memory": "512Mi"}, {"cpu": "2", "memory": "4Gi"}, False),
    ({"cpu": "2", "memory": "512Mi"}, {"memory": "4Gi"}, False),  # no CPU limit: no quota to share
    ({"memory": "512Mi"}, {"cpu": "2", "memory": "4Gi"}, False),  # no CPU declared
])
def test_microvm_actor_declaring_the_whole_worker_cpu(actor: dict[str, Any], worker: dict[str, Any],
                                                      warned: bool) -> None:
    result = run(template(actor), [pool(worker, name="vm")])
    assert result.errors == []
    expected = ["warning: microvm actor takes all 2 cpu of WorkerPool vm's workers; "
                "VMM threads share that quota"]
    assert by_rule(result, "actor-microvm-cpu-share") == (expected if warned else [])


def test_whole_cpu_is_not_a_concern_on_gvisor() -> None:
    result = run(template({"cpu": "2"}, cls="gvisor"), [pool({"cpu": "2"}, cls="gvisor")])
    assert result.findings == []


@pytest.mark.parametrize(("actor", "worker", "warned"), [
    ("1Gi", "1Gi", True),
    ("1Gi", "1100Mi", True),
    ("1Gi", "1152Mi", False),  # exactly limit + reserve
    ("1Gi", None, False),  # no memory limit on the worker
])
def test_microvm_memory_plus_reserve_must_fit_the_worker(actor: str, worker: str | None,
                                                         warned: bool) -> None:
    capacity = {"memory": worker} if worker else {"cpu": "4"}
    result = run(template({"memory": actor}), [pool(capacity, name="vm")])
    assert result.errors == []
    found = by_rule(result, "actor-microvm-memory-headroom")
    assert bool(found) is warned
    if warned:
        assert found == [f"warning: microvm 1Gi + 128Mi VMM reserve exceeds WorkerPool vm's "
                         f"{worker} workers"]


def test_memory_headroom_follows_the_configured_reserve() -> None:
    policy = Policy.model_validate({"actors": {"vmmReserve": "512Mi"}})
    result = run(template({"memory": "1Gi"}), [pool({"memory": "1280Mi"}, name="vm")], policy=policy)
    assert by_rule(result, "actor-microvm-memory-headroom") == [
        "warning: microvm 1Gi + 512Mi VMM reserve exceeds WorkerPool vm's 1280Mi workers"]


def test_warning_rules_can_be_turned_off() -> None:
    policy = Policy.model_validate({"rules": {"actor-microvm-cpu-share": "off",
                                              "actor-microvm-memory-headroom": "off"}})
    result = run(template({"cpu": "2", "memory": "1Gi"}), [pool({"cpu": "2", "memory": "1Gi"})],
                 policy=policy)
    assert result.findings == []


# --------------------------------------------------------------------------- 7. WorkerPool

BIG = pool({"cpu": "4", "memory": "4Gi"}, name="big", labels={"tier": "big"})


def shrink(limits: dict[str, Any], cluster: list[dict[str, Any]], policy: Policy | None = None,
           **changes: Any) -> Evaluation:
    after = pool(limits, name="big", labels=changes.pop("labels", {"tier": "big"}),
                 cls=changes.pop("cls", "microvm"))
    return run(after, [BIG, *cluster], operation="UPDATE", old=BIG, policy=policy)


def test_shrinking_below_a_placed_template_warns_naming_it() -> None:
    result = shrink({"cpu": "4", "memory": "1Gi"}, [template({"memory": "2Gi"}, name="agent")])
    assert result.errors == []
    assert by_rule(result, "actor-pool-shrink") == [
        "warning: ActorTemplate agent needs 2Gi memory; this WorkerPool would offer 1Gi memory; "
        "no other WorkerPool fits it"]


def test_shrink_in_enforce_mode_refuses() -> None:
    policy = Policy.model_validate({"rules": {"actor-pool-shrink": "enforce"}})
    result = shrink({"memory": "1Gi"}, [template({"memory": "2Gi"})], policy=policy)
    assert [f.rule for f in result.errors] == ["actor-pool-shrink"]


def test_shrink_says_nothing_when_templates_still_fit_or_never_used_the_pool() -> None:
    cluster = [template({"memory": "1Gi"}, name="fits"),
               template({"memory": "2Gi"}, cls="gvisor", name="other-class"),
               template({"memory": "2Gi"}, name="elsewhere", workerSelector={"matchLabels": {"tier": "x"}}),
               template({"memory": "8Gi"}, name="never-fit"),
               template({"memory": "2Gi"}, namespace="team-b", name="other-namespace")]
    assert shrink({"memory": "1Gi"}, cluster).findings == []


def test_shrink_with_another_pool_still_fitting_does_not_say_stranded() -> None:
    other = pool({"memory": "8Gi"}, name="other")
    assert by_rule(shrink({"memory": "1Gi"}, [other, template({"memory": "2Gi"})]), "actor-pool-shrink") == [
        "warning: ActorTemplate agent needs 2Gi memory; this WorkerPool would offer 1Gi memory"]


def test_the_admitted_pool_replaces_its_cached_version() -> None:
    # the view still holds the old 4Gi "big"; it must not count as another pool that fits
    found = by_rule(shrink({"memory": "1Gi"}, [template({"memory": "2Gi"})]), "actor-pool-shrink")
    assert found and found[0].endswith("no other WorkerPool fits it")


def test_changing_class_or_labels_away_from_a_template_warns() -> None:
    cluster = [template({"memory": "2Gi"}, workerSelector={"matchLabels": {"tier": "big"}})]
    assert by_rule(shrink({"memory": "4Gi"}, cluster, labels={"tier": "small"}), "actor-pool-shrink") == [
        "warning: ActorTemplate agent's workerSelector no longer matches this WorkerPool's labels; "
        "no other WorkerPool fits it"]
    assert by_rule(shrink({"memory": "4Gi"}, cluster, cls="gvisor"), "actor-pool-shrink") == [
        "warning: ActorTemplate agent cannot use a gvisor WorkerPool (was microvm); "
        "no other WorkerPool fits it"]


@pytest.mark.parametrize(("cls", "limits", "requests", "problems"), [
    ("gvisor", {"nvidia.com/gpu": "1", "cpu": "1"}, {"nvidia.com/gpu": "1"}, []),
    ("gvisor", {"nvidia.com/gpu": "1"}, None, []),
    ("gvisor", {"cpu": "1"}, {"nvidia.com/gpu": "1"}, ["nvidia.com/gpu request 1 needs a matching limit"]),
    ("gvisor", {"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"},
     ["nvidia.com/gpu request 1 must equal its limit 2"]),
    ("microvm", {"nvidia.com/gpu": "1"}, None,
     ["nvidia.com/gpu is only supported with sandboxClass gvisor, not microvm"]),
    ("microvm", None, {"nvidia.com/gpu": "1"},
     ["nvidia.com/gpu is only supported with sandboxClass gvisor, not microvm",
      "nvidia.com/gpu request 1 needs a matching limit"]),
    ("microvm", {"cpu": "2", "memory": "4Gi"}, {"cpu": "500m", "memory": "4Gi"}, []),
    ("microvm", {"memory": "lots"}, {"cpu": "-1"},
     ["spec.template.resources.limits.memory: 'lots' is not a quantity (examples: 500m, 2, 1.5Gi, 29G, 1e3)",
      "spec.template.resources.requests.cpu: '-1' is negative"]),
])
def test_pool_resources(cls: str, limits: dict[str, Any] | None, requests: dict[str, Any] | None,
                        problems: list[str]) -> None:
    result = run(pool(limits, cls=cls, requests=requests))
    assert by_rule(result, "actor-pool-resources") == [f"error: {p}" for p in problems]


def test_a_metadata_only_update_of_a_pool_is_not_rejudged() -> None:
    old = pool({"nvidia.com/gpu": "1"}, cls="microvm")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"note": "x"}
    assert run(new, operation="UPDATE", old=old).findings == []


def test_a_pool_with_an_unparsable_capacity_does_not_break_placement() -> None:
    result = run(template({"memory": "1Gi"}), [pool({"memory": "lots"})])
    assert result.internal_errors == [] and result.errors == []


# --------------------------------------------------------------------------- messages

def test_messages_fit_a_warning_header() -> None:
    """Warnings become HTTP headers (and errors become warnings in warn mode)."""
    cases = [
        run(template({"memory": "255Mi"}, name="research-agent"), [pool({"memory": "128Mi"})]),
        run(template({"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "8"}, cls="gvisor",
                     name="research-agent"), [pool({"cpu": "8", "memory": "32Gi"}, cls="gvisor")]),
        run(template({"memory": "1Gi"}, workerSelector={"matchLabels": {"tier": "large", "zone": "eu-1"}}),
            LABELLED),
        run(template({"cpu": "4", "memory": "8Gi"}, name="research-agent"),
            [pool({"cpu": "4", "memory": "8Gi"}, name="microvm-large-workers")]),
        shrink({"memory": "1Gi"}, [template({"cpu": "2", "memory": "2Gi"}, name="research-agent",
                                            workerSelector={"matchLabels": {"tier": "big"}})]),
        shrink({"memory": "1Gi"}, [template({"memory": "2Gi"}, name="research-agent")], cls="gvisor"),
        run(template({"memory": "2Gi"}), [ROOMY], operation="UPDATE", old=template({"memory": "1Gi"})),
        run(template(resources={"requests": {"cpu": "1"}, "claims": []}), [ROOMY]),
    ]
    messages = [f.message for result in cases for f in result.findings]
    assert len(messages) >= 10
    assert [m for m in messages if len(m) >= 120] == [], [len(m) for m in messages]


# --------------------------------------------------------------------------- envelope check

def write_manifests(directory: Path, objects: list[dict[str, Any]]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "actors.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return directory


def check(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, list[dict[str, str]]]]:
    code = main(["check", "-f", str(directory), "--output", "json"])
    entries = json.loads(capsys.readouterr().out)["objects"]
    return code, {f"{e['kind']}/{e['name']}": [{k: v for k, v in f.items() if k != "line"}
                                               for f in e["findings"]] for e in entries}


def test_envelope_check_reports_placement_over_a_namespace(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    objects = [
        pool({"cpu": "2", "memory": "1Gi"}, name="vm-small"),
        pool({"cpu": "8", "memory": "8Gi"}, cls="gvisor", name="sandboxes"),
        template({"cpu": "1", "memory": "512Mi"}, name="fits"),
        template({"cpu": "1", "memory": "2Gi"}, name="too-big"),
        template({"memory": "4Gi"}, cls="gvisor", name="gvisor-agent"),
    ]
    code, findings = check(write_manifests(tmp_path / "ns", objects), capsys)
    assert code == 1
    assert findings["ActorTemplate/fits"] == []
    assert findings["ActorTemplate/gvisor-agent"] == []
    assert findings["WorkerPool/vm-small"] == [] and findings["WorkerPool/sandboxes"] == []
    assert findings["ActorTemplate/too-big"] == [{
        "severity": "error", "rule": "actor-placement", "path": "spec.resources.limits",
        "message": "needs 2Gi memory; the largest microvm WorkerPool in team-a offers 1Gi"}]


def test_envelope_check_warns_when_the_pool_is_not_there_yet(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code, findings = check(write_manifests(tmp_path / "ns", [template({"memory": "1Gi"})]), capsys)
    assert code == 0
    assert [(f["severity"], f["rule"]) for f in findings["ActorTemplate/agent"]] == [
        ("warning", "actor-placement")]
