"""namespace-memory-composition's message (app/rules/namespace/memory.py): the sum broken
down by workload, largest first, kept short."""

from __future__ import annotations

from typing import Any

from app.cluster.view import StaticView
from tests.conftest import container, run, workload
from tests.helpers.namespace import quota


def deployment(name: str, replicas: int, memory: str, ns: str = "team-a") -> dict[str, Any]:
    obj = workload("Deployment", [container(requests={"memory": memory}, limits={"memory": memory})],
                   name=name, namespace=ns)
    obj["spec"]["replicas"] = replicas
    return obj


def test_namespace_memory_composition_breaks_the_sum_down() -> None:
    view = StaticView([quota({"requests.memory": "16Gi"}), deployment("web", 3, "2Gi"),
                       deployment("api", 1, "1Gi"), deployment("elsewhere", 9, "9Gi", "other")])
    incoming = deployment("api", 2, "6Gi")  # replaces the cached api (1 x 1Gi)
    result = run(incoming, view=view)
    [warning] = [w for w in result.warnings if w.rule == "namespace-memory-composition"]
    assert warning.message == ("api 2 x 6Gi = 12Gi, web 3 x 2Gi = 6Gi, "
                               "total 18Gi > quota compute requests.memory 16Gi")
    assert run(deployment("api", 1, "6Gi"), view=view).warnings == []


def test_composition_of_many_workloads_stays_short() -> None:
    objs: list[dict[str, Any]] = [quota({"limits.memory": "1Gi"})]
    objs += [deployment(f"service-{i}", 2, "1Gi") for i in range(30)]
    result = run(deployment("new", 1, "1Gi"), view=StaticView(objs))
    [warning] = [w for w in result.warnings if w.rule == "namespace-memory-composition"]
    assert len(warning.message) < 120 and "more" in warning.message and "total 61Gi" in warning.message
