"""app/crds/actortypes.py ``decode``: one ActorTemplate review decodes each object once and
places the actor once (issue 21 item 4), and the memo never answers for an object
that changed."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import ValidationError

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.crds import actortypes
from app.crds.actortypes import ActorTemplate, WorkerPool, decode
from app.rules import actors as actor_rules
from app.rules.base import Subject
from tests.conftest import RULES

NS = "team-a"


def template(limits: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"name": "agent", "namespace": NS},
            "spec": {"sandboxClass": "microvm", "resources": {"limits": dict(limits)}}}


def pool(limits: dict[str, Any], name: str = "workers") -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"sandboxClass": "microvm", "template": {"resources": {"limits": dict(limits)}}}}


def _fresh(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with a label no other test wrote: not in the memo yet."""
    obj["metadata"].setdefault("labels", {})["test-run"] = uuid.uuid4().hex
    return obj


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts: dict[str, int] = {"ActorTemplate": 0, "WorkerPool": 0, "place_actor": 0}
    validate, place = actortypes._validate, vars(actor_rules)["place_actor"]

    def counting_validate(model: Any, obj: object) -> Any:
        counts[model.__name__] += 1
        return validate(model, obj)

    def counting_place(*args: Any) -> Any:
        counts["place_actor"] += 1
        return place(*args)

    monkeypatch.setattr(actortypes, "_validate", counting_validate)
    monkeypatch.setattr(actor_rules, "place_actor", counting_place)
    return counts


def _review(obj: dict[str, Any], cluster: list[dict[str, Any]]) -> Any:
    meta = obj["metadata"]
    subject = Subject("ate.dev", "v1alpha1", "ActorTemplate", "CREATE", meta["namespace"], meta["name"], obj)
    return check_object(RULES, subject, StaticView(cluster, RULES.indexes), Policy.model_validate({}))


def test_one_create_decodes_each_object_once_and_places_once(counted: dict[str, int]) -> None:
    pools = [_fresh(pool({"cpu": "4", "memory": "8Gi"}, name="small")),
             _fresh(pool({"cpu": "8", "memory": "16Gi"}, name="big"))]
    obj = _fresh(template({"cpu": "8", "memory": "16Gi"}))
    result = _review(obj, pools)
    # Six rules judge a CREATE; three of them place it (placement and the two micro-VM
    # warnings: it takes all of the big pool's CPU and memory), each reading both pools.
    judged = {r: v for r, v in result.results.items() if r.startswith("actor-")}
    assert judged == {"actor-no-requests": "pass", "actor-limits": "pass",
                      "actor-microvm-memory-floor": "pass",
                      "actor-placement": "pass", "actor-microvm-cpu-share": "warn",
                      "actor-microvm-memory-headroom": "warn"}
    assert counted == {"ActorTemplate": 1, "WorkerPool": 2, "place_actor": 1}
    # The same review again: nothing is decoded, the placement is remembered.
    again = _review(obj, pools)
    assert [f.message for f in again.findings] == [f.message for f in result.findings]
    assert counted == {"ActorTemplate": 1, "WorkerPool": 2, "place_actor": 1}


def test_a_pool_that_changed_is_placed_again(counted: dict[str, int]) -> None:
    small = _fresh(pool({"cpu": "4", "memory": "8Gi"}, name="small"))
    obj = _fresh(template({"cpu": "2", "memory": "4Gi"}))
    assert _review(obj, [small]).results["actor-placement"] == "pass"
    small["spec"]["template"]["resources"]["limits"]["memory"] = "2Gi"  # changed in place
    refused = _review(obj, [small])
    assert refused.results["actor-placement"] == "fail"
    assert counted == {"ActorTemplate": 1, "WorkerPool": 2, "place_actor": 2}


def test_an_object_changed_in_place_is_decoded_again() -> None:
    obj = _fresh(template({"cpu": "1", "memory": "1Gi"}))
    first = decode(ActorTemplate, obj)
    assert isinstance(first, ActorTemplate) and first.limits == {"cpu": "1", "memory": "1Gi"}
    assert decode(ActorTemplate, obj) is first
    obj["spec"]["resources"]["limits"]["memory"] = "2Gi"
    second = decode(ActorTemplate, obj)
    assert isinstance(second, ActorTemplate) and second.limits == {"cpu": "1", "memory": "2Gi"}
    # The model shares nothing with the object it was decoded from.
    obj["spec"]["resources"]["limits"]["cpu"] = "9"
    assert second.limits["cpu"] == "1"


def test_shape_errors_are_remembered_and_objects_orjson_cannot_write_still_decode() -> None:
    bad = _fresh(pool({"cpu": "1"}))
    bad["spec"]["template"] = "not an object"
    first, second = decode(WorkerPool, bad), decode(WorkerPool, bad)
    assert isinstance(first, ValidationError) and second is first
    assert first.errors()[0]["loc"] == ("spec", "template")
    yaml_keys = _fresh(template({"cpu": "1"}))
    yaml_keys["spec"]["extra"] = {1: "a key YAML reads as an integer"}
    decoded = decode(ActorTemplate, yaml_keys)
    assert isinstance(decoded, ActorTemplate) and decoded.limits == {"cpu": "1"}
    assert decode(ActorTemplate, yaml_keys) is not decoded  # not remembered: decoded each time
