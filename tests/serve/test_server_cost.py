"""Cost that grows faster than the input (issue 25, class 1): reviews a tenant may
legally write must cost time linear in what they wrote, through the real HTTP handler.

Timed bounds here are the generous ones the issue asks for: each states the figure
measured on the old code and the figure now, on the shared 2-core machine."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from typing import Any

import httpx
import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.serve.server import create_app
from tests.conftest import RULES
from tests.helpers.actors import ROOMY, pool, template
from tests.helpers.quotas import entry, project, queue

DIGITS = 300_000
LONG = "1" * DIGITS


def _post(obj: dict[str, Any], endpoint: str, view: StaticView, namespace: str | None = "team-a",
          operation: str = "CREATE", old: dict[str, Any] | None = None) -> tuple[float, dict[str, Any]]:
    """One AdmissionReview through create_app's handler; (seconds, response)."""
    app = create_app(RULES, Policy(), view)
    group, _, version = obj["apiVersion"].rpartition("/")
    kind = {"group": group, "version": version, "kind": obj["kind"]}
    request: dict[str, Any] = {"uid": "u-cost", "kind": kind, "operation": operation,
                               "name": obj["metadata"]["name"], "object": obj}
    if namespace:
        request["namespace"] = namespace
    if old is not None:
        request["oldObject"] = old
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": request}).encode()

    async def post() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=600) as client:
            return await client.post(endpoint, content=body, headers={"content-type": "application/json"})

    start = time.perf_counter()
    response = asyncio.run(post())
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, response.text[:300]
    answer = response.json()["response"]
    assert answer["uid"] == "u-cost"
    return elapsed, answer


QUANTITY_CASES = [
    # (what, object, old object or None)
    ("ActorTemplate memory", template({"cpu": "1", "memory": LONG}), None),
    ("ActorTemplate cpu in millicores", template({"cpu": LONG + "m", "memory": "1Gi"}), None),
    ("ActorTemplate memory Gi", template({"cpu": "2", "memory": LONG + "Gi"}), None),
    ("ActorTemplate negative cpu", template({"cpu": "-" + LONG, "memory": "1Gi"}), None),
    ("ActorTemplate tiny cpu", template({"cpu": "0." + "0" * DIGITS + "1", "memory": "1Gi"}), None),
    ("ActorTemplate UPDATE", template({"cpu": "1", "memory": LONG + "Mi"}),
     template({"cpu": "1", "memory": "1Gi"})),
    ("WorkerPool limits", pool({"cpu": LONG, "memory": LONG + "Ki"}), None),
    ("WorkerPool UPDATE", pool({"cpu": LONG, "memory": "16Gi"}, requests={"cpu": LONG + "m"}),
     pool({"cpu": "8", "memory": "16Gi"})),
]


@pytest.mark.parametrize(("what", "obj", "old"), QUANTITY_CASES, ids=[c[0] for c in QUANTITY_CASES])
@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_a_300000_digit_crd_quantity_is_answered_quickly(what: str, obj: dict[str, Any],
                                                          old: dict[str, Any] | None,
                                                          endpoint: str) -> None:
    # Before: 47-100 s for one ActorTemplate review (mutate + validate, measured on
    # this 2-core machine; the event loop is blocked all that time). Now: 10-30 ms.
    # The bound, 2 s, is 60 times the figure now and 20 times below the old one.
    view = StaticView([ROOMY, pool({"cpu": LONG, "memory": "16Gi"}, name="big")])
    elapsed, answer = _post(obj, endpoint, view, operation="UPDATE" if old else "CREATE", old=old)
    assert elapsed < 2.0, f"{what} {endpoint}: {elapsed:.1f} s"
    message = (answer.get("status") or {}).get("message", "")
    assert len(message) < 2_000, "a long value is named by its start and length, not copied"


