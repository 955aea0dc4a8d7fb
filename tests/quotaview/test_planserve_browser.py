"""The planner's page (`envelope quotas plan --serve`) in a real browser: headless Chromium
(installed as the quota page's browser test installs it) driven through the DevTools
protocol types an edit that over-reaches, sees the error and the export blocked, fixes
it, and exports the commands. Screenshots go to $ENVELOPE_ARTIFACTS (else the test's tmp
dir), and to docs/img/ with ENVELOPE_DOC_SCREENSHOTS=1.

Marked e2e, as tests/quotaview/test_browser.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cluster.static import load
from app.core.config import Policy
from app.quotaview.planserve import Planner, serve
from tests.conftest import RULES
from tests.helpers.cdp import Browser

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chromium_path() -> str:
    done = subprocess.run(["bash", str(ROOT / "e2e" / "controlplane" / "install-chromium.sh")],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"cannot install chromium: {done.stderr[-2000:]}"
    path = done.stdout.strip().splitlines()[-1]
    os.environ["ENVELOPE_CHROMIUM"] = path
    return path


@pytest.fixture
def page_url(tmp_path: Path) -> Iterator[str]:
    """The planner over the demo tenancy (research at its projects' 48 h100 cards)."""
    tenancy = tmp_path / "tenancy"
    shutil.copytree(ROOT / "examples/tenancy", tenancy)
    departments = tenancy / "departments.yaml"
    departments.write_text(departments.read_text().replace("deserved: 56, ", "deserved: 48, "))
    base = [m.obj for m in load([str(tenancy)]).manifests]
    server, thread = serve(Planner(base, RULES, Policy(), str(tenancy), "2026-12-05T12:00:00Z"), 0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def shots(tmp_path: Path) -> list[Path]:
    out = [Path(os.environ.get("ENVELOPE_ARTIFACTS") or tmp_path)]
    if os.environ.get("ENVELOPE_DOC_SCREENSHOTS"):
        out.append(ROOT / "docs" / "img")
    return out


def edit(browser: Browser, key: str, value: int) -> None:
    browser.js(f"""(() => {{ const i = document.querySelector('input[data-edit="{key}"]');
        i.value = "{value}"; i.dispatchEvent(new Event("change")); return true; }})()""")


def test_an_edit_is_judged_blocked_fixed_and_exported(chromium_path: str, page_url: str,
                                                      tmp_path: Path) -> None:
    with Browser() as browser:
        browser.open(page_url)
        browser.wait("document.body.dataset.ok === 'true'")
        assert "source: " in browser.js("document.getElementById('source').textContent")
        assert "2026-12-05T12:00:00Z" in browser.js("document.getElementById('source').textContent")
        # Bars with named segments, in cards.
        segments = browser.js("[...document.querySelectorAll('section[data-pool=h100] > .bar .seg')]"
                              ".map(s => s.textContent)")
        assert "research 48 cards" in segments and "vision 16 cards" in segments
        # Search: only what matches stays.
        browser.js("(() => { const s = document.getElementById('search'); s.value = 'speech';"
                   " s.dispatchEvent(new Event('input')); return true; })()")
        shown = browser.js("[...document.querySelectorAll('details.dept')].map(d => d.dataset.dept)")
        assert shown == ["speech"]
        # KAI Queue trees too, with their priority: inference-online 150 -> 2.5 is refused.
        browser.js("(() => { const s = document.getElementById('search'); s.value = 'inference';"
                   " s.dispatchEvent(new Event('input')); return true; })()")
        assert browser.js("[...document.querySelectorAll('section[data-queue]')].map(s => s.dataset.queue)") \
            == ["inference"]
        priority = "input[data-edit=\"Queue/inference-online//gpu/priority\"]"
        assert browser.js(f"document.querySelector('{priority}').value") == "150"
        edit(browser, "Queue/inference-online//gpu/priority", 120)
        browser.wait("document.body.dataset.ok === 'true' && !document.getElementById('export').disabled")
        browser.js("(() => { const s = document.getElementById('search'); s.value = 'research';"
                   " s.dispatchEvent(new Event('input')); return true; })()")

        # research-train 8 -> 9: the department has no card spare.
        edit(browser, "Project/research-train/h100/gpu/guarantee", 9)
        browser.wait("document.body.dataset.ok === 'false'")
        errors = browser.js("[...document.querySelectorAll('#errors li')].map(e => e.textContent)")
        assert errors[0].startswith("over-reached: Project research-train: kai-guarantee-sum: ")
        assert "49 cards in total but the department has 48 cards" in errors[0]
        assert len(errors) == 1 and "the same sum is reported on research-bench" in errors[0]
        over = browser.js("[...document.querySelectorAll('details[data-dept=research] .bar .seg.over')]"
                          ".map(s => s.textContent)")
        assert over == ["research-train over by 1 card"]
        assert browser.js("document.getElementById('export').disabled") is True
        refused = browser.js("fetch('/api/export', {method: 'POST', body: JSON.stringify({edits: "
                             "[{kind: 'Project', name: 'research-train', pool: 'h100', resource: 'gpu',"
                             " field: 'guarantee', value: 9}]})}).then(r => r.status)")
        assert refused == 409
        for where in shots(tmp_path):
            browser.screenshot(where / "quotaplan-error.png")

        # research-eval 8 -> 7: it fits; export the commands.
        edit(browser, "Project/research-eval/h100/gpu/guarantee", 7)
        browser.wait("document.body.dataset.ok === 'true'")
        assert browser.js("document.getElementById('export').disabled") is False
        browser.js("document.getElementById('export').click() || true")
        browser.wait("document.getElementById('commands').dataset.status === '200'")
        text = browser.js("document.getElementById('commands').textContent")
        commands = [line for line in text.splitlines() if line.startswith("kubectl ")]
        names = [c.split()[3] for c in commands]
        assert sorted(names) == ["inference-online", "research-eval", "research-train"]
        assert names.index("research-eval") < names.index("research-train")
        queue = commands[names.index("inference-online")]
        assert '{"op":"replace","path":"/spec/priority","value":120}' in queue
        assert json.loads(commands[names.index("research-train")].split(" -p ", 1)[1].strip("'"))[-1] == {
            "op": "replace", "path": "/spec/queues/0/resources/gpu/deserved", "value": 9}
        for where in shots(tmp_path):
            browser.screenshot(where / "quotaplan-fits.png")


def add_with_form(browser: Browser, form: str, name: str, guarantee: int) -> None:
    browser.js(f"""(() => {{ const f = document.querySelector('form[data-add="{form}"]');
        f.elements.name.value = "{name}"; f.elements.guarantee.value = "{guarantee}";
        f.requestSubmit(); return true; }})()""")


def test_a_department_and_a_project_are_added_judged_and_exported(chromium_path: str, page_url: str,
                                                                  tmp_path: Path) -> None:
    """A new department on the full h100 pool is refused naming it and blocks the export; a
    bad name is refused at once and not kept; research gives 8 cards back, a project is
    added to the new department, and the export creates the department before its project,
    after the writes that free the cards."""
    with Browser() as browser:
        browser.open(page_url)
        browser.wait("document.body.dataset.ok === 'true'")
        add_with_form(browser, "Department/h100", "audio", 8)
        browser.wait("document.body.dataset.ok === 'false'")
        errors = browser.js("[...document.querySelectorAll('#errors li')].map(e => e.textContent)")
        assert errors[0].startswith("over-reached: Department audio: kai-pool-capacity: ")
        assert "(this one 8 cards) but the pool's 12 nodes have 96 cards" in errors[0]
        over = browser.js("[...document.querySelectorAll('section[data-pool=h100] > .bar .seg.over')]"
                          ".map(s => s.textContent)")
        assert over == ["audio over by 8 cards"]
        assert browser.js("document.getElementById('export').disabled") is True
        assert browser.js("[...document.querySelectorAll('#added li')].map(l => l.dataset.added)") == [
            "add/Department/audio/h100"]

        add_with_form(browser, "Department/h100", "Audio_1", 1)
        browser.wait("document.getElementById('status').hasAttribute('data-refused')")
        assert "lower-case letters" in browser.js("document.getElementById('status').textContent")

        judged = browser.js("document.body.dataset.judged")
        edit(browser, "Project/research-train/h100/gpu/guarantee", 0)
        browser.wait(f"document.body.dataset.judged !== '{judged}'")
        assert browser.js("document.body.dataset.ok") == "false"  # the pool is still full
        edit(browser, "Department/research/h100/gpu/guarantee", 40)
        browser.wait("document.body.dataset.ok === 'true'")
        assert browser.js("[...document.querySelectorAll('#added li')].map(l => l.dataset.added)") == [
            "add/Department/audio/h100"]  # the refused name was not kept
        add_with_form(browser, "Project/audio/h100", "audio-asr", 8)
        browser.wait("document.body.dataset.ok === 'true' && document.querySelector("
                     "'details[data-dept=audio] tr[data-name=\"audio-asr\"]') !== null")
        segments = browser.js("[...document.querySelectorAll('details[data-dept=audio] .bar .seg')]"
                              ".map(s => s.textContent)")
        assert segments == ["audio-asr 8 cards"]
        for where in shots(tmp_path):
            browser.screenshot(where / "quotaplan-added.png")
        browser.js("document.getElementById('export').click() || true")
        browser.wait("document.getElementById('commands').dataset.status === '200'")
        text = browser.js("document.getElementById('commands').textContent")
        commands = [line for line in text.splitlines() if line.startswith("kubectl ")]
        assert [c.split()[1:4] for c in commands[:2]] == [
            ["patch", "projects.kai.resources", "research-train"],
            ["patch", "departments.kai.resources", "research"]]
        created = [json.loads(part.split("\nEOF")[0]) for part in text.split("<<'EOF'\n")[1:]]
        assert [(o["kind"], o["metadata"]["name"], o["spec"].get("parent")) for o in created] == [
            ("Department", "audio", None), ("Project", "audio-asr", "audio")]
        assert created[1]["spec"]["queues"][0]["resources"]["gpu"] == {"deserved": 8, "limit": -1,
                                                                      "overQuotaWeight": 1}


def test_over_a_git_ref_the_page_commits_its_plan_on_a_new_branch(chromium_path: str, tmp_path: Path) -> None:
    """`--serve --git-ref`: the page offers a commit once the plan fits; Chromium frees 8
    cards, adds a department, commits on a new branch; the branch holds the new document,
    HEAD and the working tree are as they were."""
    import sys

    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "examples/tenancy", repo / "tenancy")
    departments = repo / "tenancy/departments.yaml"
    departments.write_text(departments.read_text().replace("deserved: 56, ", "deserved: 48, "))

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                              check=True).stdout

    git("init", "-q", "-b", "main")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "tenancy")
    head = git("rev-parse", "HEAD")
    server = subprocess.Popen([sys.executable, "-m", "app", "quotas", "plan", "--serve", "--port", "0",
                               "--repo", str(repo), "--git-ref", "main", "--git-path", "tenancy"],
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[3]
        with Browser() as browser:
            browser.open(url)
            browser.wait("document.body.dataset.ok === 'true'")
            assert browser.js("document.getElementById('commit').classList.contains('hidden')") is False
            add_with_form(browser, "Department/h100", "audio", 8)
            browser.wait("document.body.dataset.ok === 'false'")
            assert browser.js("document.getElementById('commit-button').disabled") is True
            edit(browser, "Project/research-train/h100/gpu/guarantee", 0)
            edit(browser, "Department/research/h100/gpu/guarantee", 40)
            browser.wait("document.body.dataset.ok === 'true' && "
                         "!document.getElementById('commit-button').disabled")
            browser.js("(() => { document.getElementById('branch').value = 'page-audio';"
                       " document.getElementById('commit').requestSubmit(); return true; })()")
            browser.wait("document.getElementById('commands').dataset.status === '200'")
            text = browser.js("document.getElementById('commands').textContent")
        assert text.startswith("committed ") and "on new branch page-audio" in text
        assert "+  name: audio" in text
        assert git("rev-parse", "page-audio^") == head and git("rev-parse", "HEAD") == head
        assert git("status", "--porcelain") == ""
        assert "name: audio" in git("show", "page-audio:tenancy/departments.yaml")
    finally:
        server.terminate()
        server.communicate(timeout=30)
