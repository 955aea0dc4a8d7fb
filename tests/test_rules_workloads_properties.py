"""Nothing lost: properties of the mutation over generated containers."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.envelope import parse_envelope_string
from app.podspec import POD_SPEC_PATHS
from app.quantity import parse_quantity
from tests.conftest import resources_of, run, workload

KINDS = [kind for _, kind in POD_SPEC_PATHS]

whole = st.integers(min_value=1, max_value=64)
cpu = st.one_of(whole.map(str), whole.map(lambda n: f"{n * 250}m"),
                whole.map(lambda n: f"{n}e0"), st.integers(1, 9).map(lambda n: f"0.{n}"), whole)
memory = st.one_of(whole.map(lambda n: f"{n}Gi"), whole.map(lambda n: f"{n * 512}Mi"),
                   whole.map(lambda n: f"{n}G"), whole.map(lambda n: f"{n * 1000}M"),
                   whole.map(lambda n: f"{n}e9"), whole.map(lambda n: f"{n * 1048576}Ki"))
other = st.dictionaries(
    st.sampled_from(["ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi", "nvidia.com/gpu",
                     "example.com/fpga"]),
    st.one_of(whole.map(str), whole.map(lambda n: f"{n}Gi")), max_size=3)


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = dict(draw(other))
    if draw(st.booleans()):
        limits["cpu"] = draw(cpu)
    if draw(st.booleans()):
        requests["cpu"] = draw(cpu)
    mem = draw(memory)
    shape = draw(st.sampled_from(["both-same", "both-notation", "request", "limit", "none"]))
    if shape in ("both-same", "both-notation", "request"):
        requests["memory"] = mem
    if shape in ("both-same", "limit"):
        limits["memory"] = mem
    if shape == "both-notation":
        limits["memory"] = f"{int(parse_quantity(mem) / 1024)}Ki" \
            if parse_quantity(mem) % 1024 == 0 else mem
    out: dict[str, Any] = {}
    if requests or draw(st.booleans()):
        out["requests"] = requests
    if limits or draw(st.booleans()):
        out["limits"] = limits
    return out


@st.composite
def containers(draw: st.DrawFn, prefix: str) -> list[dict[str, Any]]:
    n = draw(st.integers(0 if prefix == "init" else 1, 3))
    items = []
    for i in range(n):
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "img"}
        if draw(st.booleans()) or prefix == "c":
            c["resources"] = draw(resources())
        if draw(st.booleans()):
            c["env"] = [{"name": "RESOURCE_LIMITS", "value": draw(st.sampled_from(
                ["cpu=7,memory=29Gi", "cpu=7", "", "memory=1Gi", " cpu=2 , ephemeral-storage=1Gi",
                 "cpuset=0-3,memory=2Gi"]))}]
        if prefix == "init" and draw(st.booleans()):
            c["restartPolicy"] = "Always"
        items.append(c)
    return items


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