def test_kai_quota_objects_with_a_300000_digit_value_are_answered_quickly() -> None:
    # KAI quotas are JSON numbers: a long digit string is a schema error, named, fast.
    view = StaticView([])
    bad = entry("q", gpu=(LONG, -1))  # type: ignore[arg-type]
    for obj, namespace in ((project("p", "", bad), None),
                           (queue("batch", gpu=(LONG, -1)), None)):  # type: ignore[arg-type]
        for endpoint in ("/mutate", "/validate"):
            elapsed, answer = _post(obj, endpoint, view, namespace=namespace)
            assert elapsed < 2.0, f"{obj['kind']} {endpoint}: {elapsed:.1f} s"
            assert len((answer.get("status") or {}).get("message", "")) < 2_000


# --- LimitRange orderings -------------------------------------------------------------
#
# LimitRanger applies LimitRanges in its informer's (undefined) order; the first default
# written for a resource wins. Envelope used to enumerate every permutation of the
# LimitRanges that set container defaults (and kept the first 24): 10 such LimitRanges
# took 30 s and 570 MiB RSS for one Deployment review (chart limit 384 Mi). Now one
# order per possible outcome. The reference below is that enumeration, uncapped.

def _all_permutations_needs(spec: dict[str, Any], lrs: list[dict[str, Any]],
                            quotas: list[dict[str, Any]]) -> list[Any]:
    from app.k8s.defaulting import defaulted_limit_range_item, limit_range_items
    from app.k8s.namespace_policy import cpu_limit_needs_in_order

    def sets_defaults(lr: dict[str, Any]) -> bool:
        return any(i.get("type") == "Container" and any(defaulted_limit_range_item(i).values())
                   for i in limit_range_items(lr))

    with_defaults = [lr for lr in lrs if sets_defaults(lr)]
    others = [lr for lr in lrs if not sets_defaults(lr)]
    orders = [list(p) + others for p in itertools.permutations(with_defaults)] \
        if len(with_defaults) >= 2 else [lrs]
    merged: list[Any] = []
    for order in orders:
        for need in cpu_limit_needs_in_order(spec, order, quotas):
            if need not in merged:
                merged.append(need)
    return merged


CPU = ["100m", "250m", "500m", "1", "2", "4", "0"]
MEM = ["0", "64Mi", "1Gi"]


def _random_case(rng: random.Random, n_lrs: int) -> tuple[dict[str, Any], list[dict[str, Any]],
                                                            list[dict[str, Any]]]:
    def some(values: list[str], names: tuple[str, ...] = ("cpu", "memory")) -> dict[str, str]:
        return {name: rng.choice(values if name == "cpu" else MEM) for name in names
                if rng.random() < 0.5}

    lrs = []
    for i in range(n_lrs):
        items = []
        for _ in range(rng.randint(1, 2)):
            item: dict[str, Any] = {"type": rng.choice(["Container", "Container", "Container", "Pod"])}
            for key in ("default", "defaultRequest", "max", "min", "maxLimitRequestRatio"):
                if rng.random() < (0.6 if key == "default" else 0.25):
                    values = some(CPU if key != "maxLimitRequestRatio" else ["1", "2", "4"])
                    if values:
                        item[key] = values
            items.append(item)
        lrs.append({"apiVersion": "v1", "kind": "LimitRange",
                    "metadata": {"name": f"lr{i}", "namespace": "team-a"}, "spec": {"limits": items}})
    quotas = []
    for i in range(rng.randint(0, 2)):
        scopes = rng.choice([[], ["BestEffort"], ["NotBestEffort"], ["NotTerminating"]])
        hard = {"limits.cpu": rng.choice(["1", "3", "10"])} if rng.random() < 0.8 else {"pods": "9"}
        quotas.append({"apiVersion": "v1", "kind": "ResourceQuota",
                       "metadata": {"name": f"q{i}", "namespace": "team-a"},
                       "spec": {"hard": hard, **({"scopes": scopes} if scopes else {})},
                       "status": {"hard": hard, "used": {"limits.cpu": rng.choice(["0", "1"])}}})
    containers = [{"name": f"c{j}", "image": "x",
                   "resources": {"requests": some(CPU), "limits": some(CPU, ("memory",))}}
                  for j in range(rng.randint(1, 3))]
    spec: dict[str, Any] = {"containers": containers}
    if rng.random() < 0.3:
        spec["initContainers"] = [{"name": "init", "image": "x",
                                   "resources": {"requests": some(CPU)}}]
    return spec, lrs, quotas


