"""Wrong types anywhere in a well-formed object never crash a rule: each valid object is
taken apart path by path, a value replaced by one of the wrong type (or a quantity no
parser should choke on), and every rule must still answer — a finding, never an
internal error. With ``failureMode: allow`` an internal error would admit the object."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.rules.base import Subject
from app.serve.admission import decide
from tests.conftest import RULES, container, workload
from tests.helpers.actors import pool, template
from tests.helpers.quotas import base

ENV = [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=1Gi"},
       {"name": "RESOURCE_REQUESTS", "value": "cpu=1,memory=1Gi"}]
FULL = container(requests={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                 limits={"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}, env=ENV)
INIT = container(name="setup", requests={"cpu": "500m"}, limits={"cpu": "1", "memory": "512Mi"},
                 restartPolicy="Always")


def samples() -> list[dict[str, Any]]:
    objects = [workload(kind, [copy.deepcopy(FULL)], init=[copy.deepcopy(INIT)],
                        pod_resources={"limits": {"cpu": "4", "memory": "2Gi"}})
               for kind in ("Pod", "Deployment", "CronJob")]
    return [*objects, template({"cpu": "1", "memory": "512Mi"}), pool({"cpu": "2", "memory": "1Gi"}),
            *[o for o in base() if o["kind"] in ("Project", "Department", "Queue", "NodePool")]]


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            if prefix == () and key in ("apiVersion", "kind"):
                continue
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, (*prefix, i))


def nested(depth: int) -> Any:
    value: Any = "1Gi"
    for _ in range(depth):
        value = {"a": value}
    return value


WRONG = [1, -1, 7.5, True, None, "", [], {}, ["1Gi"], {"cpu": "1"}, nested(300), "1e999999999",
         "9" * 5000, "1" + "0" * 4400, "1e-999999999", "0x1F", "1Gi ", "-1", "1.5.5", "∞", "1E", 10**400]


def replaced(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def judge(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> None:
    group, _, version = str(obj["apiVersion"]).rpartition("/")
    meta = obj["metadata"] if isinstance(obj.get("metadata"), dict) else {}
    namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else ""
    name = meta.get("name") if isinstance(meta.get("name"), str) else ""
    subject = Subject(group, version, str(obj["kind"]), operation, namespace, name, obj, old)
    view = StaticView(samples())
    result = check_object(RULES, subject, view, Policy(failureMode="allow"))
    assert result.internal_errors == [], (obj, result.internal_errors)
    decide(result, "allow")


CASES = [(i, path) for i, obj in enumerate(samples()) for path in paths(obj) if path]


@pytest.mark.parametrize(("index", "path"), CASES, ids=[".".join(map(str, p)) + f"@{i}" for i, p in CASES])
def test_every_path_with_every_wrong_type(index: int, path: tuple[Any, ...]) -> None:
    obj = samples()[index]
    for value in WRONG:
        judge(replaced(obj, path, value))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_two_wrong_values_and_an_update(data: st.DataObject) -> None:
    index, path = data.draw(st.sampled_from(CASES))
    obj = replaced(samples()[index], path, data.draw(st.sampled_from(WRONG)))
    _, path2 = data.draw(st.sampled_from([c for c in CASES if c[0] == index]))
    try:
        obj2 = replaced(obj, path2, data.draw(st.sampled_from(WRONG)))
    except (KeyError, IndexError, TypeError):
        obj2 = obj
    judge(obj2, "UPDATE", samples()[index])


def test_an_actor_with_an_unparsable_cpu_is_refused_even_when_failing_open() -> None:
    obj = template({"cpu": "lots", "memory": "1"})
    subject = Subject("ate.dev", "v1alpha1", "ActorTemplate", "CREATE", obj["metadata"]["namespace"],
                      obj["metadata"]["name"], obj)
    result = check_object(RULES, subject, StaticView([pool({"cpu": "2", "memory": "1Gi"})]),
                          Policy(failureMode="allow"))
    assert result.internal_errors == []
    assert not decide(result, "allow").allowed
