"""Git mode of ``envelope quotas plan``: the change written into the tenancy files at a ref,
value by value (comments and columns kept), one commit on a new local branch through git
plumbing; the working tree, the index and HEAD untouched; nothing pushed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from app.cli import main
from app.core.config import Policy
from app.quotaview.plangit import realign

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository whose main branch holds the demo tenancy (research at its projects'
    48 h100 cards), with an uncommitted edit in the working tree and one staged."""
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "examples/tenancy", repo / "tenancy")
    departments = repo / "tenancy/departments.yaml"
    departments.write_text(departments.read_text().replace("deserved: 56, ", "deserved: 48, "))
    research = repo / "tenancy/projects/research.yaml"
    text = research.read_text()
    end = "overQuotaWeight: 2}"
    at = text.index(end, text.index("name: research-train-h100")) + len(end)
    research.write_text(f"# research: reviewed by the GPU council\n{text[:at]}  # agreed in Q3{text[at:]}")
    git(repo.parent, "init", "-q", "-b", "main", str(repo))
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "tenancy")
    (repo / "notes.txt").write_text("staged\n")
    git(repo, "add", "notes.txt")
    (repo / "tenancy/nodes.yaml").write_text((repo / "tenancy/nodes.yaml").read_text() + "# wip\n")
    return repo


def target(tmp_path: Path, train: str, evaluation: str) -> Path:
    """research.yaml with research-train's and research-eval's h100 gpu guarantee set."""
    text = (ROOT / "examples/tenancy/projects/research.yaml").read_text()
    lines = text.splitlines(keepends=True)
    for name, value in (("research-train-h100", train), ("research-eval-h100", evaluation)):
        i = next(k for k, line in enumerate(lines) if f"name: {name}" in line)
        j = next(k for k in range(i, len(lines)) if "gpu:" in lines[k])
        lines[j] = lines[j].replace("deserved: 8,       ", f"deserved: {value},{' ' * (8 - len(value))}")
    out = tmp_path / f"research-{train}-{evaluation}.yaml"
    out.write_text("".join(lines))
    return out


