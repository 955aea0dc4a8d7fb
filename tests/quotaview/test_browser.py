"""`envelope quotas -o html` in a real browser: headless Chromium (the Debian package,
installed by e2e/controlplane/install-chromium.sh when missing) loads the page from a
file, and the test reads the DOM it rendered: every pool, department and project of the
tree is there, the over-committed ones marked; a screenshot is saved as an artifact
($ENVELOPE_ARTIFACTS, else the test's tmp dir).

Marked e2e: it runs in `make test` (the e2e half) next to the control-plane tests."""

from __future__ import annotations

import json
import os
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from app.quotaview.browser import dump_dom, screenshot

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
TENANCY = ROOT / "examples" / "tenancy"
SMALL = ROOT / "tests" / "data" / "quotaview-small.yaml"


@pytest.fixture(scope="module")
def browser(pytestconfig: pytest.Config) -> str:
    done = subprocess.run(["bash", str(ROOT / "e2e" / "controlplane" / "install-chromium.sh")],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, f"cannot install chromium: {done.stderr[-2000:]}"
    path = done.stdout.strip().splitlines()[-1]
    os.environ["ENVELOPE_CHROMIUM"] = path
    return path


def envelope(*args: str) -> str:
    import sys

    done = subprocess.run([sys.executable, "-m", "app", "quotas", *args], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


class Marked(HTMLParser):
    """The elements with data-kind: (kind, name) -> data-over, and visible text."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[tuple[str, str], str] = {}
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("data-kind") and a.get("data-name") is not None and "data-over" in a:
            self.found[(str(a["data-kind"]), str(a["data-name"]))] = str(a["data-over"])

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def expected(report: dict[str, Any]) -> dict[tuple[str, str], bool]:
    out: dict[tuple[str, str], bool] = {}

    def walk(node: dict[str, Any]) -> None:
        key = (node["kind"], node["name"])
        out[key] = out.get(key, False) or node["overCommitted"]
        for child in node["children"]:
            walk(child)

    for pool in report["pools"]:
        out[("pool", pool["name"])] = pool["overCommitted"]
        for node in pool["departments"] + pool["uncapped"]:
            walk(node)
    for root in report["queues"]:
        walk(root)
    return out


def rendered(page: Path) -> Marked:
    dom = dump_dom(page)
    assert "</body></html>" in dom.replace("\n", "")
    parsed = Marked()
    parsed.feed(dom)
    return parsed


def artifacts(tmp_path: Path) -> Path:
    where = Path(os.environ.get("ENVELOPE_ARTIFACTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.mark.parametrize("source", [TENANCY, SMALL], ids=["demo-tenancy", "small"])
def test_every_pool_department_and_project_is_rendered_and_marked(
        browser: str, source: Path, tmp_path: Path) -> None:
    report = json.loads(envelope(str(source), "-o", "json"))
    page = tmp_path / "quotas.html"
    page.write_text(envelope(str(source), "-o", "html"))
    dom = rendered(page)
    want = expected(report)
    assert want and set(dom.found) >= set(want)
    marked = {k for k, v in dom.found.items() if v == "true"}
    assert marked == {k for k, over in want.items() if over}
    assert marked  # both sources have an over-committed pool or department
    kinds = {k for k, _ in want}
    assert {"pool", "Department", "Project"} <= kinds
    shot = artifacts(tmp_path) / f"quotas-{source.stem}.png"
    envelope(str(source), "-o", "html", "--screenshot", str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_the_demo_over_commit_is_visible_text(browser: str, tmp_path: Path) -> None:
    page = tmp_path / "quotas.html"
    page.write_text(envelope(str(TENANCY), "-o", "html"))
    started = time.monotonic()
    dom = rendered(page)
    assert time.monotonic() - started < 60
    text = " ".join(" ".join(dom.text).split())
    assert "pool h100" in text and "over-committed by 8 cards" in text
    assert "kai-pool-capacity" in text


def test_screenshot_of_a_page_file(browser: str, tmp_path: Path) -> None:
    page = tmp_path / "p.html"
    page.write_text(envelope(str(SMALL), "-o", "html"))
    out = screenshot(page, artifacts(tmp_path) / "quotas-file.png", width=800, height=600)
    assert out.read_bytes()[:4] == b"\x89PNG"
