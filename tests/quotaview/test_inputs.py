"""The one loader of ``envelope quotas`` and ``envelope quotas plan`` (app/quotaview/inputs.py):
files with their problems in file order, a kubeconfig that cannot be used named."""

from __future__ import annotations

from pathlib import Path

from app.quotaview.inputs import read_cluster, read_files


def test_files_are_read_and_a_document_that_does_not_parse_is_named(tmp_path: Path) -> None:
    good = tmp_path / "a.yaml"
    good.write_text("apiVersion: kai.resources/v1alpha1\nkind: NodePool\nmetadata: {name: h100}\n"
                    "spec: {labelKey: pool, labelValue: h100}\n")
    bad = tmp_path / "b.yaml"
    bad.write_text("kind: [unclosed\n")
    objects, problems = read_files([str(bad), str(good)])
    assert [o["metadata"]["name"] for o in objects] == ["h100"]
    assert len(problems) == 1 and "b.yaml" in problems[0]


def test_a_kubeconfig_that_cannot_be_used_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.kubeconfig"
    objects, problems = read_cluster(str(missing), {"Node", "Project"})
    assert objects == []
    assert len(problems) == 1 and problems[0].startswith(f"cannot use --kubeconfig {missing}: ")
