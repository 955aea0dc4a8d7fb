"""LimitRange defaults and pod-level resources in the pod's cgroups on the real kubelet.

LimitRange: a Pod written with no
resources in a namespace with a LimitRange gets LimitRanger's defaults (a mutating
admission plugin that runs before Envelope's webhook), Envelope removes the default CPU
limit and keeps the default request, and the kubelet sizes the cgroups from what is left.
The expected values come from app/k8s/podmodel.py ``admit`` (the model of the plugins
before the webhook) applied to the Pod as written: ``cpu.shares`` of its CPU request, no
CFS quota, ``memory.limit_in_bytes`` of the default memory limit."""

from __future__ import annotations

from decimal import Decimal

import nodepods as p
import pytest
from conftest import NodeEnv

from app.k8s.podmodel import Admission, admit
from app.k8s.quantity import parse_quantity
from app.k8s.scheduling import pod_requests

pytestmark = pytest.mark.e2e


def test_limitrange_defaults_end_up_in_the_cgroups_as_podmodel_predicts(node_env: NodeEnv) -> None:
    env, node = node_env, node_env.node
    ns = env.namespace("limitrange")
    limit_range = {"apiVersion": "v1", "kind": "LimitRange",
                   "metadata": {"name": "defaults", "namespace": ns},
                   "spec": {"limits": [{"type": "Container",
                                        "default": {"cpu": "500m", "memory": "96Mi"},
                                        "defaultRequest": {"cpu": "250m", "memory": "96Mi"}}]}}
    status, body = env.cluster.api("POST", f"/api/v1/namespaces/{ns}/limitranges", limit_range)
    assert status == 201, body
    written = p.pod("d", ns, node, p.box("app", "while :; do sleep 5; done"))
    admitted, refused = admit(written["spec"], Admission(limit_ranges=[limit_range]))
    assert refused is None
    predicted = admitted["containers"][0]["resources"]
    assert predicted["limits"]["cpu"] == "500m"  # LimitRanger's default, which Envelope removes

    stored, _ = p.create(env.cluster, written)
    resources = stored["spec"]["containers"][0]["resources"]
    assert "cpu" not in resources["limits"], resources  # Envelope removed the default CPU limit
    assert resources["requests"]["cpu"] == predicted["requests"]["cpu"]
    assert resources["limits"]["memory"] == predicted["limits"]["memory"]

    running = p.wait_running(node, ns, "d")
    cpu = pod_requests(admitted)["cpu"]
    assert cpu == Decimal("0.25")
    pod_dir = node.pod_cgroup_dir(running)
    assert pod_dir.startswith("burstable/")  # a CPU request below no limit: Burstable
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.shares") == int(cpu * 1024)
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.cfs_quota_us") == -1
    assert p.read_int(node.cgroup("memory", pod_dir) / "memory.limit_in_bytes") == \
        int(parse_quantity(predicted["limits"]["memory"]))
    container = node.container_cgroup(running, "app", "cpu")
    assert p.read_int(container / "cpu.shares") == 256
    assert p.read_int(container / "cpu.cfs_quota_us") == -1


def test_pod_level_resources_end_up_in_the_pod_cgroup_as_pod_requests_counts_them(
        node_env: NodeEnv) -> None:
    """Pod-level ``spec.resources`` (PodLevelResources, beta and on by default since 1.34):
    the pod-level CPU limit Envelope removes leaves no CFS quota on the pod's cgroup, the
    pod-level request is its ``cpu.shares`` (``pod_requests`` counts it, as ``pod-fits-node``
    charges it), and the pod-level memory limit is the pod's ``memory.limit_in_bytes``."""
    env, node = node_env, node_env.node
    ns = env.namespace("podlevel")
    written = p.pod("l", ns, node, p.box("app", "while :; do sleep 5; done"),
                    resources={"requests": {"cpu": "500m", "memory": "128Mi"},
                               "limits": {"cpu": "1", "memory": "128Mi"}})
    stored, _ = p.create(env.cluster, written)
    assert "cpu" not in stored["spec"]["resources"]["limits"], stored["spec"]["resources"]
    running = p.wait_running(node, ns, "l")
    charged = pod_requests(running["spec"])
    assert charged["cpu"] == Decimal("0.5")
    pod_dir = node.pod_cgroup_dir(running)
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.shares") == int(charged["cpu"] * 1024)
    assert p.read_int(node.cgroup("cpu", pod_dir) / "cpu.cfs_quota_us") == -1
    assert p.read_int(node.cgroup("memory", pod_dir) / "memory.limit_in_bytes") == 128 * 2**20
