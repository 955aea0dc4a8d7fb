"""``envelope fix`` and ``krm-fn`` judge an object written without a namespace in the one
``kubectl apply`` puts it in (offline: ``default``), as ``envelope check`` does (the
front door, app/core/frontdoor.py): that namespace's exceptions and objects apply, so
fix writes exactly the changes check predicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.core.config import Policy
from app.fix.krmfn import process
from tests.conftest import RULES, container, workload

POLICY = {"exceptions": [{"rules": ["cpu-limits"], "namespaces": ["default"]}]}


def deployment(name: str, namespace: str | None) -> dict:
    obj = workload("Deployment", [container(requests={"cpu": "1", "memory": "1Gi"},
                                            limits={"cpu": "2", "memory": "1Gi"})], name=name)
    if namespace is None:
        del obj["metadata"]["namespace"]
    else:
        obj["metadata"]["namespace"] = namespace
    return obj


DOCS = [deployment("bare", None), deployment("placed", "default"), deployment("elsewhere", "team-a")]


def test_fix_writes_what_check_predicts_for_an_object_without_a_namespace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump_all(DOCS, sort_keys=False))
    main(["check", "-o", "json", "--config", str(policy), str(path)])
    predicted = {o["name"]: o for o in json.loads(capsys.readouterr().out)["objects"]}
    # check places "bare" in default, where cpu-limits is excepted.
    assert [(n, bool(o["patch"])) for n, o in predicted.items()] == [
        ("bare", False), ("placed", False), ("elsewhere", True)]
    assert main(["fix", "--config", str(policy), str(path)]) == 0
    capsys.readouterr()
    fixed = list(yaml.safe_load_all(path.read_text()))
    assert fixed[:2] == DOCS[:2]
    limits = fixed[2]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"memory": "1Gi"}


def test_krm_fn_places_items_as_fix_does() -> None:
    listed = yaml.safe_dump({"apiVersion": "config.kubernetes.io/v1", "kind": "ResourceList",
                             "items": DOCS}, sort_keys=False)
    out, status = process(listed, RULES, Policy.model_validate(POLICY))
    items = {i["metadata"]["name"]: i for i in yaml.safe_load(out)["items"]}
    assert status == 0
    assert items["bare"] == DOCS[0] and items["placed"] == DOCS[1]
    assert items["elsewhere"] != DOCS[2]
    assert "namespace" not in items["bare"]["metadata"]  # placed for judging, not written
