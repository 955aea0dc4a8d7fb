"""Bad input gets a clear answer: arbitrary JSON in every supported kind never makes
a rule crash (an internal error would deny by failure mode, not by policy)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.config import Policy
from app.engine import check_object
from app.rules.base import Subject
from tests.conftest import RULES

KINDS = sorted({(group, kind) for rule in RULES.values() for group, kind in rule.kinds})
VERSIONS = {"": "v1", "apps": "v1", "batch": "v1", "kai.resources": "v1alpha1",
            "scheduling.run.ai": "v2", "ate.dev": "v1alpha1"}

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(["", "1", "-1", "1Gi", "250m", "cpu=1,memory=1Gi", "x",
                                     "gvisor", "microvm", "Always", "default"]))
keys = st.sampled_from(["spec", "template", "containers", "initContainers", "resources", "limits",
                        "requests", "cpu", "memory", "nvidia.com/gpu", "env", "name", "value",
                        "queues", "nodepool", "gpu", "deserved", "limit", "quota", "parent",
                        "parentQueue", "sandboxClass", "workerSelector", "replicas", "metadata",
                        "labels", "annotations", "jobTemplate", "nodeSelector", "overhead",
                        "labelKey", "labelValue", "namespace", "defaultNodePools", "priority"])
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=5)), max_leaves=30)


@st.composite
def objects(draw: st.DrawFn) -> tuple[str, str, dict[str, Any]]:
    group, kind = draw(st.sampled_from(KINDS))
    body = draw(st.dictionaries(keys, json_values, max_size=4))
    body.update({"apiVersion": f"{group}/{VERSIONS[group]}" if group else "v1", "kind": kind})
    if draw(st.booleans()):
        body["metadata"] = {"name": "x", "namespace": "ns"}
    return group, kind, body


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=objects(), old=st.one_of(st.none(), json_values), others=st.lists(objects(), max_size=3),
       operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
def test_no_rule_crashes_on_arbitrary_json(target: tuple[str, str, dict[str, Any]], old: Any,
                                           others: list[tuple[str, str, dict[str, Any]]],
                                           operation: str) -> None:
    group, kind, obj = target
    view = StaticView([o for _, _, o in others])
    subject = Subject(group, VERSIONS[group], kind, operation, "ns", "x",
                      None if operation == "DELETE" else obj,
                      old if isinstance(old, dict) else (obj if operation != "CREATE" else None))
    result = check_object(RULES, subject, view, Policy())
    assert result.internal_errors == []
    for finding in result.findings:
        assert finding.message and finding.severity in ("error", "warning")


review_keys = st.sampled_from(["apiVersion", "kind", "request", "uid", "group", "version", "operation",
                               "object", "oldObject", "namespace", "name", "dryRun", "metadata"])
review_values = st.recursive(
    st.one_of(scalars, st.sampled_from(["AdmissionReview", "admission.k8s.io/v1", "CREATE", "Pod"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(review_keys, inner, max_size=6)),
    max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(body=review_values)
def test_any_body_is_a_review_or_a_bad_review(body: Any) -> None:
    import orjson

    from app.admission import BadReview, decide, parse_review, review_response
    from app.engine import evaluate

    data = body if not isinstance(body, dict) else {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", **body}
    try:
        uid, subject = parse_review(orjson.dumps(data))
    except BadReview as exc:
        assert str(exc)
        return
    for phase in ("mutate", "validate"):
        evaluation = evaluate(RULES, subject, StaticView(), Policy(), phase)  # type: ignore[arg-type]
        out = orjson.loads(review_response(uid, decide(evaluation, "deny")))
        assert out["response"]["uid"] == uid
