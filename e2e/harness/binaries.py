"""Where etcd, kube-apiserver, kube-scheduler, kubectl and helm are found:
``$ENVELOPE_CONTROLPLANE_BIN``, else built (and cached) by ``e2e/controlplane/build.sh``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

from .base import BIN_ENV, BINARIES, BUILD_SCRIPT, REPO_ROOT, HarnessError


def _binaries_missing(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def locate_bin_dir(*, build_output: IO[str] | None = None) -> Path:
    """Directory holding etcd, kube-apiserver, kubectl and helm.

    ``$ENVELOPE_CONTROLPLANE_BIN`` if set; otherwise run
    ``e2e/controlplane/build.sh`` (a no-op when its cache is warm, a long build
    when cold), writing its progress to ``build_output`` (default: stderr).
    Raises HarnessError with a clear message when that is impossible.
    """
    override = os.environ.get(BIN_ENV)
    if override:
        bin_dir = Path(override).expanduser()
        missing = _binaries_missing(bin_dir)
        if missing:
            raise HarnessError(
                f"${BIN_ENV}={override} lacks executable(s): {', '.join(missing)}. "
                f"Unset it to build them with {BUILD_SCRIPT.relative_to(REPO_ROOT)}."
            )
        return bin_dir
    if shutil.which("go") is None:
        raise HarnessError(
            "The e2e control plane (etcd, kube-apiserver, kubectl, helm) is not "
            f"available: ${BIN_ENV} is not set and the Go toolchain ('go') is not on "
            f"PATH, so {BUILD_SCRIPT.relative_to(REPO_ROOT)} cannot build it. Install Go "
            f">= 1.25, or point ${BIN_ENV} at a directory holding the four binaries."
        )
    out = build_output if build_output is not None else sys.stderr
    try:
        out.flush()
        stderr: IO[str] | int = out if out.fileno() >= 0 else subprocess.PIPE
    except (AttributeError, OSError, ValueError):  # e.g. a capture buffer: no fd
        stderr = subprocess.PIPE
    proc = subprocess.run(
        ["bash", str(BUILD_SCRIPT)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        check=False,
        cwd=REPO_ROOT,
    )
    if proc.stderr:
        out.write(proc.stderr)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise HarnessError(
            f"{BUILD_SCRIPT.relative_to(REPO_ROOT)} failed with exit code {proc.returncode}; "
            "see its output above and the build logs under "
            "${ENVELOPE_CONTROLPLANE_DIR:-~/.cache/envelope/controlplane}/<key>/logs/."
            + ("\n" + "\n".join(proc.stderr.splitlines()[-30:]) if proc.stderr else "")
        )
    bin_dir = Path(lines[-1])
    missing = _binaries_missing(bin_dir)
    if missing:
        raise HarnessError(f"build.sh reported {bin_dir}, which lacks {', '.join(missing)}")
    return bin_dir




GITOPSDIFF_BUILD = REPO_ROOT / "e2e" / "controlplane" / "build-gitopsdiff.sh"
GITOPSDIFF_MODES = ("legacy", "structured-merge", "server-side", "server-side+mutation")
"""Argo CD's diff modes e2e/gitopsdiff runs (``gitopsdiff diff`` reports each)."""


def gitopsdiff_binary() -> Path:
    """Argo CD's diff and sync code built from its Go module (e2e/gitopsdiff, cached by
    build-gitopsdiff.sh), or ``$ENVELOPE_GITOPSDIFF_BIN``."""
    override = os.environ.get("ENVELOPE_GITOPSDIFF_BIN")
    if override:
        return Path(override) / "gitopsdiff"
    done = subprocess.run(["bash", str(GITOPSDIFF_BUILD)], capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise HarnessError(f"{GITOPSDIFF_BUILD.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "gitopsdiff"
