"""Fields newer Kubernetes minors may open up, which Envelope leaves exactly as written and
the API server decides (docs/upstream.md, "Kubernetes 1.38"): a ``swap`` limit at
container and pod level, and probe edits. The real API servers' verdicts are the oracle
row e2e/test_oracle_apiserver.py
test_swap_limits_and_probe_edits_are_the_served_minors_to_decide."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import evaluate
from tests.conftest import RULES, container, resources_of, run, subject, workload

SWAP = "1Gi"


def _with_swap(kind: str, where: str) -> dict[str, Any]:
    limits = {"cpu": "2", "memory": "1Gi"}
    pod_resources = None
    if where == "container":
        limits["swap"] = SWAP
    else:
        pod_resources = {"limits": {"memory": "2Gi", "swap": SWAP}}
    return workload(kind, [container(limits=limits, requests={"cpu": "500m", "memory": "1Gi"})],
                    pod_resources=pod_resources)


def _pod_level(obj: dict[str, Any]) -> Any:
    spec = obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]
    return spec.get("resources")


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
@pytest.mark.parametrize("where", ["container", "pod"])
def test_a_swap_limit_is_left_exactly_as_written(kind: str, where: str) -> None:
    obj = _with_swap(kind, where)
    written = copy.deepcopy(obj)
    result = run(obj)
    assert result.obj is not None
    # the CPU limit goes (the mutating rules ran); nothing names swap
    assert "cpu" not in resources_of(result.obj)["limits"]
    assert not [op for op in result.patch if "swap" in op["path"] or "swap" in str(op.get("value"))]
    if where == "container":
        assert resources_of(result.obj)["limits"]["swap"] == SWAP
        assert "swap" not in resources_of(result.obj).get("requests", {})
    else:
        assert _pod_level(result.obj) == _pod_level(written)
    assert not [f for f in result.findings if "swap" in f.message]
    assert obj == written


def test_a_probe_only_update_of_a_pod_runs_no_rule() -> None:
    # A Pod stored before Envelope, with a CPU limit Envelope would take off a new one:
    # an UPDATE that changes only a probe leaves every part Envelope judges (resources,
    # env) unchanged, so no rule runs, patches or refuses, whichever minor accepts it.
    old = workload("Pod", [container(limits={"cpu": "2", "memory": "1Gi"}, requests={"memory": "1Gi"},
                                     readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 10})])
    new = copy.deepcopy(old)
    new["spec"]["containers"][0]["readinessProbe"]["periodSeconds"] = 30
    mutated = evaluate(RULES, subject(new, "UPDATE", old), StaticView(), Policy(), "mutate")
    assert mutated.patch == [] and mutated.changes == []
    validated = evaluate(RULES, subject(new, "UPDATE", old), StaticView(), Policy(), "validate")
    assert validated.errors == []
    # the same Pod created new loses the CPU limit: the skip is the UPDATE's
    assert run(copy.deepcopy(new)).patch
