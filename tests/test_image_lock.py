"""requirements.lock: what the image installs, pinned with hashes (issue 26, class 6).

The Dockerfile installs the lock with ``pip --require-hashes --no-deps`` and then
Envelope itself with ``--no-deps``, so the lock alone decides which code ships. These
tests fail when it no longer matches pyproject.toml (regenerate with ``make lock``).
"""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements.lock"
#: The image's interpreter and platform (python:3.11-slim on Linux).
IMAGE_ENV = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.11",
             "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def _pins() -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes), for the entries whose marker holds in the image."""
    text = LOCK.read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    pins: dict[str, tuple[str, list[str]]] = {}
    for entry in entries:
        head = entry.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        req = Requirement(head)
        if req.marker is not None and not req.marker.evaluate(IMAGE_ENV):
            continue
        (spec,) = req.specifier
        assert spec.operator == "==", head
        pins[canonicalize_name(req.name)] = (spec.version, re.findall(r"--hash=sha256:([0-9a-f]{64})", entry))
    return pins


def _pyproject() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_pin_has_a_hash() -> None:
    pins = _pins()
    assert len(pins) > 20
    assert [name for name, (_, hashes) in pins.items() if not hashes] == []


def test_the_lock_satisfies_pyproject_and_the_build_backend() -> None:
    project = _pyproject()
    wanted = [Requirement(r) for r in project["project"]["dependencies"]]  # type: ignore[index]
    wanted += [Requirement(r) for r in project["build-system"]["requires"]]  # type: ignore[index]
    pins = _pins()
    for req in wanted:
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements.lock: run make lock"
        version = pins[name][0]
        assert req.specifier.contains(version, prereleases=True), \
            f"requirements.lock pins {name}=={version}, outside pyproject's {req}: run make lock"


def test_the_lock_is_closed_under_the_dependencies_it_pins() -> None:
    """Each pinned package's own requirements (as installed here, when the version is the
    same) are pinned too: ``--no-deps`` would otherwise ship an image missing one."""
    pins = _pins()
    checked = 0
    for name, (version, _) in pins.items():
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if dist.version != version:
            continue
        checked += 1
        extras = {"standard"} if name == "uvicorn" else set()  # pyproject asks uvicorn[standard]
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                    req.marker.evaluate({**IMAGE_ENV, "extra": extra}) for extra in extras | {""}):
                continue
            assert canonicalize_name(req.name) in pins, f"{name} {version} needs {req}, not in the lock"
    assert checked >= 10, f"only {checked} pinned packages are installed here at their pinned version"


def test_the_dockerfile_installs_the_lock_and_nothing_else() -> None:
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    assert "COPY requirements.lock ./" in text
    assert "pip install --no-compile --require-hashes --no-deps -r requirements.lock" in text
    assert "pip install --no-compile --no-deps --no-build-isolation ." in text
    assert "pip check" in text
