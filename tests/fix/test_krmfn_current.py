"""``envelope fix`` and ``krm-fn`` on current-format (api.ate.dev) ActorTemplates: they go
through the same front door as ``envelope check`` (app/core/frontdoor.py), so what they
do with such a template is what ``check`` predicts for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main
from app.core.config import Policy
from app.fix.krmfn import process
from tests.conftest import RULES, container, workload


def template(memory: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"atespace": "team-a", "name": name},
            "spec": {"sandboxConfig": {"sandboxClass": "SANDBOX_CLASS_MICROVM"},
                     "resources": {"limits": [{"name": "cpu", "quantity": "500m"},
                                              {"name": "memory", "quantity": memory}]},
                     "containers": [{"name": "main", "image": "registry.example/a@sha256:00"}]}}


POOL = {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
        "metadata": {"name": "vm", "namespace": "agents"},
        "spec": {"replicas": 1, "workerImage": "registry.example/w@sha256:00",
                 "sandboxClasses": [{"name": "microvm"}],
                 "template": {"resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}}}

# Below the micro-VM floor (refused), too big for the pool (refused), and one that fits.
DOCS = [template("200Mi", "tiny"), template("8Gi", "huge"), template("1Gi", "fits"), POOL,
        workload("Deployment", [container(requests={"memory": "1Gi"},
                                          limits={"cpu": "2", "memory": "1Gi"})])]


def predicted(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, dict[str, Any]]:
    """``envelope check -o json``: each object's findings and patch, by name."""
    main(["check", "-o", "json", str(path)])
    objects = json.loads(capsys.readouterr().out)["objects"]
    return {o["name"]: o for o in objects}


def test_krm_fn_reports_and_patches_what_check_predicts(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "all.yaml"
    path.write_text(yaml.safe_dump_all(DOCS, sort_keys=False))
    check = predicted(capsys, path)
    assert [f["rule"] for f in check["tiny"]["findings"]] == ["actor-microvm-memory-floor"]
    assert [f["rule"] for f in check["huge"]["findings"]] == ["actor-placement"]
    assert check["fits"]["findings"] == [] and check["web"]["patch"]

    listed = yaml.safe_dump({"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList",
                             "items": DOCS}, sort_keys=False)
    out, status = process(listed, RULES, Policy())
    doc = yaml.safe_load(out)
    got: dict[str, list[tuple[str, str]]] = {}
    for r in doc["results"]:
        if r["severity"] in ("error", "warning"):
            got.setdefault(r["resourceRef"]["name"], []).append((r["severity"], r["message"]))
    want = {name: [(f["severity"], f"{f['rule']}: {f['message']}") for f in o["findings"]]
            for name, o in check.items() if o["findings"]}
    assert got == want
    assert status == 1  # check refuses two of the templates
    # The templates are written back as they came (check predicts no change to them);
    # the Deployment carries check's patch.
    items = {i["metadata"]["name"]: i for i in doc["items"]}
    for name in ("tiny", "huge", "fits"):
        assert check[name]["patch"] == [] and items[name] == next(
            d for d in DOCS if d["metadata"]["name"] == name)
    assert "cpu" not in items["web"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_fix_leaves_a_template_check_refuses_as_it_is(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "all.yaml"
    text = yaml.safe_dump_all(DOCS, sort_keys=False)
    path.write_text(text)
    check = predicted(capsys, path)
    assert sum(bool(o["patch"]) for o in check.values()) == 1  # the Deployment only
    assert main(["fix", str(path)]) == 0
    capsys.readouterr()
    fixed = list(yaml.safe_load_all(path.read_text()))
    assert fixed[:4] == DOCS[:4]
    assert fixed[4] != DOCS[4]
    # Once fixed, check predicts no change, and fix has none to make.
    assert all(not o["patch"] for o in predicted(capsys, path).values())
    assert main(["fix", "--check", str(path)]) == 0
