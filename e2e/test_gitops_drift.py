"""Drift with Envelope in the path, measured with the real clients on the real API
server (issue #26 item 4): ``kubectl diff`` (client-side and ``--server-side``) and Argo
CD's own diff code — the gitops-engine ``pkg/diff`` package at the version Argo CD
v3.2.12 builds with (e2e/gitopsdiff, e2e/controlplane/build-gitopsdiff.sh) — in its
legacy (three-way), structured-merge and server-side modes, with and without
IncludeMutationWebhook, and each again with the ``ignoreDifferences`` that
``envelope gitops-config --argocd`` prints run through Argo CD's own normalizer
(argo-cd/v3 ``util/argo/normalizers`` at v3.2.12), after an Argo CD-style sync
(gitops-engine's own kubectl apply path, field manager ``argocd-controller``).

Two manifests: one Envelope leaves alone (no CPU limit, memory request == limit) and
one it mutates (``limits.cpu`` set: removed, the request set to it). What each client
shows is asserted here and stated in docs/gitops.md (``envelope gitops-config``), so a
change of Envelope, Kubernetes or Argo CD that changes the answer fails this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import GITOPSDIFF_MODES as MODES
from harness import Cluster, Webhook

REPO = Path(__file__).resolve().parent.parent


def deployment(name: str, namespace: str, resources: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                         {"name": "app", "image": "registry.example/app:1",
                          "resources": resources}]}}}}


FIXED = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
UNFIXED = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}


def write(tmp: Path, obj: dict[str, Any]) -> Path:
    path = tmp / f"{obj['metadata']['name']}.json"
    path.write_text(json.dumps(obj))
    return path


def run(tool: Path, cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool), *args, "--kubeconfig", str(cluster.kubeconfig)],
                          capture_output=True, text=True, timeout=120)


def sync(tool: Path, cluster: Cluster, manifest: Path, server_side: bool) -> None:
    """What an Argo CD sync does: gitops-engine's ApplyResource (kubectl apply, client-side
    by default, server-side with ServerSideApply=true), manager argocd-controller."""
    done = run(tool, cluster, "apply", "--manifest", str(manifest),
               *(["--server-side"] if server_side else []))
    assert done.returncode == 0, done.stderr


def argo_diff(tool: Path, cluster: Cluster, manifest: Path, ignore: Path) -> dict[str, Any]:
    done = run(tool, cluster, "diff", "--manifest", str(manifest), "--ignore", str(ignore))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ (dicts by key, lists by position)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b))
                for p in differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True))
                for p in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [path]


def shown(result: dict[str, Any]) -> dict[str, Any]:
    """Per mode: OutOfSync or not, and the paths Argo CD's diff shows."""
    out = {}
    for mode in (*MODES, *(f"{m}+ignore" for m in MODES)):
        r = result["modes"][mode]
        out[mode] = r.get("error") or {
            "modified": r["modified"],
            "paths": differences(r["normalizedLive"], r["predictedLive"])}
    return out


def kubectl_diff(cluster: Cluster, manifest: Path, *args: str) -> list[Any]:
    done = cluster.kubectl("diff", "-f", str(manifest), *args, check=False)
    assert done.returncode in (0, 1), done.stderr  # 1: differences found
    return [done.returncode, done.stdout]


