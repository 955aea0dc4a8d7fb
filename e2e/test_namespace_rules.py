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


def test_namespace_memory_composition_counts_as_the_quota_does(cluster: Cluster, webhook: Webhook,
                                                              namespace: str) -> None:
    """Issue 28, class 5, through the live view: a ReplicaSet owned by a Deployment that
    exists is its pods, not more; a Job runs min(parallelism, completions) pods; a quota
    scoped Terminating counts only pods with activeDeadlineSeconds."""
    cluster.create_resource_quota(namespace, "mem", {"requests.memory": "4Gi"})
    cluster.create_resource_quota(namespace, "batch", {"requests.memory": "2Gi"}, scopes=["Terminating"])
    one_gi = {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    cluster.apply(deployment("web", namespace, container(**one_gi), replicas=2))
    web = cluster.kubectl_json("get", "deployment", "web", "-n", namespace)
    child = deployment("web-1", namespace, container(**one_gi), replicas=2)
    child["kind"] = "ReplicaSet"
    child["spec"]["selector"] = web["spec"]["selector"]
    child["spec"]["template"]["metadata"]["labels"] = web["spec"]["template"]["metadata"]["labels"]
    child["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                                             "uid": web["metadata"]["uid"], "controller": True}]
    cluster.apply(child)

    def job(name: str, parallelism: int, completions: int, deadline: int | None = None) -> dict:
        spec = {"restartPolicy": "Never", "containers": [container(**one_gi)]}
        if deadline is not None:
            spec["activeDeadlineSeconds"] = deadline
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
                "spec": {"parallelism": parallelism, "completions": completions, "suspend": True,
                         "template": {"spec": spec}}}

    train = job("train", 5, 1)
    train["spec"]["suspend"] = False
    cluster.apply(train)
    api = deployment("api", namespace, container(**one_gi), replicas=2)
    # web 2 + train min(5, 1) = 1 + api 2: the ReplicaSet is web's pods, not 2 more
    eventually(lambda: "total 5Gi > quota mem requests.memory 4Gi" in dry_run_stderr(cluster, api),
               10, "the Job in the cache")
    assert "web-1" not in dry_run_stderr(cluster, api)
    assert dry_run_stderr(cluster, deployment("api", namespace, container(**one_gi))) == ""  # 4Gi fits
    # Terminating: only pods with a deadline are counted; a suspended Job runs none
    timed = job("report", 3, 3, deadline=600)
    assert dry_run_stderr(cluster, timed) == ""
    timed["spec"]["suspend"] = False
    out = dry_run_stderr(cluster, timed)
    assert "report 3 x 1Gi = 3Gi, total 3Gi > quota batch requests.memory 2Gi" in out, out
    assert "quota mem" in out  # and the namespace's unscoped quota: 2 + 1 + 3 = 6Gi


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


def test_what_a_queue_or_another_controller_places_is_not_refused(cluster: Cluster, webhook: Webhook,
                                                                   namespace: str) -> None:
    """Issue 37, classes 3 and 7, on the real API server: a suspended Job that fits no Node
    is admitted with pod-fits-node's numbers as a warning (Kueue places it on admission); a
    Job managed by another controller (MultiKueue) makes no Pod here and is not judged; a
    gated Pod's UPDATE that adds a node selector no Node has — which the API server allows
    while the Pod is gated — is admitted with a warning."""
    create_node(cluster, "e2e-cpu-1", "64", "256Gi", {"envelope.test/pool": "cpu"})
    big = {"requests": {"cpu": "1", "memory": "300Gi"}, "limits": {"memory": "300Gi"}}

    def job(name: str, **spec: object) -> dict:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": namespace},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container(**big)]}},
                         **spec}}

    running = job("now")
    eventually(lambda: "needs 300Gi memory" in dry_run_stderr(cluster, running), 10, "nodes in cache")
    assert cluster.apply(running, "--dry-run=server", check=False).returncode != 0
    out = cluster.apply(job("queued", suspend=True))
    assert "[pod-fits-node]: suspended Job, not refused: each pod needs 300Gi" in out.stderr, out.stderr
    out = cluster.apply(job("remote", managedBy="kueue.x-k8s.io/multikueue"))
    assert "pod-fits-node" not in out.stderr, out.stderr
    small = container(requests={"cpu": "1", "memory": "1Gi"}, limits={"memory": "1Gi"})
    gated = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gated", "namespace": namespace},
             "spec": {"schedulingGates": [{"name": "example.com/queue"}], "containers": [small]}}
    cluster.apply(gated)
    out = cluster.kubectl("patch", "pod", "gated", "-n", namespace, "--type=merge", "-p",
                          '{"spec": {"nodeSelector": {"envelope.test/pool": "none-such"}}}')
    assert "[pod-fits-node]: gated Pod (example.com/queue), not refused: no node" in out.stderr, out.stderr
    stored = cluster.kubectl_json("get", "pod", "gated", "-n", namespace)
    assert stored["spec"]["nodeSelector"] == {"envelope.test/pool": "none-such"}


def test_the_default_priority_class_reaches_the_quota_guard_through_the_live_view(
        cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    """Issue 37, class 1: the webhook watches PriorityClasses; a Deployment whose Pods name
    no class gets the global default, so a limits.cpu quota scoped to that class keeps
    their CPU limits (the stored template's Pods would be refused without them)."""
    from oracle import global_default_priority_class

    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "std", "namespace": namespace},
             "spec": {"hard": {"limits.cpu": "100"}, "scopeSelector": {"matchExpressions": [
                 {"scopeName": "PriorityClass", "operator": "In", "values": ["e2e-default"]}]}}}
    cluster.apply(quota)
    manifest = deployment("web", namespace, container(**SEED))
    assert "CPU limits kept" not in dry_run_stderr(cluster, manifest)  # no default class yet
    with global_default_priority_class(cluster, "e2e-default"):
        eventually(lambda: "CPU limits kept" in dry_run_stderr(cluster, manifest), 10, "class in cache")
        out = cluster.apply(manifest)
        assert "PriorityClass In (e2e-default)" in out.stderr, out.stderr
        stored = cluster.kubectl_json("get", "deployment", "web", "-n", namespace)
        assert "cpu" in stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