@pytest.mark.parametrize("n_lrs", [2, 3, 4, 5])
def test_limit_range_orders_give_what_every_permutation_gives(n_lrs: int) -> None:
    from app.k8s.namespace_policy import cpu_limit_needs

    rng = random.Random(2500 + n_lrs)
    differing = []
    for case in range(400 if n_lrs < 5 else 150):
        spec, lrs, quotas = _random_case(rng, n_lrs)
        want = _all_permutations_needs(spec, lrs, quotas)
        got = cpu_limit_needs(spec, lrs, quotas)
        if got != want:  # the same needs, in the same order
            differing.append((case, [str(n) for n in want], [str(n) for n in got]))
    assert not differing, differing[:3]


def _ten_defaults_view(n: int) -> StaticView:
    lrs = [{"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": f"lr{i}", "namespace": "team-a"},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": f"{i + 1}", "memory": f"{i + 1}Gi"},
                                 "max": {"cpu": "64"}}]}} for i in range(n)]
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": {"name": "compute", "namespace": "team-a"}, "spec": {"hard": {"limits.cpu": "100"}}}
    return StaticView([*lrs, quota])


@pytest.mark.parametrize("n", [10, 16, 200])
def test_ten_limit_ranges_with_defaults_are_judged_quickly(n: int) -> None:
    from tests.conftest import container, workload

    # Before: 30 s and 570 MiB RSS with 10 (16 never ends). Now: 10-40 ms for 10 and
    # 16 (each judged), 200 (beyond the bound: one order, CPU limits kept). Bound: 2 s.
    obj = workload("Deployment", [container(limits={"cpu": "2", "memory": "1Gi"},
                                            requests={"cpu": "500m", "memory": "1Gi"})])
    elapsed, answer = _post(obj, "/mutate", _ten_defaults_view(n))
    assert elapsed < 2.0, f"{n} LimitRanges: {elapsed:.1f} s"
    assert answer["allowed"] is True


def test_beyond_the_bound_on_orders_cpu_limits_are_kept_and_the_message_says_why() -> None:
    from app.k8s.namespace_policy import MAX_LIMIT_RANGE_ORDERS, cpu_limit_needs, limit_range_orders

    def lr(name: str, item: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": name}, "spec": {"limits": [{"type": "Container", **item}]}}

    # 4 x 5 x 4 possible winners (CPU limit, CPU request, memory: BestEffort decides).
    lrs = [lr(f"d{i}", {"default": {"cpu": f"{i + 1}"}}) for i in range(4)] + \
          [lr(f"r{i}", {"defaultRequest": {"cpu": f"{i + 1}00m"}}) for i in range(4)] + \
          [lr(f"m{i}", {"default": {"memory": f"{i}Gi"}}) for i in range(4)]
    quota = {"metadata": {"name": "q"}, "spec": {"hard": {"limits.cpu": "100"}, "scopes": ["NotBestEffort"]}}
    spec = {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "50m"}}}]}
    orders, complete = limit_range_orders(lrs, [quota])
    assert len(orders) == MAX_LIMIT_RANGE_ORDERS and not complete
    needs = [str(n) for n in cpu_limit_needs(spec, lrs, [quota])]
    assert f"more than {MAX_LIMIT_RANGE_ORDERS} ways" in needs[-1]
    assert any(n.startswith('ResourceQuota "q" sets limits.cpu=100') for n in needs)
    # Without the BestEffort scope memory decides nothing: 4 x 5 orders, all judged.
    orders, complete = limit_range_orders(lrs, [])
    assert len(orders) == 20 and complete
    assert not any("ways" in str(n) for n in cpu_limit_needs(spec, lrs, []))


