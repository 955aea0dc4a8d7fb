"""ExtendedResourceToleration oracle (issue 37, class 8): app/k8s/podmodel.py's model of the
plugin — on when the policy's ``admissionPlugins`` lists it, as GKE runs it — against a
kube-apiserver started with ``--enable-admission-plugins=ExtendedResourceToleration``.

Generated Pod templates: containers and init containers asking (as a request, a limit or
both) for extended resources (``nvidia.com/gpu``, ``example.com/fpga``), native ones
(``cpu``, ``hugepages-2Mi``, ``kubernetes.io/x``-style names are never extended), and
tolerations of their own (the same key with another effect, an ``Equal`` one, an exact
duplicate). Each is created as a Pod (``dryRun=All``); the stored Pod's tolerations must
be what ``pod_of(..., plugins=["ExtendedResourceToleration"])`` says, in order (after
DefaultTolerationSeconds' two, ``AddOrUpdateTolerationInPod``). The plugin is off by
default upstream, so this runs on a control plane of its own.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import EXTERNAL_KUBECONFIG, oracle_cases
from oracle import create, parallel, status_message

import harness
from app.k8s.podmodel import EXTENDED_RESOURCE_TOLERATION, pod_of
from harness import Cluster

DEFAULT_CASES = 80
NAMESPACE = "oracle-ert"
EXTENDED = ("nvidia.com/gpu", "example.com/fpga")


@pytest.fixture(scope="module")
def ert_cluster(controlplane_bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if EXTERNAL_KUBECONFIG:
        pytest.skip("needs a kube-apiserver of its own")
    cluster = harness.start_control_plane(
        tmp_path_factory.mktemp("ert") / "cp", controlplane_bin_dir,
        apiserver_args=[f"--enable-admission-plugins={EXTENDED_RESOURCE_TOLERATION}"])
    try:
        cluster.create_namespace(NAMESPACE, labels={"envelope.test/e2e": "true"})
        yield cluster
    finally:
        cluster.stop()


def _container(rng: random.Random, name: str) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    for resource in rng.sample(EXTENDED, rng.randint(0, 2)):
        how = rng.choice(("limit", "both"))  # an extended resource's request must equal its limit
        limits[resource] = "1"
        if how == "both":
            requests[resource] = "1"
    if rng.random() < 0.5:
        requests["cpu"] = "100m"
    if rng.random() < 0.2:
        requests["hugepages-2Mi"] = limits["hugepages-2Mi"] = "2Mi"
        requests.setdefault("memory", "64Mi")
        limits["memory"] = "64Mi"
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources}


def generate(index: int, seed: int) -> dict[str, Any]:
    rng = random.Random(f"ert-{seed}-{index}")
    spec: dict[str, Any] = {"containers": [_container(rng, f"c{i}") for i in range(rng.randint(1, 2))]}
    if rng.random() < 0.3:
        spec["initContainers"] = [_container(rng, "init")]
    own = []
    for _ in range(rng.choice((0, 0, 1, 2))):
        key = rng.choice((*EXTENDED, "dedicated"))
        own.append(rng.choice((
            {"key": key, "operator": "Exists", "effect": "NoSchedule"},  # what the plugin adds
            {"key": key, "operator": "Exists", "effect": "NoExecute"},
            {"key": key, "operator": "Equal", "value": "present", "effect": "NoSchedule"},
            {"key": key, "operator": "Exists"})))
    if own:
        spec["tolerations"] = own
    return {"metadata": {"name": f"w{index}"}, "spec": {"template": {"metadata": {}, "spec": spec}}}


def test_extended_resource_toleration_oracle(ert_cluster: Cluster, oracle_seed: int,
                                             request: pytest.FixtureRequest) -> None:
    cases = [generate(i, oracle_seed) for i in range(oracle_cases(request, DEFAULT_CASES))]

    def stored(workload: dict[str, Any]) -> tuple[int, Any]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": workload["spec"]["template"]["spec"]}
        return create(ert_cluster, NAMESPACE, "pods", pod, dry_run=True)

    disagreements: list[str] = []
    judged = added = 0
    for workload, (status, body) in zip(cases, parallel(stored, cases), strict=True):
        assert status == 201, status_message(body)
        judged += 1
        model = pod_of("Deployment", "apps", workload, plugins=[EXTENDED_RESOURCE_TOLERATION])
        without = pod_of("Deployment", "apps", workload)
        assert model.pod is not None and without.pod is not None
        want = model.pod["spec"]["tolerations"]
        got = body["spec"].get("tolerations") or []
        added += want != without.pod["spec"]["tolerations"]
        if got != want:
            disagreements.append(f"{workload['metadata']['name']}: API server {got}; model {want}\n"
                                 f"  spec={workload['spec']['template']['spec']}")
    print(f"ExtendedResourceToleration oracle: {judged} Pods, {added} given tolerations by the plugin, "
          f"seed {oracle_seed}, {len(disagreements)} disagreements")
    assert not disagreements, "\n".join(disagreements[:10])
    assert 0 < added < judged, "the generator must produce both outcomes"
