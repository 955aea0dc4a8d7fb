"""Headless Chromium (the Debian ``chromium`` package) for ``envelope quotas --screenshot``
and the browser test: load a page from a file, return the DOM after it rendered, or save
a screenshot. One process per call, a throw-away profile, no network needed (the page
fetches nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["BrowserError", "chromium", "dump_dom", "screenshot"]

NAMES = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")


class BrowserError(RuntimeError):
    """No browser, or it failed."""


def chromium() -> str:
    """The browser binary: $ENVELOPE_CHROMIUM, else the first of :data:`NAMES` on PATH."""
    given = os.environ.get("ENVELOPE_CHROMIUM")
    if given:
        return given
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise BrowserError("no chromium on PATH (apt-get install chromium, or "
                       "bash e2e/controlplane/install-chromium.sh; or set ENVELOPE_CHROMIUM)")


def _run(page: Path, flags: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    with tempfile.TemporaryDirectory(prefix="envelope-chromium-") as profile:
        command = [chromium(), "--headless", "--disable-gpu", "--no-first-run",
                   "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                   f"--user-data-dir={profile}", *flags, page.resolve().as_uri()]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            command.insert(1, "--no-sandbox")  # Chromium refuses its sandbox as root
        try:
            done = subprocess.run(command, capture_output=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BrowserError(f"chromium did not finish in {timeout:g} s") from exc
        except OSError as exc:
            raise BrowserError(f"cannot run chromium: {exc}") from exc
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise BrowserError(f"chromium exited {done.returncode}: {' / '.join(tail)}")
    return done


def dump_dom(page: Path, timeout: float = 120) -> str:
    """The page's DOM as Chromium serializes it after loading (``--dump-dom``)."""
    return _run(page, ["--dump-dom"], timeout).stdout.decode()


def screenshot(html: str | Path, out: Path, width: int = 1280, height: int = 900,
               timeout: float = 120) -> Path:
    """Save a PNG of the page (an HTML string or a file) at ``width`` x ``height``."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="envelope-page-") as tmp:
        page = Path(html) if isinstance(html, Path) else Path(tmp) / "quotas.html"
        if not isinstance(html, Path):
            page.write_text(html)
        _run(page, [f"--screenshot={out}", f"--window-size={width},{height}",
                    "--hide-scrollbars"], timeout)
    if not out.is_file() or out.stat().st_size == 0:
        raise BrowserError(f"chromium wrote no screenshot to {out}")
    return out
