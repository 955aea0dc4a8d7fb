"""Builders shared by the unit tests."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import Evaluation, check_object, evaluate
from app.core.ruleset import default_ruleset
from app.k8s.podspec import POD_SPEC_PATHS
from app.rules.base import Subject
from tests.helpers.chart import REPO, bin_dir

API = {("", "Pod"): "v1", ("", "ReplicationController"): "v1"}


def kind_of(kind: str) -> tuple[str, str]:
    for group, name in POD_SPEC_PATHS:
        if name == kind:
            return group, name
    raise KeyError(kind)


def workload(kind: str, containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
             pod_resources: dict[str, Any] | None = None,
             template_annotations: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, name: str = "web",
             namespace: str = "team-a") -> dict[str, Any]:
    group, _ = kind_of(kind)
    spec: dict[str, Any] = {"containers": copy.deepcopy(containers)}
    if init is not None:
        spec["initContainers"] = copy.deepcopy(init)
    if pod_resources is not None:
        spec["resources"] = copy.deepcopy(pod_resources)
    path = POD_SPEC_PATHS[(group, kind)]
    obj: dict[str, Any] = {
        "apiVersion": f"{group}/v1" if group else "v1", "kind": kind,
        "metadata": {"name": name, "namespace": namespace},
    }
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    node = obj
    for key in path[:-1]:
        node = node.setdefault(key, {})
    if template_annotations and kind != "Pod":
        node["metadata"] = {"annotations": dict(template_annotations)}
    node[path[-1]] = spec
    if kind == "Pod" and template_annotations:
        obj["metadata"]["annotations"] = dict(template_annotations)
    return obj


def container(name: str = "app", requests: dict[str, Any] | None = None,
              limits: dict[str, Any] | None = None, env: list[dict[str, Any]] | None = None,
              **extra: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = dict(requests)
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None or limits is not None:
        c["resources"] = resources
    if env is not None:
        c["env"] = env
    c.update(extra)
    return c


RULES = default_ruleset()
"""The rule set every test judges with, as ``envelope serve`` builds it."""


def subject(obj: dict[str, Any], operation: str = "CREATE",
            old: dict[str, Any] | None = None) -> Subject:
    group, _, version = obj["apiVersion"].rpartition("/")
    meta = obj.get("metadata", {})
    return Subject(group, version, obj["kind"], operation, meta.get("namespace", ""),
                   meta.get("name", ""), obj, old)


def run(obj: dict[str, Any], policy: Policy | None = None, operation: str = "CREATE",
        old: dict[str, Any] | None = None, view: StaticView | None = None) -> Evaluation:
    return check_object(RULES, subject(obj, operation, old), view or StaticView(), policy or Policy())


def mutate(obj: dict[str, Any], policy: Policy | None = None, **kw: Any) -> Evaluation:
    return evaluate(RULES, subject(obj, **kw), StaticView(), policy or Policy(), "mutate")


def resources_of(obj: dict[str, Any], index: int = 0, field: str = "containers") -> Any:
    group, _, _ = obj["apiVersion"].rpartition("/")
    node: Any = obj
    for key in POD_SPEC_PATHS[(group, obj["kind"])]:
        node = node[key]
    return node[field][index].get("resources")


@pytest.fixture
def policy() -> Policy:
    return Policy()


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Any]:
    """A fresh etcd + kube-apiserver from e2e/harness/ for this one test (fails, never skips):
    the chart tests install into it. (e2e/conftest.py's ``cluster`` is one per session.)"""
    sys.path.insert(0, str(REPO / "e2e"))
    import harness

    try:
        running = harness.start_control_plane(tmp_path / "controlplane", bin_dir())
    except harness.HarnessError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield running
    finally:
        running.stop()
