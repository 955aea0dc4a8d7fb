"""Hypothesis strategies for workload resources and containers (the mutation's property
tests and ``envelope fix``'s)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from app.k8s.podspec import POD_SPEC_PATHS
from app.k8s.quantity import parse_quantity

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
def resources(draw: st.DrawFn, apart: bool = False) -> dict[str, Any]:
    """``apart``: memory request and limit may also differ (request below or above the
    limit, in any notation), the case ``memory-below-limit`` writes equal."""
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = dict(draw(other))
    if draw(st.booleans()):
        limits["cpu"] = draw(cpu)
    if draw(st.booleans()):
        requests["cpu"] = draw(cpu)
    mem = draw(memory)
    shapes = ["both-same", "both-notation", "request", "limit", "none"]
    shape = draw(st.sampled_from([*shapes, "below", "below", "above"] if apart else shapes))
    if shape in ("both-same", "both-notation", "request"):
        requests["memory"] = mem
    if shape in ("both-same", "limit"):
        limits["memory"] = mem
    if shape in ("below", "above"):
        requests["memory"] = mem
        factor = draw(st.integers(2, 4))
        amount = parse_quantity(mem) * factor if shape == "below" else parse_quantity(mem) / factor
        limits["memory"] = draw(st.sampled_from([f"{int(amount)}", f"{int(amount) // 1024}Ki"]
                                                if amount % 1024 == 0 else [f"{int(amount)}"]))
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
def containers(draw: st.DrawFn, prefix: str, apart: bool = False) -> list[dict[str, Any]]:
    n = draw(st.integers(0 if prefix == "init" else 1, 3))
    items = []
    for i in range(n):
        c: dict[str, Any] = {"name": f"{prefix}{i}", "image": "img"}
        if draw(st.booleans()) or prefix == "c":
            c["resources"] = draw(resources(apart))
        if draw(st.booleans()):
            c["env"] = [{"name": "RESOURCE_LIMITS", "value": draw(st.sampled_from(
                ["cpu=7,memory=29Gi", "cpu=7", "", "memory=1Gi", " cpu=2 , ephemeral-storage=1Gi",
                 "cpuset=0-3,memory=2Gi"]))}]
        if prefix == "init" and draw(st.booleans()):
            c["restartPolicy"] = "Always"
        items.append(c)
    return items