def plan(repo: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["quotas", "plan", "--repo", str(repo), "--git-ref", "main", "--git-path", "tenancy",
                 *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def state(repo: Path) -> tuple[str, str, str, str]:
    return (git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"),
            git(repo, "diff", "--cached"), git(repo, "diff"))


def test_one_commit_on_a_new_branch_changes_only_the_values(repo: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    before = state(repo)
    code, out, err = plan(repo, capsys, "--to", str(target(tmp_path, "9", "7")), "--branch", "quota-move",
                          "-o", "json")
    assert code == 0, err
    report = json.loads(out)
    assert report["source"]["base"].startswith("git main (")
    assert [s["name"] for s in report["steps"]] == ["research-eval", "research-train"]
    assert state(repo) == before  # HEAD, index and working tree as they were
    assert git(repo, "rev-parse", "quota-move") == report["git"]["commit"] + "\n"
    assert git(repo, "rev-parse", "quota-move^") == before[0]
    assert git(repo, "diff", "--name-only", "main", "quota-move") == "tenancy/projects/research.yaml\n"
    changed = [line for line in git(repo, "diff", "-U0", "main", "quota-move").splitlines()
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == [
        "-        gpu:    {deserved: 8,       limit: 32,  overQuotaWeight: 2}  # agreed in Q3",
        "+        gpu:    {deserved: 9,       limit: 32,  overQuotaWeight: 2}  # agreed in Q3",
        "-        gpu:    {deserved: 8,       limit: 32,  overQuotaWeight: 2}",
        "+        gpu:    {deserved: 7,       limit: 32,  overQuotaWeight: 2}",
    ]
    assert git(repo, "branch", "--list", "quota-move").strip() == "quota-move"
    assert git(repo, "remote") == ""
    # The branch exists now: a second run refuses it and commits nothing.
    code, _, err = plan(repo, capsys, "--to", str(target(tmp_path, "9", "7")), "--branch", "quota-move")
    assert code == 2 and "nothing committed" in err


def test_a_wider_value_keeps_the_columns_after_it(repo: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """research-train 8 -> 10, research-eval 8 -> 6: `limit` stays in its column."""
    code, _, err = plan(repo, capsys, "--to", str(target(tmp_path, "10", "6")), "--branch", "wider")
    assert code == 0, err
    text = git(repo, "show", "wider:tenancy/projects/research.yaml")
    assert "        gpu:    {deserved: 10,      limit: 32,  overQuotaWeight: 2}  # agreed in Q3\n" in text
    assert "        gpu:    {deserved: 6,       limit: 32,  overQuotaWeight: 2}\n" in text
    original = git(repo, "show", "main:tenancy/projects/research.yaml")
    assert [line.split("#", 1)[1] for line in text.splitlines() if "#" in line] == \
        [line.split("#", 1)[1] for line in original.splitlines() if "#" in line] == \
        [" research: reviewed by the GPU council", " agreed in Q3"]


def test_added_departments_and_projects_are_new_documents(repo: Path) -> None:
    """The page's additions (planserve.apply_edits) in git mode: a new Department is a new
    document at the end of the departments' file, a new Project joins the file of its
    department's projects (the first Project file for a new department); the values changed
    beside them are changed in place."""
    from app.quotaview.plan import plan as quota_plan
    from app.quotaview.plan import state_of
    from app.quotaview.plangit import commit_change, read_ref
    from app.quotaview.planserve import apply_edits
    from tests.conftest import RULES

    at_ref = read_ref(repo, "main", ["tenancy"])
    base = [o for _, _, o in at_ref.objects]

    def add(kind: str, name: str, gpu: int, parent: str = "") -> dict[str, object]:
        return {"op": "add", "kind": kind, "name": name, "pool": "h100", "parent": parent,
                "resources": {"gpu": {"guarantee": gpu, "limit": -1, "overQuotaWeight": 1}}}

    target = apply_edits(base, [
        {"kind": "Project", "name": "research-train", "pool": "h100", "resource": "gpu",
         "field": "guarantee", "value": 0},
        {"kind": "Department", "name": "research", "pool": "h100", "resource": "gpu",
         "field": "guarantee", "value": 40},
        add("Department", "audio", 8), add("Project", "audio-asr", 8, "audio"),
        add("Project", "research-new", 0, "research")])
    planned = quota_plan(base, target, RULES, Policy())
    assert planned.ok and [(s.op, s.name) for s in planned.steps] == [
        ("update", "research-train"), ("update", "research"), ("create", "audio"),
        ("create", "audio-asr"), ("create", "research-new")]
    change = commit_change(repo, at_ref, state_of(target)[0], "audio", "add audio")
    assert change.changed_files == ["tenancy/departments.yaml", "tenancy/projects/infra.yaml",
                                    "tenancy/projects/research.yaml"]
    for path, names in (("tenancy/departments.yaml", ["audio"]),
                        ("tenancy/projects/infra.yaml", ["audio-asr"]),
                        ("tenancy/projects/research.yaml", ["research-new"])):
        old, new = git(repo, "show", f"main:{path}"), git(repo, "show", f"audio:{path}")
        docs = list(yaml.safe_load_all(new))
        assert [d["metadata"]["name"] for d in docs[-len(names):]] == names
        assert len(docs) == len(list(yaml.safe_load_all(old))) + len(names)
        wanted = {o["metadata"]["name"]: o for o in target}
        assert all(d == wanted[d["metadata"]["name"]] for d in docs[-len(names):])
    changed = [line for line in git(repo, "diff", "-U0", "main", "audio", "--", "tenancy/departments.yaml",
                                    "tenancy/projects/research.yaml").splitlines()
               if line.startswith("-") and not line.startswith("---")]
    assert changed == [
        "-        gpu:    {deserved: 48,      limit: 64,  overQuotaWeight: 2}",
        "-        gpu:    {deserved: 8,       limit: 32,  overQuotaWeight: 2}  # agreed in Q3"]


def post(url: str, body: dict[str, object]) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_page_over_a_ref_commits_its_plan_on_a_new_branch(repo: Path) -> None:
    """`quotas plan --serve --git-ref`: /api/commit refuses a plan with an error (409, no
    branch), commits one that fits (a new department and its project as new documents,
    the values freed changed in place) on a new branch with HEAD, index and working tree
    untouched, and refuses a branch that exists."""
    before = state(repo)
    server = subprocess.Popen([sys.executable, "-m", "app", "quotas", "plan", "--serve", "--port", "0",
                               "--repo", str(repo), "--git-ref", "main", "--git-path", "tenancy"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("envelope quotas plan: http://127.0.0.1:"), line
        url = line.split()[3].rstrip("/")

        def add(kind: str, name: str, gpu: int, parent: str = "") -> dict[str, object]:
            return {"op": "add", "kind": kind, "name": name, "pool": "h100", "parent": parent,
                    "resources": {"gpu": {"guarantee": gpu, "limit": -1, "overQuotaWeight": 1}}}

        code, judged = post(url + "/api/judge", {"edits": []})
        assert code == 200 and judged["git"] is True
        code, refused = post(url + "/api/commit", {"edits": [add("Department", "audio", 8)],
                                                   "branch": "too-much"})
        assert code == 409 and "cannot be committed while an error stands" in str(refused["error"])
        assert git(repo, "branch", "--list", "too-much") == ""
        edits = [{"kind": "Project", "name": "research-train", "pool": "h100", "resource": "gpu",
                  "field": "guarantee", "value": 0},
                 {"kind": "Department", "name": "research", "pool": "h100", "resource": "gpu",
                  "field": "guarantee", "value": 40},
                 add("Department", "audio", 8), add("Project", "audio-asr", 8, "audio")]
        code, done = post(url + "/api/commit", {"edits": edits, "branch": "page-audio"})
        assert code == 200, done
        assert done["files"] == ["tenancy/departments.yaml", "tenancy/projects/infra.yaml",
                                 "tenancy/projects/research.yaml"]
        assert git(repo, "rev-parse", "page-audio") == f"{done['commit']}\n"
        assert git(repo, "rev-parse", "page-audio^") == before[0]
        assert state(repo) == before
        names = [d["metadata"]["name"] for d in
                 yaml.safe_load_all(git(repo, "show", "page-audio:tenancy/departments.yaml"))]
        assert names[-1] == "audio"
        code, again = post(url + "/api/commit", {"edits": edits, "branch": "page-audio"})
        assert code == 409 and str(again["error"]).startswith("nothing committed: ")
        code, missing = post(url + "/api/commit", {"edits": edits})
        assert code == 400 and "a new local branch" in str(missing["error"])
    finally:
        server.terminate()
        server.communicate(timeout=30)


def test_a_target_that_does_not_pass_commits_nothing(repo: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = plan(repo, capsys, "--to", str(target(tmp_path, "9", "8")), "--branch", "too-much")
    assert code == 1 and "kai-guarantee-sum" in out
    assert git(repo, "branch", "--list", "too-much") == ""


def test_a_file_at_the_ref_that_does_not_parse_is_named(repo: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "tenancy/broken.yaml").write_text("kind: Project\nspec: [\n")
    git(repo, "add", "tenancy/broken.yaml")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "broken")
    code, _, err = plan(repo, capsys, "--to", str(target(tmp_path, "9", "7")), "--branch", "b")
    assert code == 2 and "main:tenancy/broken.yaml:" in err
    code, _, err = main_code(repo, capsys, "--git-ref", "no-such-ref")
    assert code == 2 and "no-such-ref" in err


def main_code(repo: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["quotas", "plan", "--repo", str(repo), "--to", str(repo / "tenancy"), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(("old", "new", "want"), [
    ("{deserved: 8,       limit: 32}", "{deserved: 10,       limit: 32}", "{deserved: 10,      limit: 32}"),
    ("{deserved: 10,      limit: 32}", "{deserved: 9,      limit: 32}", "{deserved: 9,       limit: 32}"),
    ("{deserved: 8, limit: 32}", "{deserved: 10, limit: 32}", "{deserved: 10, limit: 32}"),
    ("a: 8       # why", "a: 10       # why", "a: 10      # why"),
])
def test_realign_keeps_the_next_column(old: str, new: str, want: str) -> None:
    assert realign(old, new) == want