# --- containers with a quota and a LimitRange ----------------------------------------

def _many_containers(n: int) -> dict[str, Any]:
    from tests.conftest import container, workload

    return workload("Deployment", [container(name=f"c{i}", limits={"cpu": "2", "memory": "1Gi"},
                                             requests={"cpu": "500m", "memory": "1Gi"}) for i in range(n)],
                    init=[container(name=f"i{i}", requests={"cpu": "1"}) for i in range(n // 4)])


def _quota_and_limit_range() -> StaticView:
    return StaticView([
        {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "defaults", "namespace": "team-a"},
         "spec": {"limits": [{"type": "Container", "default": {"cpu": "100m"}, "max": {"cpu": "64"}}]}},
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": "team-a"},
         "spec": {"hard": {"limits.cpu": "100", "requests.cpu": "50"}}}])


def test_needs_are_merged_in_linear_time_in_the_containers(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each container below its default CPU limit is one need; merging them was a
    # membership test on a list (n^2/2 comparisons: 2.1 million for 2,000 containers).
    from app.k8s.namespace_policy import CpuLimitNeed, cpu_limit_needs
    from app.rules.namespace.cpu_limits import _without_cpu_limits

    calls = 0
    plain_eq = CpuLimitNeed.__eq__

    def counting_eq(self: CpuLimitNeed, other: object) -> bool:
        nonlocal calls
        calls += 1
        return plain_eq(self, other)

    monkeypatch.setattr(CpuLimitNeed, "__eq__", counting_eq)
    view = _quota_and_limit_range()
    spec = _without_cpu_limits(_many_containers(2000)["spec"]["template"]["spec"])
    needs = cpu_limit_needs(spec, view.list("LimitRange", "team-a"), view.list("ResourceQuota", "team-a"))
    assert len(needs) > 2000
    assert calls < 10 * len(needs)


def test_three_thousand_containers_with_a_quota_and_a_limit_range_are_judged_quickly() -> None:
    # Before: 10.8 s for 3,200 containers (+800 init) on this machine under load; now
    # about 1 s. The bound, 5 s, is twice below the old figure and 5 times the new.
    elapsed, _ = _post(_many_containers(3000), "/mutate", _quota_and_limit_range())
    assert elapsed < 5.0, f"{elapsed:.1f} s"


# --- KAI queue names: the subject's own names, once per review -------------------------

def test_a_department_with_thousands_of_queue_entries_is_judged_in_linear_time() -> None:
    # kai-queue-name-unique looked each entry's name up in the view and then computed
    # all of the subject's own names again (quadratic in the entries): 36 s for a
    # 2,000-entry Department with every rule, 7 s for this rule alone. Now ~20 ms
    # for the rule. The bound, 2 s, is 3.5 times below the old figure for the rule.
    from app.core.engine import evaluate
    from app.core.ruleset import RuleSet
    from app.rules.base import Subject
    from tests.helpers.quotas import department, nodepool

    rule = RULES["kai-queue-name-unique"]
    one = RuleSet([rule], RULES.copiers, RULES.indexes, RULES.updates)
    obj = department("big", *(entry(f"e{i}", pool="rtx") for i in range(2000)))
    view = StaticView([nodepool("rtx")], RULES.indexes)
    subject = Subject("kai.resources", "v1alpha1", "Department", "CREATE", "", "big", obj, None)
    start = time.perf_counter()
    result = evaluate(one, subject, view, Policy(), "validate")
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0, f"{elapsed:.1f} s"
    assert result.results == {"kai-queue-name-unique": "pass"}
