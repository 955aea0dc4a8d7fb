"""Namespace-aware rules on the real control plane: the webhook's live cache follows
ResourceQuotas, LimitRanges, Nodes and workloads through watches."""

from __future__ import annotations

from builders import SEED, container, deployment, eventually
from harness import Cluster, Webhook


def dry_run_stderr(cluster: Cluster, manifest: dict) -> str:
    return cluster.apply(manifest, "--dry-run=server", check=False).stderr


def test_quota_on_limits_cpu_keeps_cpu_limits_and_warns(cluster: Cluster, webhook: Webhook,
                                                        namespace: str) -> None:
    cluster.create_resource_quota(namespace, "compute", {"limits.cpu": "100", "limits.memory": "500Gi"})
    manifest = deployment("web", namespace, container(**SEED))
    # the cache follows the new quota within a few seconds
    eventually(lambda: "CPU limits kept" in dry_run_stderr(cluster, manifest), 10, "quota in cache")
    out = cluster.apply(manifest)
    assert 'ResourceQuota "compute" (no scope) sets limits.cpu=100' in out.stderr
    stored = cluster.kubectl_json("get", "deployment", "web", "-n", namespace)
    assert stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "7"


def create_node(cluster: Cluster, name: str, cpu: str, memory: str, labels: dict[str, str]) -> None:
    """A Ready node without the not-ready taint (see Cluster.create_node): one the
    scheduler, and so pod-fits-node, would place pods on."""
    if cluster.kubectl("get", "node", name, check=False).returncode == 0:
        return
    cluster.create_node(name, {"cpu": cpu, "memory": memory, "pods": "110"}, labels=labels)


def test_pods_that_fit_no_node_are_refused(cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    create_node(cluster, "e2e-cpu-1", "64", "256Gi", {"envelope.test/pool": "cpu"})
    create_node(cluster, "e2e-gpu-1", "32", "128Gi", {"envelope.test/pool": "gpu"})
    huge = deployment("huge", namespace, container(requests={"memory": "300Gi"},
                                                   limits={"memory": "300Gi"}))
    eventually(lambda: "needs 300Gi memory" in dry_run_stderr(cluster, huge), 10, "nodes in cache")
    out = cluster.apply(huge, check=False)
    assert out.returncode != 0
    assert ("each pod needs 300Gi memory; no node it may land on has room: the closest (a node "
            "with 64 cpu, 256Gi memory) offers 256Gi memory") in out.stderr
    assert "e2e-cpu-1" not in out.stderr and "e2e-gpu-1" not in out.stderr
    gpu = deployment("gpu", namespace, container(requests={"memory": "200Gi"}, limits={"memory": "200Gi"}))
    gpu["spec"]["template"]["spec"]["nodeSelector"] = {"envelope.test/pool": "gpu"}
    out = cluster.apply(gpu, check=False)
    assert out.returncode != 0 and "(a node with 32 cpu, 128Gi memory) offers 128Gi" in out.stderr
    gpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"memory": "100Gi"}, "limits": {"memory": "100Gi"}}
    cluster.apply(gpu)


def test_namespace_memory_composition_warns(cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    cluster.create_resource_quota(namespace, "mem", {"requests.memory": "4Gi"})
    one_gi = {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    cluster.apply(deployment("web", namespace, container(**one_gi), replicas=3))
    api = deployment("api", namespace, container(**one_gi), replicas=2)
    eventually(lambda: "total 5Gi > quota mem requests.memory 4Gi" in dry_run_stderr(cluster, api),
               10, "composition warning")
    out = cluster.apply(api)
    assert "web 3 x 1Gi = 3Gi" in out.stderr and "api 2 x 1Gi = 2Gi" in out.stderr


def test_guards_through_the_webhook_follow_the_api_server(cluster: Cluster, webhook: Webhook,
                                                          namespace: str) -> None:
    """Classes 3 and 4 with the webhook in the path (docs/fidelity.md):
    - a LimitRange max.cpu: a Pod arrives after LimitRanger, so stripping its CPU limit
      would leave none and LimitRanger's validation would refuse it -> kept; a
      Deployment's Pods get the LimitRange default (= max) back -> template stripped;
    - a quota on limits.cpu scoped to Terminating pods does not match pods without
      activeDeadlineSeconds -> stripped."""
    cluster.apply({"apiVersion": "v1", "kind": "LimitRange",
                   "metadata": {"name": "cap", "namespace": namespace},
                   "spec": {"limits": [{"type": "Container", "max": {"cpu": "4"}}]}})
    cluster.create_resource_quota(namespace, "batch", {"limits.cpu": "8"}, scopes=["Terminating"])
    limited = container(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "2", "memory": "1Gi"})
    manifest = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": namespace},
                "spec": {"containers": [limited]}}
    eventually(lambda: "CPU limits kept" in dry_run_stderr(cluster, manifest), 10, "LimitRange in cache")
    out = cluster.apply(manifest)
    assert 'LimitRange "cap" type Container max cpu 4' in out.stderr
    stored = cluster.kubectl_json("get", "pod", "p", "-n", namespace)
    assert stored["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "2"
    cluster.apply(deployment("web", namespace, limited))
    template = cluster.kubectl_json("get", "deployment", "web", "-n", namespace)["spec"]["template"]
    assert "cpu" not in template["spec"]["containers"][0]["resources"]["limits"]
