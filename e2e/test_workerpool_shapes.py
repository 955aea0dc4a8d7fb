"""Micro-VM placement against both WorkerPool shapes, each served by its own CRD:

- CRD era: upstream's generated WorkerPool CRD of agent-substrate 86e138f6
  (``spec.sandboxClass``, ``spec.ateomImage``);
- current: the CRD of the post-#1298 types (``spec.sandboxClasses: [{name,
  configRef}]``, ``spec.workerImage``); the API server prunes ``sandboxClass``.

The session cluster keeps serving e2e/crds/ate-dev.yaml for the other tests, so this
module runs a control plane and a webhook of its own per version, each serving that
version's WorkerPool CRD (e2e/crds/substrate/<version>/). ActorTemplates come from
e2e/crds/ate-dev.yaml: the ActorTemplate CRD era is the only one there is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import (
    CRD_DIR,
    REPO_ROOT,
    Cluster,
    HarnessError,
    Webhook,
    install_crds,
    register_webhook,
    start_control_plane,
    start_webhook,
    unique_name,
    unregister_webhook,
    wait_until,
)

pytestmark = pytest.mark.e2e

VERSIONS = {
    "crd-era-86e138f6": CRD_DIR / "substrate" / "crd-era-86e138f6",
    "current": CRD_DIR / "substrate" / "current",
}
IMAGE = "registry.example/ateom@sha256:" + "b" * 64


@pytest.fixture(scope="module", params=list(VERSIONS))
def shapes(request: pytest.FixtureRequest, controlplane_bin_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Cluster, Webhook]]:
    """A control plane serving one version's WorkerPool CRD (installed before the webhook
    starts: no CRD changes under a running watch), and a webhook watching it."""
    version: str = request.param
    workdir = tmp_path_factory.mktemp(f"workerpool-{version}")
    cluster = start_control_plane(workdir / "controlplane", controlplane_bin_dir)
    webhook: Webhook | None = None
    try:
        install_crds(cluster)  # ActorTemplate (and the hand-written WorkerPool, replaced next)
        install_crds(cluster, VERSIONS[version])
        webhook = start_webhook(workdir / "webhook", kubeconfig=cluster.kubeconfig,
                                extra_args=["--staleness", "5"])
        register_webhook(cluster, webhook)
        yield version, cluster, webhook
    finally:
        if webhook is not None:
            unregister_webhook(cluster)
            webhook.stop()
        cluster.stop()


def crd_era_pool(name: str, ns: str, cls: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "sandboxClass": cls, "ateomImage": IMAGE,
                     "template": {"resources": {"limits": {"cpu": "2", "memory": memory}}}}}


def current_pool(name: str, ns: str, cls: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "workerImage": IMAGE,
                     "sandboxClasses": [{"name": cls, "configRef": {"name": f"{cls}-default"}}],
                     "template": {"resources": {"limits": {"cpu": "2", "memory": memory}}}}}


def template(name: str, ns: str, memory: str, cls: str = "microvm") -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"sandboxClass": cls, "resources": {"limits": {"cpu": "1", "memory": memory}},
                     "snapshotsConfig": {"location": "gs://snapshots/agents"},
                     "containers": [{"name": "agent", "image": "registry.example/agent@sha256:" + "a" * 64}]}}


def dry_run(cluster: Cluster, obj: dict[str, Any]) -> tuple[int, str]:
    out = cluster.apply(obj, "--dry-run=server", check=False)
    return out.returncode, out.stderr


def placed_against(cluster: Cluster, webhook: Webhook, ns: str, needle: str) -> tuple[int, str]:
    """Dry-run a micro-VM template too big for the 1Gi pool until the webhook's view has
    the pool (the refusal names it); return the last answer."""
    last: tuple[int, str] = (0, "")

    def refused() -> bool:
        nonlocal last
        last = dry_run(cluster, template("probe", ns, "4Gi"))
        return needle in last[1]

    try:
        wait_until(f"the webhook to see the WorkerPools in {ns}", refused, webhook.process, timeout=30)
    except HarnessError as err:
        raise AssertionError(f"{err}\nlast answer: {last}") from None
    return last


def test_microvm_actor_is_placed_only_on_a_pool_offering_microvm(
        shapes: tuple[str, Cluster, Webhook]) -> None:
    version, cluster, webhook = shapes
    ns = unique_name(f"e2e-shape-{version}", max_length=50)
    cluster.create_namespace(ns, labels={"envelope.test/e2e": "true"})
    pool = crd_era_pool if version.startswith("crd-era") else current_pool

    # what the API server stored is the shape under test (nothing pruned into the other)
    cluster.apply(pool("vm", ns, "microvm", "1Gi"))
    cluster.apply(pool("sandbox", ns, "gvisor", "64Gi"))
    stored = json.loads(cluster.kubectl("get", "workerpool", "vm", "-n", ns, "-o", "json").stdout)["spec"]
    if version.startswith("crd-era"):
        assert stored["sandboxClass"] == "microvm" and "sandboxClasses" not in stored
    else:
        assert stored["sandboxClasses"] == [{"name": "microvm", "configRef": {"name": "microvm-default"}}]
        assert "sandboxClass" not in stored

    # a 4Gi micro-VM actor is measured against the 1Gi micro-VM pool, never the 64Gi gVisor one
    code, err = placed_against(cluster, webhook, ns, "the largest microvm WorkerPool in")
    assert code != 0 and "needs 4Gi memory" in err and "offers 1Gi" in err, err

    # one that fits the micro-VM pool is admitted; a gVisor one may use the big pool
    code, err = dry_run(cluster, template("fits", ns, "512Mi"))
    assert code == 0, err
    code, err = dry_run(cluster, template("big-gvisor", ns, "16Gi", cls="gvisor"))
    assert code == 0, err



def test_check_places_a_current_template_against_the_clusters_pools(
        shapes: tuple[str, Cluster, Webhook], tmp_path: Path) -> None:
    """`envelope check --kubeconfig`: an api.ate.dev template (no Kubernetes object) is
    placed against the WorkerPools the real API server lists, in either shape."""
    version, cluster, _webhook = shapes
    ns = unique_name(f"e2e-check-{version}", max_length=50)
    cluster.create_namespace(ns, labels={"envelope.test/e2e": "true"})
    pool = crd_era_pool if version.startswith("crd-era") else current_pool
    cluster.apply(pool("vm-2gi", ns, "microvm", "2Gi"))
    doc = {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplate",
           "metadata": {"atespace": "team-a", "name": "big"},
           "spec": {"sandboxConfig": {"sandboxClass": "SANDBOX_CLASS_MICROVM", "configName": "vm"},
                    "resources": {"limits": [{"name": "memory", "quantity": "64Gi"}]}}}
    path = tmp_path / "template.yaml"
    path.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "app", "check", "-f", str(path), "-o", "json",
                          "--kubeconfig", str(cluster.kubeconfig)],
                         capture_output=True, text=True, cwd=REPO_ROOT, timeout=60, check=False)
    assert out.returncode == 1, out.stderr
    [entry] = json.loads(out.stdout)["objects"]
    [finding] = entry["findings"]
    assert finding["rule"] == "actor-placement"
    assert finding["message"].startswith("needs 64Gi memory; the largest microvm WorkerPool in any "
                                         "namespace offers"), finding
