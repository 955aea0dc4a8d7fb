"""Cost that grows faster than the input (issue 25, class 1): reviews a tenant may
legally write must cost time linear in what they wrote, through the real HTTP handler.

Timed bounds here are the generous ones the issue asks for: each states the figure
measured on the old code and the figure now, on the shared 2-core machine."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from app.cluster.view import StaticView
from app.config import Policy
from app.server import create_app
from tests.conftest import RULES
from tests.test_actors import ROOMY, pool, template
from tests.test_quotas import KAI, KRM, entry, project, queue

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
    assert KAI and KRM
