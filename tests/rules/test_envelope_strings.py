"""String envelopes in env vars: the cases where the env string and the pod's resources
can disagree."""

from __future__ import annotations

import jsonpatch
import pytest

from app.core.config import EnvelopeEnv, Policy
from app.core.engine import Evaluation
from app.k8s.quantity import QuantityError
from app.rules.envelope import parse_envelope_string
from tests.conftest import container, run, workload


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ("cpu=7,memory=29Gi", "memory=29Gi"),
        ("cpu=7, memory=29Gi", "memory=29Gi"),  # the whitespace case one twin missed
        (" cpu=7 , memory=29Gi ", "memory=29Gi"),
        ("CPU=7,memory=29Gi", "memory=29Gi"),  # keys match case-insensitively
        ("memory=29Gi,cpu=7", "memory=29Gi"),
        ("cpu=7,memory=29Gi,ephemeral-storage=26Gi", "memory=29Gi,ephemeral-storage=26Gi"),
        ("cpuset=0-3,cpu=2,memory=1Gi", "cpuset=0-3,memory=1Gi"),  # whole-key match
        ("cpu=7", "cpu=7"),  # cpu-only: unchanged, never empty
        ("cpu=7,cpu=8", "cpu=7,cpu=8"),
        ("", ""),  # empty stays empty
        ("memory=29Gi", "memory=29Gi"),
        ("cpu=7,,memory=29Gi", "memory=29Gi"),  # empty pairs dropped with the cpu pair
    ],
)
def test_without_cpu(limits: str, expected: str) -> None:
    assert parse_envelope_string(limits).without_cpu() == expected


def test_bad_pair() -> None:
    with pytest.raises(QuantityError, match="not a key=value pair"):
        parse_envelope_string("cpu7,memory=1Gi")


def env(limits: str | None, requests: str | None) -> list[dict]:
    out = []
    if limits is not None:
        out.append({"name": "RESOURCE_LIMITS", "value": limits})
    if requests is not None:
        out.append({"name": "RESOURCE_REQUESTS", "value": requests})
    out.append({"name": "OTHER", "value": "cpu=1"})
    return out


