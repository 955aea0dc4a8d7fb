"""Properties of the quota arithmetic: -1, fractions, order independence."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.crds.kai import UNLIMITED, describe, exact, exceeds, grew, shortfall, total
from app.rules.base import Subject
from tests.conftest import RULES

finite = st.decimals(min_value=0, max_value=10**9, places=3, allow_nan=False, allow_infinity=False)
amount = st.one_of(st.just(UNLIMITED), finite)
"""What a guarantee can legally be: -1 (unlimited) or a number >= 0."""


def as_json(value: Decimal) -> float:
    """How the number arrives: a JSON float (or int)."""
    return float(value) if value != value.to_integral_value() else int(value)


@given(finite)
def test_exact_recovers_what_was_written(value: Decimal) -> None:
    assert exact(as_json(value)) == value


@given(st.lists(amount, max_size=12), st.randoms())
def test_total_ignores_order(values: list[Decimal], rnd: Any) -> None:
    shuffled = values[:]
    rnd.shuffle(shuffled)
    assert total(values) == total(shuffled)


@given(st.lists(amount, max_size=12))
def test_total_is_exact_or_unlimited(values: list[Decimal]) -> None:
    if UNLIMITED in values:
        assert total(values) == UNLIMITED
    else:
        assert total(values) == sum(values, Decimal(0))


@given(st.lists(st.integers(min_value=0, max_value=1000), max_size=20))
def test_tenths_add_up_exactly(tenths: list[int]) -> None:
    """0.1 + 0.2 cards fit in 0.3 cards, however many fractions there are."""
    written = [k / 10 for k in tenths]
    cap = Decimal(sum(tenths)) / 10
    assert total(exact(w) for w in written) == cap
    assert not exceeds(total(exact(w) for w in written), exact(float(cap)))


@given(amount, amount)
def test_exceeds_respects_unlimited(demand: Decimal, cap: Decimal) -> None:
    if cap == UNLIMITED:
        assert not exceeds(demand, cap)
    elif demand == UNLIMITED:
        assert exceeds(demand, cap)
    else:
        assert exceeds(demand, cap) == (demand > cap)


@given(amount, finite)
def test_shortfall_is_the_gap(demand: Decimal, cap: Decimal) -> None:
    gap = shortfall(demand, cap)
    if not exceeds(demand, cap):
        assert gap == 0
    elif demand == UNLIMITED:
        assert gap == UNLIMITED
    else:
        assert gap > 0 and gap + cap == demand


@given(amount, amount)
def test_grew_is_antisymmetric(a: Decimal, b: Decimal) -> None:
    assert not grew(a, a)
    assert not (grew(a, b) and grew(b, a))
    if a != b and UNLIMITED not in (a, b):
        assert grew(a, b) == (b > a)


@given(st.sampled_from(["gpu", "cpu", "memory"]), amount)
def test_describe_names_the_unit(resource: str, value: Decimal) -> None:
    text = describe(resource, value)  # type: ignore[arg-type]
    if value == UNLIMITED:
        assert text == "unlimited"
    else:
        number, unit = text.split(" ")
        assert Decimal(number) == value and "E" not in number
        assert unit == {"gpu": "cards" if value != 1 else "card", "cpu": "mCPU", "memory": "MB"}[resource]


# --- the rule over a whole tenancy -----------------------------------------------------

def _tenancy(cap: Decimal, guarantees: list[Decimal]) -> list[dict[str, Any]]:
    def queue(name: str, deserved: Decimal) -> dict[str, Any]:
        return {"name": name, "nodepool": "default",
                "resources": {"gpu": {"deserved": as_json(deserved), "limit": -1}}}

    department = {"apiVersion": "kai.resources/v1alpha1", "kind": "Department",
                  "metadata": {"name": "d"}, "spec": {"queues": [queue("d-q", cap)]}}
    projects = [{"apiVersion": "kai.resources/v1alpha1", "kind": "Project",
                 "metadata": {"name": f"p{i}"},
                 "spec": {"parent": "d", "queues": [queue(f"p{i}-q", g)]}}
                for i, g in enumerate(guarantees)]
    return [department, *projects]


def _flagged(objects: list[dict[str, Any]]) -> set[str]:
    """Objects `envelope check` reports under kai-guarantee-sum."""
    view = StaticView(objects)
    out = set()
    for obj in objects:
        if obj["kind"] != "Project":
            continue
        name = obj["metadata"]["name"]
        result = check_object(RULES, Subject("kai.resources", "v1alpha1", "Project", "CREATE", "", name, obj),
                              view, Policy())
        if any(f.rule == "kai-guarantee-sum" for f in result.findings):
            out.add(name)
    return out


@given(amount, st.lists(amount, min_size=1, max_size=6), st.randoms())
def test_sum_rule_matches_the_arithmetic_in_any_order(cap: Decimal, guarantees: list[Decimal],
                                                      rnd: Any) -> None:
    objects = _tenancy(cap, guarantees)
    over = exceeds(total(guarantees), cap)
    expected = {f"p{i}" for i, g in enumerate(guarantees) if over and g != 0}
    assert _flagged(objects) == expected
    rnd.shuffle(objects)
    assert _flagged(objects) == expected


@given(finite, st.lists(finite, min_size=1, max_size=6))
def test_admitted_object_replaces_its_cached_copy(cap: Decimal, guarantees: list[Decimal]) -> None:
    """An UPDATE is judged on the new numbers only: never the old copy counted twice."""
    objects = _tenancy(cap, guarantees)
    old = objects[1]
    new = {**old, "spec": {**old["spec"], "queues": [
        {**old["spec"]["queues"][0], "resources": {"gpu": {"deserved": as_json(guarantees[0] + 1),
                                                           "limit": -1}}}]}}
    result = check_object(RULES, Subject("kai.resources", "v1alpha1", "Project", "UPDATE", "", "p0",
                                         new, old), StaticView(objects), Policy())
    denied = any(f.rule == "kai-guarantee-sum" for f in result.findings)
    assert denied == exceeds(total([guarantees[0] + 1, *guarantees[1:]]), cap)
