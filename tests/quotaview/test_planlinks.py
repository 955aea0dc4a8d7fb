"""Linked files (``--profile``): a ResourceQuota mirroring a queue's limit in whole cards
joins the plan, variables are rewritten in the git commit (listed otherwise), reminders
are listed; a profile that does not parse is refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.quotaview.planlinks import rewrite_variables

ROOT = Path(__file__).resolve().parents[2]

PROFILE = {"linked": {
    "variables": [{"path": "verify/quotas.env", "values": {
        "RESEARCH_TRAIN_H100_GPU": {"queue": "research-train-h100", "resource": "gpu", "field": "guarantee"},
        "RESEARCH_EVAL_H100_GPU": {"queue": "research-eval-h100"}}}],
    "resourceQuotas": [{"queue": "research-train-h100", "namespace": "kai-research-train", "name": "gpu",
                        "key": "requests.nvidia.com/gpu"}],
    "reminders": [{"path": "docs/runbook.md", "note": "the GPU table"}]}}

ENV = ("# compared with the live queues by verify.sh\n"
       "RESEARCH_TRAIN_H100_GPU=8   # train\n"
       "RESEARCH_EVAL_H100_GPU=\"8\"\n")

QUOTA = {"apiVersion": "v1", "kind": "ResourceQuota",
         "metadata": {"name": "gpu", "namespace": "kai-research-train"},
         "spec": {"hard": {"requests.nvidia.com/gpu": "32", "requests.cpu": "64"}}}


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Base (demo tenancy, research at 48 h100 cards, plus the mirrored ResourceQuota), the
    target (research-train 8 -> 9 with limit 32 -> 36, research-eval 8 -> 7), the profile."""
    base = tmp_path / "repo" / "tenancy"
    shutil.copytree(ROOT / "examples/tenancy", base)
    departments = base / "departments.yaml"
    departments.write_text(departments.read_text().replace("deserved: 56, ", "deserved: 48, "))
    (base / "quota.yaml").write_text(yaml.safe_dump(QUOTA))
    objects = list(yaml.safe_load_all((base / "projects/research.yaml").read_text()))
    train = next(o for o in objects if o["metadata"]["name"] == "research-train")
    evaluation = next(o for o in objects if o["metadata"]["name"] == "research-eval")
    train["spec"]["queues"][0]["resources"]["gpu"].update(deserved=9, limit=36)
    evaluation["spec"]["queues"][0]["resources"]["gpu"]["deserved"] = 7
    target = tmp_path / "target.yaml"
    target.write_text(yaml.safe_dump_all([train, evaluation]))
    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    (tmp_path / "repo" / "verify").mkdir()
    (tmp_path / "repo" / "verify" / "quotas.env").write_text(ENV)
    return base, target, profile


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["quotas", "plan", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_mirrored_quota_joins_the_plan_and_the_rest_is_listed(
        tree: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base, target, profile = tree
    code, out, err = run(capsys, "--base", str(base), "--to", str(target), "--profile", str(profile),
                         "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    steps = [(s["kind"], s["name"]) for s in report["steps"]]
    assert steps[:2] == [("Project", "research-eval"), ("Project", "research-train")]
    assert ("ResourceQuota", "gpu") in steps
    quota = next(s for s in report["steps"] if s["kind"] == "ResourceQuota")
    assert quota["kubectl"][:4] == ["patch", "resourcequotas", "gpu", "-n"]
    assert quota["patch"][-2:] == [
        {"op": "test", "path": "/spec/hard/requests.nvidia.com~1gpu", "value": "32"},
        {"op": "replace", "path": "/spec/hard/requests.nvidia.com~1gpu", "value": "36"}]
    linked = {(i["kind"], i["key"]): i for i in report["linked"]}
    assert (linked[("variable", "RESEARCH_TRAIN_H100_GPU")]["before"],
            linked[("variable", "RESEARCH_TRAIN_H100_GPU")]["after"]) == ("8", "9")
    assert linked[("variable", "RESEARCH_EVAL_H100_GPU")]["after"] == "7"
    assert linked[("reminder", "")]["where"] == "docs/runbook.md"


def test_git_mode_rewrites_the_variables_in_the_same_commit(
        tree: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    base, target, profile = tree
    repo = base.parent
    for args in (["init", "-q", "-b", "main"], ["add", "."],
                 ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "tenancy"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    code, out, err = run(capsys, "--repo", str(repo), "--git-ref", "main", "--git-path", "tenancy",
                         "--to", str(target), "--profile", str(profile), "--branch", "linked")
    assert code == 0, err
    env = subprocess.run(["git", "-C", str(repo), "show", "linked:verify/quotas.env"], check=True,
                         capture_output=True, text=True).stdout
    assert env == ENV.replace("GPU=8   # train", "GPU=9   # train").replace('GPU="8"', 'GPU="7"')
    changed = subprocess.run(["git", "-C", str(repo), "diff", "--name-only", "main", "linked"], check=True,
                             capture_output=True, text=True).stdout.split()
    assert sorted(changed) == ["tenancy/projects/research.yaml", "tenancy/quota.yaml", "verify/quotas.env"]
    assert "# linked, update by hand: docs/runbook.md (the GPU table)" in out


def test_a_profile_that_does_not_parse_is_refused_by_name(tree: tuple[Path, Path, Path], tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    base, target, _ = tree
    bad = tmp_path / "bad-profile.yaml"
    bad.write_text("linked:\n  resourceQuotas:\n    - {queue: q}\n")
    code, _, err = run(capsys, "--base", str(base), "--to", str(target), "--profile", str(bad))
    assert code == 2 and f"{bad}: linked.resourceQuotas[0] needs namespace, name, key" in err


def test_rewrite_variables_changes_only_the_value() -> None:
    text, missing = rewrite_variables("export A=1  # one\nB: '2'\nC=3\n", {"A": "10", "B": "20", "D": "4"})
    assert text == "export A=10  # one\nB: '20'\nC=3\n" and missing == ["D"]
