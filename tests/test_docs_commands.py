"""The commands the docs show, run: what a page says a command prints is what it prints.

- Every ```console block of README.md, examples/README.md and docs/*.md: each ``$ cmd``
  line runs in bash (``envelope`` is this checkout's, the working directory is the
  repository or the ``<!-- cwd: DIR -->`` line before the block) and must print exactly
  the lines that follow it; ``$ echo $?`` prints the previous command's exit status. A
  block that needs a cluster says so in a ``<!-- not run: why -->`` line and is skipped.
- The README's and examples/README.md's ```sh lines that run ``envelope check`` on files
  in the repository must run (exit 0 or 1, never a usage or input error), and
  ``make_tenancy.py`` must write exactly the committed ``examples/tenancy/``.
"""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "examples" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    text: str
    cwd: Path
    skip: str | None


def blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            match = re.match(r"^```(\w+)\s*$", lines[i])
            if not match:
                i += 1
                continue
            start = i
            i += 1
            while i < len(lines) and lines[i] != "```":
                i += 1
            before = lines[start - 1] if start else ""
            cwd = re.match(r"<!-- cwd: (\S+) -->", before)
            skip = re.match(r"<!-- not run: (.+) -->", before)
            found.append(Block(page, start + 1, match[1], "\n".join(lines[start + 1:i]),
                               ROOT / cwd[1] if cwd else ROOT, skip[1] if skip else None))
            i += 1
    return found


def sh(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "100"}
    env.pop("ENVELOPE_CONFIG", None)
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


CONSOLE = [b for b in blocks() if b.lang == "console"]


def test_the_console_blocks_are_found() -> None:
    assert len(CONSOLE) >= 4
    assert all(b.skip for b in CONSOLE if "--kubeconfig" in b.text), "a cluster is not here"


@pytest.mark.parametrize("block", CONSOLE, ids=lambda b: f"{b.page.name}:{b.line}")
def test_console_blocks_print_what_they_show(block: Block) -> None:
    if block.skip:
        pytest.skip(block.skip)
    steps: list[tuple[str, list[str]]] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            assert steps, f"{block.page}:{block.line}: output before any command"
            steps[-1][1].append(line)
    status = 0
    for command, expected in steps:
        if command == "echo $?":
            assert expected == [str(status)], f"{block.page}:{block.line}"
            continue
        out = sh(command, block.cwd)
        status = out.returncode
        assert out.stdout.rstrip("\n").splitlines() == expected, \
            f"{block.page}:{block.line}: `{command}` printed:\n{out.stdout}{out.stderr}"


def sh_lines() -> list[tuple[Block, str]]:
    return [(b, line.split("#", 1)[0].strip()) for b in blocks() if b.lang == "sh"
            and b.page in (ROOT / "README.md", ROOT / "examples" / "README.md")
            for line in b.text.splitlines() if line.startswith(".venv/bin/")]


def test_the_readme_check_commands_run() -> None:
    ran = 0
    for block, command in sh_lines():
        if not command.startswith(".venv/bin/envelope check") or "|" in command:
            continue
        out = sh(command.replace(".venv/bin/", ""), ROOT)
        assert out.returncode in (0, 1), f"{block.page}:{block.line}: {command}: {out.stderr}"
        ran += 1
    assert ran >= 1


def test_make_tenancy_writes_the_committed_examples(tmp_path: Path) -> None:
    commands = [c for _, c in sh_lines() if "make_tenancy.py" in c]
    assert ".venv/bin/python examples/make_tenancy.py" in commands
    out = sh(f"{sys.executable} examples/make_tenancy.py --out {tmp_path}", ROOT)
    assert out.returncode == 0, out.stderr
    compared = filecmp.dircmp(ROOT / "examples" / "tenancy", tmp_path)

    def differences(c: filecmp.dircmp[str]) -> list[str]:
        found = [*c.diff_files, *c.left_only, *c.right_only]
        for sub in c.subdirs.values():
            found += differences(sub)
        return found

    assert differences(compared) == [], "examples/tenancy/ is not what make_tenancy.py writes"
