"""Nothing lost: properties of the mutation over generated containers."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.k8s.podspec import POD_SPEC_PATHS
from app.k8s.quantity import parse_quantity
from app.rules.envelope import parse_envelope_string
from tests.conftest import resources_of, run, workload
from tests.helpers.workloads import KINDS, containers, memory


def effective_cpu_request(res: dict[str, Any]) -> Any:
    req = (res.get("requests") or {}).get("cpu")
    lim = (res.get("limits") or {}).get("cpu")
    value = req if req is not None else lim
    return None if value is None else parse_quantity(value)


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(KINDS), main=containers("c"), init=containers("init"))
def test_mutation_loses_nothing(kind: str, main: list, init: list) -> None:
    obj = workload(kind, main, init=init or None)
    before = copy.deepcopy(obj)
    result = run(obj)
    assert obj == before  # the admitted object itself is never changed
    assert result.internal_errors == []
    after = jsonpatch.apply_patch(obj, result.patch)
    assert after == result.obj  # the patch is exactly the change
    for field, items in (("containers", main), ("initContainers", init)):
        for i, original in enumerate(items):
            before = original.get("resources")
            res = resources_of(after, i, field)
            if before is None:
                assert res is None
                continue
            lim_before, lim_after = before.get("limits") or {}, res.get("limits") or {}
            req_before, req_after = before.get("requests") or {}, res.get("requests") or {}
            # every non-CPU limit kept exactly as written
            for key, value in lim_before.items():
                if key != "cpu":
                    assert lim_after[key] == value
            assert "cpu" not in lim_after
            # nothing added to limits but a memory limit equal to the request
            assert set(lim_after) - set(lim_before) <= {"memory"}
            if "memory" in lim_after and "memory" not in lim_before:
                assert lim_after["memory"] == req_before["memory"]
            # requests only gain a CPU request; existing ones are untouched
            for key, value in req_before.items():
                assert req_after[key] == value
            assert set(req_after) - set(req_before) <= {"cpu"}
            # the effective CPU request is never lowered or removed
            assert effective_cpu_request(res) == effective_cpu_request(before)
            # memory request == limit whenever both exist and nothing was denied
            if not result.errors and "memory" in req_after and "memory" in lim_after:
                assert parse_quantity(req_after["memory"]) == parse_quantity(lim_after["memory"])
            # env: only the limits string changes, and only by losing cpu pairs
            for e_before, e_after in zip(original.get("env", []),
                                         after_container(after, field, i).get("env", []),
                                         strict=True):
                pairs_before = parse_envelope_string(e_before["value"]).pairs
                pairs_after = parse_envelope_string(e_after["value"]).pairs
                kept = [p for p in pairs_before if p.key.lower() != "cpu"]
                assert [p.text for p in pairs_after] in ([p.text for p in pairs_before],
                                                         [p.text for p in kept])
                assert bool(e_after["value"]) == bool(e_before["value"])
    # reinvocation: a second pass changes nothing
    assert run(after).patch == []


def after_container(obj: dict[str, Any], field: str, i: int) -> dict[str, Any]:
    group = obj["apiVersion"].rpartition("/")[0]
    node: Any = obj
    for key in POD_SPEC_PATHS[(group, obj["kind"])]:
        node = node[key]
    return node[field][i]


@settings(max_examples=200, deadline=None)
@given(req=memory, lim=memory)
def test_memory_mismatch_always_denied(req: str, lim: str) -> None:
    obj = workload("Deployment", [{"name": "c", "image": "i",
                                   "resources": {"requests": {"memory": req},
                                                 "limits": {"memory": lim}}}])
    denied = bool(run(obj).errors)
    assert denied == (parse_quantity(req) != parse_quantity(lim))
