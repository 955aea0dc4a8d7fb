"""Running the `envelope` command line as a user would."""

from __future__ import annotations

import subprocess
import sys


def envelope(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", *args], input=stdin, text=True,
                          capture_output=True, timeout=60)