def test_drift_with_envelope_in_the_path(cluster: Cluster, webhook: Webhook, namespace: str,
                                          gitopsdiff: Path, tmp_path: Path) -> None:
    record: dict[str, Any] = {"engine": None}
    # The configuration docs/gitops.md gives, as the command prints it.
    ignore = tmp_path / "argocd.yaml"
    ignore.write_text(subprocess.run([sys.executable, "-m", "app", "gitops-config", "--argocd"],
                                     cwd=REPO, capture_output=True, text=True, check=True).stdout)
    for server_side in (False, True):
        for name, resources in (("fixed", FIXED), ("unfixed", UNFIXED)):
            obj = deployment(f"{name}-{'ssa' if server_side else 'csa'}", namespace, resources)
            manifest = write(tmp_path, obj)
            sync(gitopsdiff, cluster, manifest, server_side)
            live = cluster.kubectl_json("get", "deployment", "-n", namespace, obj["metadata"]["name"])
            result = argo_diff(gitopsdiff, cluster, manifest, ignore)
            record["engine"] = result["engine"]
            record[obj["metadata"]["name"]] = {
                "live resources": live["spec"]["template"]["spec"]["containers"][0]["resources"],
                "kubectl diff": kubectl_diff(cluster, manifest),
                "kubectl diff --server-side": kubectl_diff(
                    cluster, manifest, "--server-side", "--field-manager=argocd-controller",
                    "--force-conflicts"),
                "argo": shown(result)}
    print(json.dumps(record, indent=1))
    (Path(os.environ.get("ENVELOPE_GITOPS_RECORD", tmp_path)) / "drift.json").write_text(
        json.dumps(record, indent=1))

    limit = ".spec.template.spec.containers[0].resources.limits.cpu"
    for apply in ("csa", "ssa"):
        fixed, unfixed = record[f"fixed-{apply}"], record[f"unfixed-{apply}"]
        # Envelope stored the unfixed manifest without its CPU limit (the request kept).
        assert unfixed["live resources"] == FIXED, unfixed
        assert fixed["live resources"] == FIXED, fixed
        # kubectl diff dry-runs the write through the webhook: the mutated dry run equals
        # the live object, so neither manifest shows a difference (exit 0, no output).
        for which in (fixed, unfixed):
            assert which["kubectl diff"] == [0, ""], which
            assert which["kubectl diff --server-side"] == [0, ""], which
        # Argo CD: the fixed manifest is in sync in every mode.
        assert all(fixed["argo"][m] == {"modified": False, "paths": []} for m in MODES), fixed
        # The unfixed one: legacy (three-way on last-applied) and structured-merge diffs
        # compare git with the live object and show the removed limit, for ever;
        # Server-Side Diff dry-runs through the webhook and shows nothing, with or
        # without IncludeMutationWebhook (the removal happens in the dry run too).
        assert unfixed["argo"]["legacy"] == {"modified": True, "paths": [limit]}, unfixed
        assert unfixed["argo"]["structured-merge"] == {"modified": True, "paths": [limit]}, unfixed
        assert unfixed["argo"]["server-side"] == {"modified": False, "paths": []}, unfixed
        assert unfixed["argo"]["server-side+mutation"] == {"modified": False, "paths": []}, unfixed
        # With `envelope gitops-config --argocd`'s ignoreDifferences, run through Argo CD's
        # own normalizer: in sync in every mode, fixed and unfixed.
        for which in (fixed, unfixed):
            assert all(which["argo"][f"{m}+ignore"] == {"modified": False, "paths": []}
                       for m in MODES), which


def test_the_ignore_rules_cover_the_string_envelope_in_init_containers(
        cluster: Cluster, webhook: Webhook, namespace: str, gitopsdiff: Path, tmp_path: Path) -> None:
    """Issue 37 class 6: the webhook rewrites RESOURCE_LIMITS in an init container and a
    restartable sidecar as in a container; without an ignore rule for them Argo CD shows
    the app OutOfSync for ever. Through Argo CD's own normalizer, the printed rules leave
    every one of them out of the diff in every mode."""
    ignore = tmp_path / "argocd.yaml"
    ignore.write_text(subprocess.run([sys.executable, "-m", "app", "gitops-config", "--argocd"],
                                     cwd=REPO, capture_output=True, text=True, check=True).stdout)
    env = [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=1Gi"}]
    obj = deployment("envs", namespace, FIXED)
    spec = obj["spec"]["template"]["spec"]
    spec["containers"][0]["env"] = env
    spec["initContainers"] = [
        {"name": "init", "image": "registry.example/init:1", "env": env, "resources": FIXED},
        {"name": "sidecar", "image": "registry.example/side:1", "restartPolicy": "Always",
         "env": env, "resources": FIXED}]
    manifest = write(tmp_path, obj)
    sync(gitopsdiff, cluster, manifest, False)
    live = cluster.kubectl_json("get", "deployment", "-n", namespace, "envs")["spec"]["template"]["spec"]
    rewritten = [c["env"][0]["value"] for c in (*live["containers"], *live["initContainers"])]
    assert all(v != "cpu=2,memory=1Gi" for v in rewritten), rewritten  # the webhook rewrote all three
    result = shown(argo_diff(gitopsdiff, cluster, manifest, ignore))
    prefix = ".spec.template.spec"
    assert result["legacy"] == {"modified": True, "paths": [
        f"{prefix}.containers[0].env[0].value", f"{prefix}.initContainers[0].env[0].value",
        f"{prefix}.initContainers[1].env[0].value"]}, result
    assert all(result[f"{m}+ignore"] == {"modified": False, "paths": []} for m in MODES), result
