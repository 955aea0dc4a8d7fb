"""requirements.lock: what the image installs, pinned with hashes (issue 26, class 6).

The Dockerfile installs the lock with ``pip --require-hashes --no-deps`` and then
Envelope itself with ``--no-deps``, so the lock alone decides which code ships. These
tests fail when it no longer matches pyproject.toml (regenerate with ``make lock``).
``make run``/``test``/``install`` install it and requirements-test.lock (the [test]
extra's other packages) the same way (issue 35), and the last tests hold them to that.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements.lock"
#: The [test] extra's packages that requirements.lock does not pin (make lock).
TEST_LOCK = REPO / "requirements-test.lock"
#: The image's interpreter and platform (python:3.11-slim on Linux).
IMAGE_ENV = {**default_environment(), "python_version": "3.11", "python_full_version": "3.11.11",
             "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
             "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def _pins(lock: Path = LOCK, env: dict[str, str] = IMAGE_ENV) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes), for the entries whose marker holds in ``env`` (the image's)."""
    text = lock.read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
    pins: dict[str, tuple[str, list[str]]] = {}
    for entry in entries:
        head = entry.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        req = Requirement(head)
        if req.marker is not None and not req.marker.evaluate(env):
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


# -- the venv `make run` and `make test` use is the locks (issue 35) ------------------------

def test_the_test_lock_pins_the_test_extra_with_hashes_and_nothing_the_image_lock_pins() -> None:
    project = _pyproject()
    shipped, test_only = _pins(), _pins(TEST_LOCK)
    assert test_only and [n for n, (_, hashes) in test_only.items() if not hashes] == []
    assert set(shipped) & set(test_only) == set(), "pinned twice: run make lock"
    both = {**shipped, **test_only}
    for line in project["project"]["optional-dependencies"]["test"]:  # type: ignore[index]
        req = Requirement(line)
        name = canonicalize_name(req.name)
        assert name in both, f"{req} is in no lock: run make lock"
        assert req.specifier.contains(both[name][0], prereleases=True), \
            f"the locks pin {name}=={both[name][0]}, outside pyproject's {req}: run make lock"


def test_this_venv_runs_the_locked_versions() -> None:
    """What the tests run (uvicorn's internals in test_httplimits_uvicorn_canary.py above
    all) is what the image ships: every package either lock pins for this platform is
    installed at its pin. Fails in a venv made by ``pip install -e .[test]`` or moved by
    ``pip install -U``; ``make install`` puts it back."""
    here = default_environment()
    wrong = {}
    for name, (version, _) in {**_pins(LOCK, here), **_pins(TEST_LOCK, here)}.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "not installed"
        if installed != version:
            wrong[name] = f"{installed}, locked {version}"
    assert wrong == {}, f"this venv is not the locks (run make install): {wrong}"


def test_make_installs_the_locks_with_hashes_and_nothing_else() -> None:
    text = re.sub(r"\\\n\s*", " ", (REPO / "Makefile").read_text())
    assert "LOCKS := requirements.lock requirements-test.lock" in text
    assert "pip install -q --require-hashes --no-deps -r requirements.lock -r requirements-test.lock" in text
    assert "pip install -q --no-deps --no-build-isolation -e ." in text
    assert "pip check" in text
    for target in ("run", "test", "unit", "e2e", "install", "lint"):
        assert re.search(rf"(?m)^{target}:.*\$\(STAMP\)", text) or \
            re.search(rf"(?m)^{target}: lint", text), f"make {target} does not install the locks first"


def _stamp(tree: Path) -> str:
    out = subprocess.run(["make", "-n", "--no-print-directory", "install", "VENV=v"], cwd=tree,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    (stamp,) = set(re.findall(r"v/\.installed-(\d+)", out))
    return stamp


@pytest.mark.parametrize("changed", ["pyproject.toml", "requirements.lock", "requirements-test.lock"])
def test_a_changed_lock_reinstalls(tmp_path: Path, changed: str) -> None:
    """The venv stamp is named after pyproject.toml and both locks: a pull that changes
    the lock reinstalls on the next ``make run`` (before, only pyproject.toml counted)."""
    for name in ("Makefile", "pyproject.toml", "requirements.lock", "requirements-test.lock"):
        shutil.copy(REPO / name, tmp_path / name)
    (tmp_path / "e2e" / "controlplane").mkdir(parents=True)
    shutil.copy(REPO / "e2e" / "controlplane" / "versions.env", tmp_path / "e2e" / "controlplane")
    before = _stamp(tmp_path)
    with (tmp_path / changed).open("a") as f:
        f.write("# changed\n")
    assert _stamp(tmp_path) != before
