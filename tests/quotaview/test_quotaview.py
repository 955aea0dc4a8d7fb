"""`envelope quotas`: the tree built with the quota rules' arithmetic, drawn as text (exact
output at fixed widths), html and json; before -> after for a change; exact decimals."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from app.cli import main
from app.crds.kai import ZERO
from app.quotaview.model import allocated
from app.quotaview.text import bar
from tests.helpers.schemas import validator

SMALL = Path(__file__).parent.parent / "data" / "quotaview-small.yaml"

TEXT_80 = """\
pool a100: 2 nodes, 8 cards; departments guaranteed 9 cards - OVER-COMMITTED by
    1 card
[#################################################=================!!!!!!!!] 9/8
  department ml: deserved 6 cards, limit 8 cards, projects 7 cards -
      OVER-COMMITTED by 1 card
  [###############################===============================!!!!!!!!!!] 7/6
    error kai-pool-capacity: ml-a100 (pool a100): departments are guaranteed 9
        cards in total (this one 6 cards) but the pool's 2 nodes have 8 cards -
        1 card cannot be met. Lower a department's gpu deserved on this pool
        first, or add nodes to the pool
    project eval: deserved 3 cards, limit 8 cards
      error kai-guarantee-sum: ml-a100 (pool a100): projects are guaranteed 7
          cards in total but the department has 6 cards - 1 card cannot be met.
          This write gives eval-a100 3 cards: first lower another project's gpu
          deserved on this pool, or raise department ml's, in a separate write
    project train: deserved 4 cards, limit 8 cards, allocated 5 cards
      error kai-guarantee-sum: ml-a100 (pool a100): projects are guaranteed 7
          cards in total but the department has 6 cards - 1 card cannot be met.
          This write gives train-a100 4 cards: first lower another project's gpu
          deserved on this pool, or raise department ml's, in a separate write
  department ops: deserved 3 cards, limit unlimited
    error kai-pool-capacity: ops-a100 (pool a100): departments are guaranteed 9
        cards in total (this one 3 cards) but the pool's 2 nodes have 8 cards -
        1 card cannot be met. Lower a department's gpu deserved on this pool
        first, or add nodes to the pool

allocated: not reported for 3 queues (no KAI Queue status.allocated in view)
"""

TEXT_120 = (Path(__file__).parent.parent / "data" / "quotaview-small-120.txt").read_text()
"""The same tree at 120 columns (findings wrap later; the bars are 114 cells: ml 6 and ops 3
cards side by side, 76 + 38 cells, the last 13 past the pool's 8 cards)."""


def quotas(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["quotas", *args])
    out, err = capsys.readouterr()
    return code, out, err


def write(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text(yaml.safe_dump_all(docs))
    return path


def test_text_at_80_columns_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = quotas(capsys, str(SMALL), "--width", "80", "--color", "never")
    assert code == 0
    assert out == TEXT_80
    assert max(len(line) for line in out.splitlines()) <= 80


def test_text_at_120_columns_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = quotas(capsys, str(SMALL), "--width", "120", "--color", "never")
    assert code == 0
    assert out == TEXT_120
    assert out.splitlines()[1] == "[" + "#" * 76 + "=" * 25 + "!" * 13 + "] 9/8"
    assert max(len(line) for line in out.splitlines()) <= 120


def test_width_from_columns_and_no_colour_when_not_a_tty(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = quotas(capsys, str(SMALL))  # --color auto; captured stdout is no TTY
    assert code == 0 and out == TEXT_80 and "\x1b[" not in out
    _, coloured, _ = quotas(capsys, str(SMALL), "--color", "always")
    assert "\x1b[1;31m" in coloured  # over-commit in red
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == TEXT_80


def test_bar_marks_the_cells_past_the_cap() -> None:
    assert bar([Decimal(6), Decimal(3)], Decimal(8), 9) == "[######==!]"
    assert bar([Decimal(2)], Decimal(4), 8) == "[####....]"
    assert bar([Decimal(2), Decimal(-1)], Decimal(4), 4) == "[!!!!]"  # unlimited child, finite cap
    assert bar([Decimal(1)], None, 4) == "[####]"


def test_json_validates_and_carries_the_rules_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = quotas(capsys, str(SMALL), "-o", "json")
    assert code == 0
    report = json.loads(out)
    validator("quotas-v1.json").validate(report)
    (pool,) = report["pools"]
    assert (pool["name"], pool["cards"], pool["guaranteed"]["gpu"], pool["overCommitted"]) == \
        ("a100", "8", "9", True)
    ml, ops = pool["departments"]
    assert (ml["name"], ml["resources"]["gpu"]["children"], ml["overCommitted"]) == ("ml", "7", True)
    assert not ops["overCommitted"] and ops["resources"]["gpu"]["limit"] == "-1"
    eval_, train = ml["children"]
    assert train["resources"]["gpu"]["allocated"] == "5"
    assert train["resources"]["cpu"]["allocated"] == "1500"
    assert train["resources"]["memory"]["allocated"] == "2000"
    assert eval_["resources"]["gpu"]["allocated"] is None  # no Queue status: not reported, not 0
    assert [f["rule"] for f in eval_["findings"]] == ["kai-guarantee-sum"]
    assert [f["rule"] for f in ml["findings"]] == ["kai-pool-capacity"]


def test_the_picture_agrees_with_check(capsys: pytest.CaptureFixture[str]) -> None:
    """Every quota finding `check` reports is beside its object, none added."""
    main(["check", str(SMALL), "-o", "json"])
    checked = json.loads(capsys.readouterr().out)
    expected = sorted((o["kind"], o["name"], f["rule"], f["message"]) for o in checked["objects"]
                      for f in o["findings"] if f["rule"].startswith("kai-"))
    _, out, _ = quotas(capsys, str(SMALL), "-o", "json")
    report = json.loads(out)
    seen: list[tuple[str, str, str, str]] = []

    def walk(node: dict[str, Any]) -> None:
        seen.extend((node["kind"], node["name"], f["rule"], f["message"]) for f in node["findings"])
        for child in node["children"]:
            walk(child)

    for pool in report["pools"]:
        for node in pool["departments"] + pool["uncapped"]:
            walk(node)
    assert sorted(seen) == expected and expected


def fractional(tmp_path: Path) -> Path:
    return write(tmp_path / "frac.yaml", [
        {"apiVersion": "kai.resources/v1alpha1", "kind": "Department", "metadata": {"name": "d"},
         "spec": {"queues": [{"name": "", "nodepool": "default",
                              "resources": {"gpu": {"deserved": 0.3, "limit": 0.3}}}]}},
        *({"apiVersion": "kai.resources/v1alpha1", "kind": "Project", "metadata": {"name": name},
           "spec": {"parent": "d", "queues": [{"name": "", "nodepool": "default",
                                               "resources": {"gpu": {"deserved": g, "limit": 0.3}}}]}}
          for name, g in (("p1", 0.1), ("p2", 0.2))),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"},
         "status": {"allocatable": {"nvidia.com/gpu": "1"}}}])


def test_a_tenth_plus_two_tenths_fit_in_three_tenths(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = fractional(tmp_path)
    _, out, _ = quotas(capsys, str(path), "-o", "json")
    (department,) = json.loads(out)["pools"][0]["departments"]
    assert department["resources"]["gpu"]["children"] == "0.3"
    assert department["overCommitted"] is False and department["findings"] == []
    _, text, _ = quotas(capsys, str(path), "--width", "80")
    assert "projects 0.3 cards\n" in text and "OVER" not in text
    assert "  [#######################=============================================] 0.3/0.3\n" \
        in text
    _, page, _ = quotas(capsys, str(path), "-o", "html")
    assert 'data-over="true"' not in page and "0.3 cards" in page
    assert 0.1 + 0.2 != 0.3  # the float sum KAI compares would not fit


def test_before_and_after_for_a_change_over_base_files(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    base = yaml.safe_load_all(SMALL.read_text())
    docs = [d for d in base if d]
    change = [json.loads(json.dumps(d)) for d in docs if d["metadata"]["name"] in ("ml", "eval")]
    change[0]["spec"]["queues"][0]["resources"]["gpu"]["deserved"] = 7  # ml: 6 -> 7
    change.append({"apiVersion": "kai.resources/v1alpha1", "kind": "Project",
                   "metadata": {"name": "eval"}, "spec": {"parent": "ml", "queues": []}})
    change = [c for c in change if not (c["kind"] == "Project" and c["spec"]["queues"])]
    path = write(tmp_path / "change.yaml", change)
    code, out, _ = quotas(capsys, str(path), "--base", str(SMALL), "-o", "json")
    assert code == 0
    report = json.loads(out)
    validator("quotas-v1.json").validate(report)
    assert report["reviewing"] is True
    pool = report["pools"][0]
    ml = pool["departments"][0]
    assert (ml["change"], ml["before"]["gpu"]["guarantee"], ml["resources"]["gpu"]["guarantee"]) == \
        ("changed", "6", "7")
    assert pool["change"] == "changed" and pool["before"] == {"cards": "8", "gpuGuaranteed": "9"}
    assert report["removed"] == [{"kind": "Project", "name": "eval", "queue": "eval-a100",
                                  "pool": "a100"}]
    assert [c["name"] for c in ml["children"]] == ["train"] and ml["overCommitted"] is False
    _, text, _ = quotas(capsys, str(path), "--base", str(SMALL), "--width", "100")
    assert "department ml: deserved 6 cards -> 7 cards, limit 8 cards, projects 4 cards [changed]" in text
    assert text.startswith("pool a100: 2 nodes, 8 cards; departments guaranteed 9 cards -> 10 cards")
    assert "removed by this change\n  project eval queue eval-a100 (pool a100)\n" in text
    _, page, _ = quotas(capsys, str(path), "--base", str(SMALL), "-o", "html")
    assert 'data-kind="Department" data-name="ml" data-over="false" data-change="changed"' in page
    assert 'data-name="eval" data-change="removed"' in page


def test_html_is_self_contained(capsys: pytest.CaptureFixture[str]) -> None:
    _, page, _ = quotas(capsys, str(SMALL), "-o", "html")
    assert page.startswith("<!doctype html>") and "<svg" in page and "<details" in page
    for outside in ("<script", "src=", "href=", "url(", "@import", "http:", "https:"):
        assert outside not in page, outside
    for kind, name in (("pool", "a100"), ("Department", "ml"), ("Project", "train")):
        assert f'data-kind="{kind}" data-name="{name}" data-over=' in page
    assert "kai-pool-capacity" in page  # the findings beside their objects


def test_html_collapses_departments_beyond_the_threshold(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    _, page, _ = quotas(capsys, str(SMALL), "-o", "html", "--collapse-above", "0")
    # ml is over-committed and ops has a finding: both stay open although collapsed
    assert page.count("<details open>") == page.count("<details") == 3
    calm = str(fractional(tmp_path))  # 2 projects, no finding, nothing over
    _, page, _ = quotas(capsys, calm, "-o", "html", "--collapse-above", "1")
    assert page.count("<details>") == 1 and page.count("<details open>") == 1  # the pool
    _, page, _ = quotas(capsys, calm, "-o", "html", "--collapse-above", "2")
    assert "<details>" not in page


def test_allocated_is_read_tolerantly() -> None:
    assert allocated(None) == {"gpu": None, "cpu": None, "memory": None}
    assert allocated({"status": {}}) == {"gpu": None, "cpu": None, "memory": None}
    assert allocated({"status": {"allocated": "x"}})["gpu"] is None
    assert allocated({"status": {"allocated": {"cpu": "2"}}}) == \
        {"gpu": ZERO, "cpu": Decimal(2000), "memory": ZERO}
    assert allocated({"status": {"allocated": {"nvidia.com/gpu": "one"}}})["gpu"] is None
    assert allocated({"status": {"allocated": {"nvidia.com/gpu": "0.5", "memory": "1Gi"}}}) == \
        {"gpu": Decimal("0.5"), "cpu": ZERO, "memory": Decimal("1073.741824")}
    # KAI keys DRA GPUs by DeviceClass name (issue 37): counted as cards, summed
    assert allocated({"status": {"allocated": {"gpu.nvidia.com": "6"}}})["gpu"] == 6
    assert allocated({"status": {"allocated": {"gpu.nvidia.com": "6", "nvidia.com/gpu": "2"}}})[
        "gpu"] == 8


def test_unreadable_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("kind: [\n")
    code, _, err = quotas(capsys, str(tmp_path / "bad.yaml"))
    assert code == 2 and "nothing was drawn" in err
    code, _, err = quotas(capsys)
    assert code == 2 and "give files" in err


def test_a_spec_that_does_not_parse_is_listed_with_its_findings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "t.yaml", [
        {"apiVersion": "kai.resources/v1alpha1", "kind": "Project", "metadata": {"name": "p"},
         "spec": {"queues": [{"name": "", "nodepool": "default",
                              "resources": {"gpu": {"deserved": "32Gi"}}}]}}])
    _, out, _ = quotas(capsys, str(path), "-o", "json")
    (loose,) = json.loads(out)["unplaced"]
    assert loose["name"] == "p" and loose["findings"][0]["rule"] == "kai-schema"
    _, text, _ = quotas(capsys, str(path))
    assert "not in the tree" in text and "expected a number, got '32Gi'" in text


def test_kai_queue_trees_and_cycles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def queue(name: str, parent: str, quota: float) -> dict[str, Any]:
        return {"apiVersion": "scheduling.run.ai/v2", "kind": "Queue", "metadata": {"name": name},
                "spec": {"parentQueue": parent, "resources": {"gpu": {"quota": quota, "limit": -1}}}}

    path = write(tmp_path / "q.yaml", [queue("root", "", 4), queue("a", "root", 3), queue("b", "root", 2),
                                       queue("qx", "qy", 1), queue("qy", "qx", 1)])
    _, out, _ = quotas(capsys, str(path), "-o", "json")
    roots = json.loads(out)["queues"]
    assert [r["name"] for r in roots] == ["root", "qx"]  # roots, then cycles
    assert roots[0]["overCommitted"] is True and roots[0]["resources"]["gpu"]["children"] == "5"
    assert [c["name"] for c in roots[0]["children"]] == ["a", "b"]
    assert [c["name"] for c in roots[1]["children"]] == ["qy"]  # the cycle drawn once
    assert roots[1]["children"][0]["children"] == []


def test_a_project_moved_to_another_department(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = [d for d in yaml.safe_load_all(SMALL.read_text()) if d]
    moved = next(d for d in docs if d["metadata"]["name"] == "eval")
    moved["spec"]["parent"] = "ops"
    path = write(tmp_path / "move.yaml", [moved])
    _, out, _ = quotas(capsys, str(path), "--base", str(SMALL), "-o", "json")
    report = json.loads(out)
    validator("quotas-v1.json").validate(report)
    ml, ops = report["pools"][0]["departments"]
    assert [c["name"] for c in ml["children"]] == ["train"] and not ml["overCommitted"]
    (eval_,) = ops["children"]
    assert (eval_["name"], eval_["change"], eval_["before"]) == ("eval", "moved", None)
    assert ops["overCommitted"] is False and ops["resources"]["gpu"]["children"] == "3"
    assert report["removed"] == []


@pytest.mark.parametrize("output", ["text", "html", "json"])
def test_malformed_objects_are_drawn_never_an_error(output: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """spec: null, queues that are not a list, a parent that is a number, an unlimited
    child under a finite department, a queue that is its own parent, 1e308 cards, an
    allocated list that is not quantities, a NodePool label key that is a number."""
    code, out, err = quotas(capsys, str(Path(__file__).parent.parent / "data" / "quotaview-malformed.yaml"),
                            "-o", output)
    assert code == 0 and "internal" not in out and not err
    if output == "text":
        assert "department d3: deserved 2 cards, limit 4 cards, projects unlimited - OVER-COMMITTED " \
               "by unlimited" in out
        assert "Department d2" in out and "Project p1" in out  # not in the tree, with why
    if output == "json":
        report = json.loads(out)
        validator("quotas-v1.json").validate(report)
        (q,) = report["queues"]
        assert q["children"] == [] and q["resources"]["gpu"]["children"] is None
        assert q["resources"]["gpu"]["allocated"] is None  # [1] is no quantity: not reported


def test_a_volcano_queue_of_the_same_name_is_not_read(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    docs = [d for d in yaml.safe_load_all(SMALL.read_text()) if d]
    docs.append({"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
                 "metadata": {"name": "eval-a100"}, "spec": {"weight": 1},
                 "status": {"allocated": {"nvidia.com/gpu": "2"}}})
    _, out, _ = quotas(capsys, str(write(tmp_path / "t.yaml", docs)), "-o", "json")
    ml = json.loads(out)["pools"][0]["departments"][0]
    allocated_gpu = {c["name"]: c["resources"]["gpu"]["allocated"] for c in ml["children"]}
    assert allocated_gpu == {"eval": None, "train": "5"}
    assert json.loads(out)["queues"] == []
