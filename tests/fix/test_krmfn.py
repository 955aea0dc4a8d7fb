"""``envelope krm-fn``: the KRM function protocol on its own, and as a real kustomize
exec transformer (kustomize built from its Go module by e2e/controlplane/build-kustomize.sh;
that test carries the e2e marker: a cold build takes ~4 minutes)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from app.cluster.view import StaticView
from app.core.config import load_policy
from app.core.engine import check_object
from app.core.frontdoor import subject_of
from app.core.ruleset import default_ruleset
from app.fix.krmfn import process
from tests.conftest import container, workload

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "e2e" / "controlplane" / "build-kustomize.sh"
RULES = default_ruleset()
POLICY = load_policy(None, None, RULES)

RESOURCE_LIST = """\
apiVersion: config.kubernetes.io/v1
kind: ResourceList
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata:
    name: web  # kept
    namespace: shop
    annotations:
      config.kubernetes.io/index: '0'
      internal.config.kubernetes.io/path: 'deploy.yaml'
  spec:
    template:
      spec:
        containers:
        - name: app
          image: nginx
          env:
          - {name: RESOURCE_LIMITS, value: "cpu=2,memory=1Gi"}
          resources:
            limits: {cpu: "2", memory: 1Gi}
- apiVersion: v1
  kind: ConfigMap
  metadata:
    name: untouched
  data:
    a: "1"
functionConfig:
  apiVersion: envelope.io/v1alpha1
  kind: EnvelopeFix
  metadata:
    name: envelope
"""


def expected_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the API server stores for each item with Envelope in the path: the mutate
    phase's patch, applied by the jsonpatch library."""
    view = StaticView(items, RULES.indexes)
    out = []
    for obj in items:
        patch = check_object(RULES, subject_of(obj), view, POLICY).patch
        out.append(jsonpatch.apply_patch(obj, patch) if patch else obj)
    return out


def test_resource_list_items_get_the_patch_and_results() -> None:
    text, status = process(RESOURCE_LIST, RULES, POLICY)
    assert status == 0
    before, after = yaml.safe_load(RESOURCE_LIST), yaml.safe_load(text)
    assert after["items"] == expected_items(before["items"])
    assert after["items"][0] != before["items"][0]  # the CPU limit went, the request came
    assert after["functionConfig"] == before["functionConfig"]
    infos = [r for r in after["results"] if r["severity"] == "info"]
    assert {r["message"].split(":")[0] for r in infos} == {"cpu-limits", "env-envelope-cpu"}
    assert infos[0]["resourceRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": "web", "namespace": "shop"}
    assert infos[0]["file"] == {"path": "deploy.yaml", "index": 0}
    # the text around the change is passed through as written
    assert "    name: web  # kept\n" in text
    assert '          - {name: RESOURCE_LIMITS, value: "memory=1Gi"}\n' in text
    assert "            limits: {memory: 1Gi}\n" in text
    # a second pass changes no item
    again, _ = process(text, RULES, POLICY)
    assert yaml.safe_load(again)["items"] == after["items"]


def test_not_a_resource_list_fails_with_a_result() -> None:
    text, status = process("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", RULES, POLICY)
    assert status == 1
    out = yaml.safe_load(text)
    assert out["kind"] == "ResourceList"
    assert "not a config.kubernetes.io/v1 ResourceList" in out["results"][0]["message"]


