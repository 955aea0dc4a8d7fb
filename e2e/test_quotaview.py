"""`envelope quotas --kubeconfig` on the real API server: the tree read as `check
--kubeconfig` reads it, allocated amounts from Queue status written through the status
subresource (missing status = not reported), and files drawn as a change over the
cluster (before -> after, the rules' findings on the change)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

import harness
from builders import department, gpu_node, nodepool, project
from harness import Cluster

ROOT = Path(__file__).resolve().parent.parent


def quotas(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "app", "quotas", "-o", "json", *args],
                          capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def generated_queue(name: str, parent: str, owner: str, uid: str, gpu: float) -> dict[str, Any]:
    """The KAI Queue KRM would generate for a project queue (no KRM controller runs here):
    owned by the Project, by its uid, as KRM writes it (a made-up uid is a forged owner,
    and the Queue is judged like any other)."""
    return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
            "metadata": {"name": name, "ownerReferences": [
                {"apiVersion": "kai.resources/v1alpha1", "kind": "Project", "name": owner,
                 "uid": uid}]},
            "spec": {"parentQueue": parent, "resources": {
                "gpu": {"quota": gpu, "limit": gpu * 2, "overQuotaWeight": 1},
                "cpu": {"quota": 0, "limit": -1, "overQuotaWeight": 1},
                "memory": {"quota": 0, "limit": -1, "overQuotaWeight": 1}}}}


def pool_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["pools"] if p["name"] == name)


def test_the_tree_of_a_cluster_with_queue_status(cluster: Cluster, tmp_path: Path) -> None:
    tag = harness.unique_name("qv", max_length=12)
    pool, dept = f"{tag}-a100", f"{tag}-ml"
    nodes = [f"{tag}-gpu-1", f"{tag}-gpu-2"]
    for node in nodes:
        gpu_node(cluster, node, tag, 4)
    llm, asr = f"{tag}-llm", f"{tag}-asr"
    tenancy = [nodepool(pool, tag), department(dept, pool, 6), project(llm, dept, pool, 4),
               project(asr, dept, pool, 2)]
    try:
        for obj in tenancy:
            cluster.apply(obj)
        uid = cluster.kubectl_json("get", "projects.kai.resources", llm)["metadata"]["uid"]
        queue = generated_queue(f"{llm}-{pool}", f"{dept}-{pool}", llm, uid, 4)
        cluster.apply(queue)
        status = {"status": {"allocated": {"nvidia.com/gpu": "3", "cpu": "2500m", "memory": "4Gi"}}}
        cluster.kubectl("patch", "queues.scheduling.run.ai", queue["metadata"]["name"],
                        "--subresource=status", "--type=merge", "-p", json.dumps(status))

        report = quotas("--kubeconfig", str(cluster.kubeconfig))
        found = pool_of(report, pool)
        assert (found["nodes"], found["cards"], found["guaranteed"]["gpu"]) == (2, "8", "6")
        assert not found["overCommitted"] and found["declared"]
        (ml,) = found["departments"]
        assert (ml["name"], ml["resources"]["gpu"]["children"], ml["overCommitted"]) == (dept, "6", False)
        by_name = {c["name"]: c for c in ml["children"]}
        assert set(by_name) == {llm, asr}
        assert by_name[llm]["resources"]["gpu"]["allocated"] == "3"
        assert by_name[llm]["resources"]["cpu"]["allocated"] == "2500"
        assert by_name[llm]["resources"]["memory"]["allocated"] == "4294.967296"
        assert by_name[asr]["resources"]["gpu"]["allocated"] is None  # no Queue: not reported
        assert not report["reviewing"]

        # A change under review: asr grows by 1 card, over the department's 6.
        change = tmp_path / "change.yaml"
        change.write_text(yaml.safe_dump(project(asr, dept, pool, 3)))
        review = quotas(str(change), "--kubeconfig", str(cluster.kubeconfig))
        assert review["reviewing"]
        (ml,) = pool_of(review, pool)["departments"]
        assert ml["overCommitted"] and ml["resources"]["gpu"]["children"] == "7"
        grown = next(c for c in ml["children"] if c["name"] == asr)
        assert (grown["change"], grown["before"]["gpu"]["guarantee"],
                grown["resources"]["gpu"]["guarantee"]) == ("changed", "2", "3")
        assert "kai-guarantee-sum" in {f["rule"] for f in grown["findings"]}
        assert "projects are guaranteed 7 cards in total but the department has 6 cards" in \
            " ".join(f["message"] for f in grown["findings"])
        unchanged = next(c for c in ml["children"] if c["name"] == llm)
        assert unchanged["change"] == "" and unchanged["findings"] == []

        page = subprocess.run([sys.executable, "-m", "app", "quotas", str(change), "--kubeconfig",
                               str(cluster.kubeconfig), "-o", "html"], capture_output=True,
                              text=True, timeout=180, cwd=ROOT, check=True).stdout
        assert f'data-kind="Project" data-name="{asr}" data-over="false" data-change="changed"' in page
        assert f'data-kind="Department" data-name="{dept}" data-over="true"' in page
    finally:
        for obj in [*reversed(tenancy), generated_queue(f"{llm}-{pool}", "", llm, "", 0)]:
            cluster.kubectl("delete", f"{obj['kind'].lower()}s.{obj['apiVersion'].split('/')[0]}",
                            obj["metadata"]["name"], "--ignore-not-found", check=False)
        for node in nodes:
            cluster.delete_node(node)


def test_an_unreachable_cluster_is_a_clean_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "app", "quotas", "--kubeconfig",
                           str(tmp_path / "nope")], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 2 and "cannot use --kubeconfig" in done.stderr
    assert "Traceback" not in done.stderr
