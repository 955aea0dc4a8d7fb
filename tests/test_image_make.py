"""``make image`` picks a builder that works and says why when none does (issue 26).

A real build needs a registry serving the pinned base image, which this machine does
not reach; docs/deploy.md records the build made here with buildah on a local base.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: What the Makefile itself runs outside the image recipe (the venv stamp, the version).
TOOLS = ("make", "sh", "bash", "sed", "cksum", "cut", "env")


def _path_without_builders(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.fail(f"{tool} is missing on this machine")
        (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _make_image(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-s", "--no-print-directory", "image", *args], cwd=REPO,
                          env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=60,
                          check=False)


def test_no_builder_says_what_was_tried(tmp_path: Path) -> None:
    proc = _make_image(_path_without_builders(tmp_path))
    assert proc.returncode != 0
    assert ("make image: no image builder works here: docker(not installed) podman(not installed) "
            "buildah(not installed)") in proc.stderr, proc.stderr


def test_a_docker_client_without_an_engine_is_passed_over(tmp_path: Path) -> None:
    """A docker CLI with no daemon (as on this machine) is not a builder."""
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "info"], capture_output=True, check=False).returncode == 0:
        pytest.skip("needs a docker client without a running engine")
    path = _path_without_builders(tmp_path)
    (Path(path) / "docker").symlink_to(docker)
    proc = _make_image(path)
    assert proc.returncode != 0
    assert "docker(no engine: docker info failed) podman(not installed)" in proc.stderr, proc.stderr


def test_the_version_and_image_come_from_pyproject() -> None:
    proc = subprocess.run(["make", "-s", "--no-print-directory", "-n", "image", "IMAGE_BUILDER=buildah"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "envelope:0.1.0" in proc.stdout
