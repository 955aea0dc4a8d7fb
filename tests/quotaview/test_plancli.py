"""``envelope quotas plan`` over files: the commands, the JSON, refusing what does not parse."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml  # type: ignore[import-untyped]

from app.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def tenancy(tmp_path: Path) -> tuple[Path, Path]:
    """The demo tenancy with research's h100 guarantee at its projects' 48 cards (base),
    and the one-card move research-train 8 -> 9, research-eval 8 -> 7 (target)."""
    base = tmp_path / "base"
    shutil.copytree(ROOT / "examples/tenancy", base)
    departments = base / "departments.yaml"
    departments.write_text(departments.read_text().replace("deserved: 56, ", "deserved: 48, "))
    target = tmp_path / "target"
    shutil.copytree(base, target)
    research = target / "projects/research.yaml"
    lines = research.read_text().splitlines(keepends=True)
    train = next(i for i, line in enumerate(lines) if "name: research-train-h100" in line)
    evaluation = next(i for i, line in enumerate(lines) if "name: research-eval-h100" in line)
    for i, new in ((train, "deserved: 9, "), (evaluation, "deserved: 7, ")):
        j = next(k for k in range(i, len(lines)) if "gpu:" in lines[k])
        lines[j] = lines[j].replace("deserved: 8, ", new)
    research.write_text("".join(lines))
    return base, target


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["quotas", "plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_one_card_move_prints_the_giver_first(tenancy: tuple[Path, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    base, target = tenancy
    code, out, _ = run(capsys, "--base", str(base), "--to", str(target))
    assert code == 0
    commands = [line for line in out.splitlines() if line.startswith("kubectl ")]
    assert len(commands) == 2
    assert commands[0].startswith("kubectl patch projects.kai.resources research-eval --type=json")
    assert commands[1].startswith("kubectl patch projects.kai.resources research-train --type=json")
    patch = json.loads(re.search(r"-p '(.*)'$", commands[1]).group(1))  # type: ignore[union-attr]
    assert patch[-2:] == [{"op": "test", "path": "/spec/queues/0/resources/gpu/deserved", "value": 8},
                          {"op": "replace", "path": "/spec/queues/0/resources/gpu/deserved", "value": 9}]
    assert re.match(r"# plan from .*base to .*target, \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", out)


def test_json_carries_the_schema_the_steps_and_their_patches(tenancy: tuple[Path, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    base, target = tenancy
    code, out, _ = run(capsys, "--base", str(base), str(target), "-o", "json")
    report: dict[str, Any] = json.loads(out)
    assert code == 0 and report["schemaVersion"] == "quotaplan/v1" and report["ok"]
    assert [(s["op"], s["name"]) for s in report["steps"]] == [("update", "research-eval"),
                                                               ("update", "research-train")]
    assert report["steps"][0]["kubectl"][:3] == ["patch", "projects.kai.resources", "research-eval"]
    assert report["source"]["base"] == str(base) and report["source"]["at"].endswith("Z")


def test_the_demo_as_written_names_the_department_that_over_reached(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--base", str(ROOT / "examples/tenancy/nodes.yaml"),
                       "--to", str(ROOT / "examples/tenancy"), "-o", "json")
    report = json.loads(out)
    assert code == 1 and not report["ok"] and not report["steps"]
    first = report["targetErrors"][0]
    assert (first["kind"], first["name"], first["rule"]) == ("Department", "research", "kai-pool-capacity")


def test_a_file_that_does_not_parse_is_refused_by_name(tenancy: tuple[Path, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    base, _ = tenancy
    bad = tmp_path / "broken.yaml"
    bad.write_text("kind: Project\nspec: [\n")
    code, out, err = run(capsys, "--base", str(base), "--to", str(bad))
    assert code == 2 and out == ""
    assert f"{bad}:" in err and "nothing was planned" in err
    code, _, err = run(capsys, "--base", str(bad), "--to", str(base))
    assert code == 2 and f"{bad}:" in err
    code, _, err = run(capsys, "--to", str(base))
    assert code == 2 and "--kubeconfig, --base PATH or --git-ref" in err


def test_prune_deletes_what_the_target_leaves_out_children_first(tenancy: tuple[Path, Path],
                                                                 tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The target without department speech and its projects: with --prune they are
    deleted, the projects first; without it the files are laid over the base (no change)."""
    base, _ = tenancy
    target = tmp_path / "without-speech"
    shutil.copytree(base, target)
    (target / "projects/speech.yaml").unlink()
    kept = [d for d in yaml.safe_load_all((base / "departments.yaml").read_text())
            if d["metadata"]["name"] != "speech"]
    (target / "departments.yaml").write_text(yaml.safe_dump_all(kept))
    speech = [p["metadata"]["name"] for p in yaml.safe_load_all((base / "projects/speech.yaml").read_text())]
    code, out, _ = run(capsys, "--base", str(base), "--to", str(target), "--prune", "-o", "json")
    assert code == 0
    steps = [(s["op"], s["kind"], s["name"]) for s in json.loads(out)["steps"]]
    assert steps == [*(("delete", "Project", p) for p in sorted(speech)), ("delete", "Department", "speech")]
    assert json.loads(out)["steps"][-1]["kubectl"] == ["delete", "departments.kai.resources", "speech"]
    code, out, _ = run(capsys, "--base", str(base), "--to", str(target), "-o", "json")
    assert code == 0 and json.loads(out)["steps"] == []


def test_objects_a_gitops_tool_tracks_get_a_warning(tenancy: tuple[Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    base, target = tenancy
    research = base / "projects/research.yaml"
    research.write_text(research.read_text().replace(
        "  name: research-eval\n",
        "  name: research-eval\n  annotations:\n"
        "    argocd.argoproj.io/tracking-id: tenancy:kai.resources/Project:/research-eval\n", 1))
    code, out, _ = run(capsys, "--base", str(base), "--to", str(target), "-o", "json")
    assert code == 0
    (warning,) = json.loads(out)["warnings"]
    assert "Project research-eval is tracked by Argo CD " \
        "(annotation argocd.argoproj.io/tracking-id)" in warning
    assert "belongs in git" in warning