def test_an_error_result_exits_1_and_still_writes_the_resource_list() -> None:
    """kyaml's framework convention (kyaml/fn/framework/result.go, Results.ExitCode): any
    result of severity error exits 1, so ``kustomize build`` stops instead of emitting a
    manifest the webhook denies (before: exit 0 with the error in the results)."""
    refused = yaml.safe_load(RESOURCE_LIST)
    refused["items"].append(workload("Deployment", [
        container("db", requests={"memory": "1Gi"}, limits={"memory": "2Gi"})], namespace="shop"))
    refused["items"][-1]["metadata"]["name"] = "db"
    text = yaml.safe_dump(refused, sort_keys=False)
    out, status = process(text, RULES, POLICY)
    assert status == 1
    after = yaml.safe_load(out)
    errors = [r for r in after["results"] if r["severity"] == "error"]
    assert [r["resourceRef"]["name"] for r in errors] == ["db"]
    assert errors[0]["message"].startswith("memory-request-equals-limit: ")
    assert after["items"] == expected_items(refused["items"])  # the other items still fixed
    done = subprocess.run([sys.executable, "-m", "app", "krm-fn"], input=text, capture_output=True,
                          text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 1, done.stderr
    assert yaml.safe_load(done.stdout) == after
    assert "results of severity error" in done.stderr
    assert "[error] apps/v1/Deployment/shop/db " in done.stderr  # kustomize shows only stderr
    # warnings and infos alone keep exit 0 (the first test's list)
    assert process(RESOURCE_LIST, RULES, POLICY)[1] == 0


def kustomize() -> Path:
    override = os.environ.get("ENVELOPE_KUSTOMIZE_BIN")
    if override:
        return Path(override) / "kustomize"
    done = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not done.stdout.strip():
        pytest.fail(f"{BUILD.name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
                    pytrace=False)
    return Path(done.stdout.strip().splitlines()[-1]) / "kustomize"


DEPLOYMENT = workload("Deployment", [
    container("app", requests={"memory": "1Gi"}, limits={"cpu": "1500m", "memory": "1Gi"}),
    container("sidecar", limits={"cpu": "250m"}),
], init=[container("init", requests={"memory": "64Mi"})], namespace="shop")


def _kustomization(tmp_path: Path, *, function: bool) -> Path:
    base = tmp_path / ("with-fn" if function else "plain")
    base.mkdir()
    (base / "deploy.yaml").write_text(yaml.safe_dump(copy.deepcopy(DEPLOYMENT), sort_keys=False)
                                      + "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  "
                                        "name: settings\n  namespace: shop\ndata:\n  a: '1'\n")
    kustomization = "resources:\n- deploy.yaml\ncommonLabels:\n  team: shop\n"
    if function:
        script = base / "envelope-krm-fn"
        script.write_text(f"#!/bin/sh\nexec {sys.executable} -m app krm-fn\n")
        script.chmod(0o755)
        (base / "envelope-fn.yaml").write_text(
            "apiVersion: envelope.io/v1alpha1\nkind: EnvelopeFix\nmetadata:\n  name: envelope\n"
            "  annotations:\n    config.kubernetes.io/function: |\n      exec:\n"
            "        path: ./envelope-krm-fn\n")
        kustomization += "transformers:\n- envelope-fn.yaml\n"
    (base / "kustomization.yaml").write_text(kustomization)
    return base


def _build(binary: Path, where: Path, *flags: str) -> list[dict[str, Any]]:
    done = subprocess.run([str(binary), "build", *flags, str(where)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.e2e
def test_kustomize_build_with_the_function_equals_what_the_cluster_stores(tmp_path: Path) -> None:
    binary = kustomize()
    plain = _build(binary, _kustomization(tmp_path, function=False))
    fixed = _build(binary, _kustomization(tmp_path, function=True),
                   "--enable-alpha-plugins", "--enable-exec")
    assert fixed == expected_items(plain)
    deployment = next(d for d in fixed if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    assert "cpu" not in spec["containers"][0]["resources"]["limits"]
    assert spec["containers"][1]["resources"]["requests"] == {"cpu": "250m"}
    assert spec["initContainers"][0]["resources"]["limits"] == {"memory": "64Mi"}
    assert deployment["metadata"]["labels"] == {"team": "shop"}  # kustomize's own transformers ran
    # what kustomize now renders needs no change from the webhook
    assert not any(check_object(RULES, subject_of(o), StaticView(fixed, RULES.indexes), POLICY).patch
                   for o in fixed)


@pytest.mark.e2e
def test_kustomize_build_stops_on_an_error_result(tmp_path: Path) -> None:
    """With a workload the webhook refuses, the real kustomize stops (before: it printed
    the manifests, and the apply failed later at the webhook)."""
    binary = kustomize()
    base = _kustomization(tmp_path, function=True)
    refused = workload("Deployment", [container("db", requests={"memory": "1Gi"}, limits={"memory": "2Gi"})],
                       namespace="shop")
    refused["metadata"]["name"] = "db"
    with (base / "deploy.yaml").open("a") as f:
        f.write("---\n" + yaml.safe_dump(refused, sort_keys=False))
    done = subprocess.run([str(binary), "build", "--enable-alpha-plugins", "--enable-exec", str(base)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode != 0, done.stdout[-2000:]
    assert done.stdout == ""
    assert "memory-request-equals-limit" in done.stderr, done.stderr[-2000:]
