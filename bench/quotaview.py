"""Cost of `envelope quotas` on the 10,000-project benchmark tenancy.

Run by hand (``.venv/bin/python bench/quotaview.py``), not in the test suite. Writes the
tenancy with ``examples/make_tenancy.py --scale 1000`` (16,050 objects: 50 pools, 1,000
departments, 10,000 projects, 5,000 Nodes) and, each as a fresh process, times in CPU
seconds (user + system of the child; on a shared machine CPU is the comparable number):
``envelope check -o json`` (the reference), ``envelope quotas`` text, html, json and
text ``--no-findings``; then the size of the html page and Chromium's load of it
(``--dump-dom``) and a screenshot. Target: the tree renders in under 5 s CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVELOPE = [sys.executable, "-m", "app"]


def timed(command: list[str], out: Path | None = None) -> tuple[float, float]:
    """(CPU s of the child, wall s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(out or os.devnull, "wb") as sink:
        subprocess.run(command, stdout=sink, stderr=subprocess.DEVNULL, cwd=ROOT, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, wall)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scale", type=int, default=1000)
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envelope-quotaview-") as tmp:
        tenancy = Path(tmp) / "tenancy"
        subprocess.run([sys.executable, str(ROOT / "examples" / "make_tenancy.py"), "--scale",
                        str(args.scale), "--out", str(tenancy)], check=True, capture_output=True)
        page = Path(tmp) / "quotas.html"
        cases = {
            "check -o json": [*ENVELOPE, "check", str(tenancy), "-o", "json"],
            "quotas (text)": [*ENVELOPE, "quotas", str(tenancy)],
            "quotas -o html": [*ENVELOPE, "quotas", str(tenancy), "-o", "html"],
            "quotas -o json": [*ENVELOPE, "quotas", str(tenancy), "-o", "json"],
            "quotas --no-findings": [*ENVELOPE, "quotas", str(tenancy), "--no-findings"],
        }
        print(f"load average {os.getloadavg()[0]:.1f}")
        print("| case | CPU s | wall s |\n|---|---|---|")
        for _ in range(args.rounds):
            for name, command in cases.items():
                cpu, wall = timed(command, page if "html" in name else None)
                print(f"| {name} | {cpu:.2f} | {wall:.1f} |", flush=True)
        print(f"html page: {page.stat().st_size / 1e6:.1f} MB; load average "
              f"{os.getloadavg()[0]:.1f}")
        if args.no_browser:
            return 0
        sys.path.insert(0, str(ROOT))
        from app.quotaview.browser import dump_dom, screenshot

        started = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        dom = dump_dom(page)
        projects = dom.count('data-kind="Project"')
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"chromium --dump-dom: {time.monotonic() - started:.1f} s wall, "
              f"{after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime:.1f} s CPU, "
              f"{projects} projects in the DOM, "
              f"{dom.count('<details open')} of {dom.count('<details')} details open")
        started = time.monotonic()
        screenshot(page, Path(tmp) / "quotas.png")
        print(f"chromium screenshot: {time.monotonic() - started:.1f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())