def test_webhook_strips_cpu_from_limits_env_only() -> None:
    obj = workload("Job", [container(env=env("cpu=7, memory=29Gi", "cpu=7,memory=29Gi"))])
    result = run(obj)
    assert result.errors == []
    after = jsonpatch.apply_patch(obj, result.patch)
    values = [e["value"] for e in after["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert values == ["memory=29Gi", "cpu=7,memory=29Gi", "cpu=1"]
    assert result.patch == [{"op": "add", "path": "/metadata/annotations",
                             "value": {"envelope.io/mutations": "env-envelope-cpu:app"}},
                            {"op": "replace",
                             "path": "/spec/template/spec/containers/0/env/0/value",
                             "value": "memory=29Gi"}]


def test_value_from_is_untouched() -> None:
    var = {"name": "RESOURCE_LIMITS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    obj = workload("Deployment", [container(env=[var])])
    assert run(obj).patch == []


@pytest.mark.parametrize(
    ("limits", "requests", "fragment"),
    [
        ("memory=29Gi", "cpu=7,memory=28Gi", "memory=29Gi differs from RESOURCE_REQUESTS memory=28Gi"),
        ("cpu=2", "cpu=7,memory=1Gi", "cpu=2 is below RESOURCE_REQUESTS cpu=7"),
        ("cpu=x,memory=1Gi", "memory=1Gi", "'x' is not a quantity"),
        ("memory=1Gi", "bogus", "not a key=value pair"),
    ],
)
def test_inconsistent_string_envelopes_denied(limits: str, requests: str, fragment: str) -> None:
    obj = workload("Deployment", [container(env=env(limits, requests))])
    result = run(obj)
    assert any(fragment in e.message for e in result.errors), result.errors
    assert all(e.rule == "env-envelope-consistency" for e in result.errors)


@pytest.mark.parametrize(("limits", "requests"), [
    ("memory=1024Mi", "cpu=7,memory=1Gi"),
    ("cpu=8,memory=1Gi", "cpu=7,memory=1Gi"),
    ("memory=1Gi", None),
])
def test_consistent_string_envelopes_pass(limits: str, requests: str | None) -> None:
    obj = workload("Deployment", [container(env=env(limits, requests))])
    assert run(obj).errors == []


def test_env_names_are_configurable() -> None:
    policy = Policy(envelopeEnv=EnvelopeEnv(limits="LIM", requests="REQ"))
    obj = workload("Deployment", [container(env=[{"name": "LIM", "value": "cpu=1,memory=1Gi"},
                                                 {"name": "RESOURCE_LIMITS", "value": "cpu=1,a=b"}])])
    after = jsonpatch.apply_patch(obj, run(obj, policy).patch)
    values = [e["value"] for e in after["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert values == ["memory=1Gi", "cpu=1,a=b"]


def test_opt_out_keeps_cpu_in_string_envelope() -> None:
    obj = workload("Deployment", [container(env=env("cpu=7,memory=1Gi", "cpu=7,memory=1Gi"))],
                   template_annotations={"envelope.io/keep-cpu-limit": "true"})
    assert run(obj).patch == []


def test_long_strings_parse_the_same_but_are_not_cached() -> None:
    from app.rules import envelope as module

    long_text = "cpu=7," + ",".join(f"k{i}=v{i}" for i in range(60)) + ",memory=29Gi"
    assert len(long_text) > 256
    before = module._parse_cached.cache_info().currsize
    parsed = parse_envelope_string(long_text)
    assert parsed.get("memory") == "29Gi" and parsed.without_cpu() == long_text[len("cpu=7,"):]
    assert module._parse_cached.cache_info().currsize == before  # a caller cannot fill memory
    parse_envelope_string("cpu=3,memory=1Gi")
    assert parse_envelope_string("cpu=3,memory=1Gi") is parse_envelope_string("cpu=3,memory=1Gi")


# --- class 6 of issue 12: the value the container sees (kubelet makeEnvironmentVariables
# and third_party/forked/golang/expansion, Kubernetes v1.34.12, ported then) -----------------

def _values(obj: dict, result: Evaluation) -> list[str | None]:
    after = jsonpatch.apply_patch(obj, result.patch)
    return [e.get("value") for e in after["spec"]["template"]["spec"]["containers"][0]["env"]]


def _warnings(result: Evaluation) -> list[str]:
    return [f.message for f in result.warnings]


def test_last_duplicate_is_the_one_stripped_and_judged() -> None:
    # The kubelet's map keeps the last entry of a name: 2Gi, which RESOURCE_REQUESTS agrees with.
    env_ = [{"name": "RESOURCE_LIMITS", "value": "cpu=1,memory=1Gi"},
            {"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=2Gi"},
            {"name": "RESOURCE_REQUESTS", "value": "cpu=2,memory=2Gi"}]
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    assert result.errors == []
    assert _values(obj, result) == ["cpu=1,memory=1Gi", "memory=2Gi", "cpu=2,memory=2Gi"]


def test_last_duplicate_disagreeing_is_denied_at_its_index() -> None:
    env_ = [{"name": "RESOURCE_LIMITS", "value": "memory=2Gi"},
            {"name": "RESOURCE_LIMITS", "value": "memory=1Gi"},
            {"name": "RESOURCE_REQUESTS", "value": "memory=2Gi"}]
    result = run(workload("Deployment", [container(env=env_)]))
    assert [e.path for e in result.errors] == ["spec.template.spec.containers[0].env[1].value"]
    assert "memory=1Gi differs from RESOURCE_REQUESTS memory=2Gi" in result.errors[0].message


def test_a_cpu_pair_is_dropped_by_its_key_and_a_reference_kept_as_written() -> None:
    env_ = [{"name": "MEM", "value": "4Gi"},
            {"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=$(MEM)"},
            {"name": "RESOURCE_REQUESTS", "value": "cpu=2,memory=4Gi"}]
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    assert result.errors == [] and _warnings(result) == []
    env_after = jsonpatch.apply_patch(obj, result.patch)["spec"]["template"]["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env_after] == ["4Gi", "memory=$(MEM)", "cpu=2,memory=4Gi"]
    assert "4Gi" not in " ".join(c.message for c in result.changes)


@pytest.mark.parametrize(("limits", "expected"), [
    # seed 000: the installer drops a pair by its key, whatever the value holds
    ("cpu=$(CPU),memory=29Gi", "memory=29Gi"),
    (" CPU = $(CPU) , memory=29Gi", "memory=29Gi"),
    ("memory=29Gi,cpu=$(CPU)m", "memory=29Gi"),
    ("cpu=$(UNDEFINED),memory=$(MEM)", "memory=$(MEM)"),
    ("cpuset=$(SET),cpu=$(CPU),memory=29Gi", "cpuset=$(SET),memory=29Gi"),
])
def test_a_cpu_pair_whose_value_is_a_reference_is_dropped(limits: str, expected: str) -> None:
    env_ = [{"name": "CPU", "value": "7"}, {"name": "MEM", "value": "29Gi"},
            {"name": "SET", "value": "0-3"}, {"name": "RESOURCE_LIMITS", "value": limits}]
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    assert result.errors == []
    assert jsonpatch.apply_patch(obj, result.patch)["spec"]["template"]["spec"]["containers"][0][
        "env"][3]["value"] == expected
    (changed,) = [c for c in result.changes if c.rule == "env-envelope-cpu"]
    assert "dropped by its key" in changed.message


@pytest.mark.parametrize("limits", [
    "cpu=$(CPU)",  # cpu-only: never emptied
    "$(PAIRS)",  # a reference standing for whole pairs: its key is not written
    "$(K)=7,memory=29Gi",
])
def test_a_cpu_pair_not_written_out_is_not_rewritten(limits: str) -> None:
    env_ = [{"name": "CPU", "value": "7"}, {"name": "PAIRS", "value": "cpu=7,memory=29Gi"},
            {"name": "K", "value": "cpu"}, {"name": "RESOURCE_LIMITS", "value": limits}]
    result = run(workload("Deployment", [container(env=env_)]))
    assert [c for c in result.changes if c.rule == "env-envelope-cpu"] == []
    if limits != "cpu=$(CPU)":
        (text,) = _warnings(result)
        assert "keeps its cpu pair" in text and "stands for whole pairs" in text


def test_an_expanded_reference_that_disagrees_is_denied() -> None:
    env_ = [{"name": "MEM", "value": "2Gi"},
            {"name": "RESOURCE_LIMITS", "value": "memory=$(MEM)"},
            {"name": "RESOURCE_REQUESTS", "value": "memory=1Gi"}]
    result = run(workload("Deployment", [container(env=env_)]))
    (err,) = result.errors
    assert "memory from $(MEM) differs from RESOURCE_REQUESTS memory=1Gi" in err.message
    assert "2Gi" not in err.message  # another variable's value: named, never shown


@pytest.mark.parametrize(("env_", "unresolved"), [
    # undefined: the kubelet leaves $(MEM) as written
    ([{"name": "RESOURCE_LIMITS", "value": "gpu=1,memory=$(MEM)"}], "$(MEM)"),
    # order matters: MEM is defined only after the entry that refers to it
    ([{"name": "RESOURCE_LIMITS", "value": "memory=$(MEM)"}, {"name": "MEM", "value": "1Gi"}],
     "$(MEM)"),
    # through an earlier entry whose own reference stayed literal
    ([{"name": "A", "value": "$(X)"}, {"name": "RESOURCE_LIMITS", "value": "memory=$(A)"}], "$(X)"),
])
def test_unresolved_reference_is_left_as_written_with_a_warning(env_: list, unresolved: str) -> None:
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    assert result.errors == [] and result.patch == []
    (text,) = _warnings(result)
    assert f"left as written: {unresolved} is not resolved" in text


def test_env_from_is_named_when_it_may_define_the_reference() -> None:
    c = container(env=[{"name": "RESOURCE_LIMITS", "value": "memory=$(MEM)"}],
                  envFrom=[{"configMapRef": {"name": "sizes"}}])
    (text,) = _warnings(run(workload("Deployment", [c])))
    assert "envFrom may, on the node" in text


def test_escaped_reference_is_a_literal_not_a_reference() -> None:
    # $$(MEM) is the literal text $(MEM) even though MEM is defined: not a quantity.
    env_ = [{"name": "MEM", "value": "1Gi"},
            {"name": "RESOURCE_LIMITS", "value": "cpu=1,memory=$$(MEM)"}]
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    (err,) = result.errors
    assert "the container sees 'cpu=1,memory=$(MEM)'" in err.message
    assert "not a quantity" in err.message
    assert result.patch == []


def test_escape_elsewhere_still_strips_the_written_value() -> None:
    env_ = [{"name": "RESOURCE_LIMITS", "value": "cpu=1,memory=1Gi,tag=$$HOME"}]
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    assert result.errors == []
    assert _values(obj, result) == ["memory=1Gi,tag=$$HOME"]


def test_value_from_as_the_last_duplicate_is_not_judged() -> None:
    env_ = [{"name": "RESOURCE_LIMITS", "value": "cpu=1,memory=x"},
            {"name": "RESOURCE_LIMITS", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]
    obj = workload("Deployment", [container(env=env_)])
    result = run(obj)
    assert result.errors == [] and result.patch == []
