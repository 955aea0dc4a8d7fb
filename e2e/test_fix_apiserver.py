"""``envelope fix`` judged by the real API server with Envelope in the path: the file it
writes is what the cluster stores (up to the API server's defaults), and storing the
fixed file gives the same object as storing the original."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.cli import main
from app.cluster.static import Loaded, load_text
from harness import Cluster, Webhook

MANIFEST = """\
# as a team writes it: comments, flow mappings, quoting, alignment
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: {ns}
spec:
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      initContainers:
      - name: warm
        image: registry.k8s.io/pause:3.10
        resources:
          requests: {{memory: 64Mi}}    # no limit: Envelope writes it
      containers:
      - name: app
        image: registry.k8s.io/pause:3.10
        env:
        - name: RESOURCE_LIMITS
          value: "cpu=7,memory=29Gi"
        resources:
          limits:
            cpu:    "7"     # the runtime's cap, not the pod's
            memory: 29Gi
      - name: sidecar
        image: registry.k8s.io/pause:3.10
        resources: {{limits: {{cpu: 250m, memory: 64Mi}}, requests: {{memory: 64Mi}}}}
---
{{"apiVersion": "v1", "kind": "Pod",
 "metadata": {{"name": "solo", "namespace": "{ns}"}},
 "spec": {{"containers": [{{"name": "c", "image": "registry.k8s.io/pause:3.10",
   "resources": {{"limits": {{"cpu": "1", "memory": "1Gi"}}}}}}]}}}}
"""

VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation")


def _stored(cluster: Cluster, path: Path) -> list[dict[str, Any]]:
    """What the API server would store for each object of the file (server-side apply,
    dry run: the webhooks run, nothing is persisted)."""
    out = cluster.kubectl("apply", "--server-side", "--dry-run=server", "-o", "json",
                          "-f", str(path))
    doc = json.loads(out.stdout)
    items = doc["items"] if doc.get("kind") == "List" else [doc]
    for item in items:
        for key in VOLATILE:
            item["metadata"].pop(key, None)
    return items


def _objects(path: Path) -> list[dict[str, Any]]:
    loaded = Loaded()
    load_text(path.read_text(), str(path), loaded)
    assert not loaded.errors
    return [m.obj for m in loaded.manifests]


def _within(part: Any, whole: Any, where: str = "") -> list[str]:
    """Where ``part`` is not contained in ``whole`` (mappings: every key of ``part`` with
    a contained value; lists: the same length, item by item)."""
    if isinstance(part, dict):
        if not isinstance(whole, dict):
            return [where]
        return [p for k, v in part.items() for p in
                (_within(v, whole[k], f"{where}.{k}") if k in whole else [f"{where}.{k} missing"])]
    if isinstance(part, list):
        if not isinstance(whole, list) or len(part) != len(whole):
            return [where]
        return [p for i, (a, b) in enumerate(zip(part, whole, strict=True))
                for p in _within(a, b, f"{where}[{i}]")]
    return [] if part == whole else [f"{where}: {part!r} != {whole!r}"]


def test_the_fixed_file_is_what_the_cluster_stores(cluster: Cluster, webhook: Webhook,
                                                   namespace: str, tmp_path: Path) -> None:
    original = tmp_path / "original.yaml"
    original.write_text(MANIFEST.format(ns=namespace))
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text(original.read_text())
    assert main(["fix", str(fixed)]) == 0
    assert fixed.read_text() != original.read_text()

    from_original = _stored(cluster, original)
    from_fixed = _stored(cluster, fixed)
    # the cluster stores the same objects from either file ...
    assert from_fixed == from_original
    # ... and the fixed file says exactly that, up to the fields the API server defaults
    for written, stored in zip(_objects(fixed), from_fixed, strict=True):
        assert _within(written, stored) == [], (written["kind"], _within(written, stored))
    # while the original does not: its CPU limits and missing memory limit differ
    assert _within(_objects(original)[0], from_original[0])
    deployment = from_fixed[0]["spec"]["template"]["spec"]
    assert "cpu" not in deployment["containers"][0]["resources"]["limits"]
    assert deployment["containers"][0]["env"][0]["value"] == "memory=29Gi"
    assert deployment["initContainers"][0]["resources"]["limits"] == {"memory": "64Mi"}
    # and envelope check finds nothing left to change in it
    assert main(["check", "--fail-on", "change", str(fixed)]) == 0
