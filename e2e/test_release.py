"""``make release`` (issue 35, point 7): the chart package, the SBOM of the image's Python
packages, SHA256SUMS and its signature with a caller's key, verified here independently
of the Makefile (the ``cryptography`` library, hashlib) and installed from the package on
the e2e API server.

The image itself (an OCI archive by buildah, several minutes) is left out here with
``RELEASE_IMAGE=0``: ``make release`` builds it (docs/deploy.md, "Release" records the
run and its numbers)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from harness import Cluster

REPO = Path(__file__).resolve().parent.parent
VERSION = re.search(r'(?m)^version = "(.+)"', (REPO / "pyproject.toml").read_text())[1]  # type: ignore[index]
RELEASE = "release-e2e"


def _make(*args: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900, check=False,
                          env={**os.environ, "ENVELOPE_CONTROLPLANE_BIN": str(bin_dir)})


def _lock_pins() -> dict[str, str]:
    text = (REPO / "requirements.lock").read_text()
    return {name.lower(): version for name, version in
            re.findall(r"(?m)^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)", text)}


def test_release_artifacts_verify_and_the_chart_package_installs(
        cluster: Cluster, tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    key_file = tmp_path / "key.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    dist = tmp_path / "dist"
    made = _make("release", f"RELEASE_KEY={key_file}", "RELEASE_IMAGE=0", f"DIST={dist}",
                 bin_dir=cluster.bin_dir)
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    chart, sbom = dist / f"envelope-{VERSION}.tgz", dist / f"envelope-{VERSION}.sbom.cdx.json"

    # The signature, with the caller's key (not the public key the release wrote).
    sums = (dist / "SHA256SUMS").read_bytes()
    key.public_key().verify((dist / "SHA256SUMS.sig").read_bytes(), sums, ec.ECDSA(hashes.SHA256()))
    # The checksums: every artifact, each right.
    listed = dict(reversed(line.split("  ", 1)) for line in sums.decode().splitlines())
    assert sorted(listed) == sorted([chart.name, sbom.name])
    for name, digest in listed.items():
        assert hashlib.sha256((dist / name).read_bytes()).hexdigest() == digest, name

    # make verify-release fails on a changed artifact and on a changed SHA256SUMS.
    assert _make("verify-release", f"DIST={dist}", bin_dir=cluster.bin_dir).returncode == 0
    original = chart.read_bytes()
    chart.write_bytes(original + b"\0")
    assert _make("verify-release", f"DIST={dist}", bin_dir=cluster.bin_dir).returncode != 0
    chart.write_bytes(original)
    # the same files named otherwise: the checksums hold, the signature does not
    (dist / "SHA256SUMS").write_bytes(sums.replace(b"  ", b"  ./", 1))
    assert _make("verify-release", f"DIST={dist}", bin_dir=cluster.bin_dir).returncode != 0
    (dist / "SHA256SUMS").write_bytes(sums)

    # The SBOM: CycloneDX, every package of requirements.lock at its pinned version.
    bom = json.loads(sbom.read_text())
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.6")
    assert (bom["metadata"]["component"]["name"], bom["metadata"]["component"]["version"]) == \
        ("envelope", VERSION)
    components = {c["name"].lower(): c["version"] for c in bom["components"]}
    assert components == _lock_pins()
    assert components["uvicorn"] == _lock_pins()["uvicorn"]

    # The chart package: what charts/envelope holds, and it installs.
    with tarfile.open(chart) as tar:
        meta = yaml.safe_load(tar.extractfile("envelope/Chart.yaml").read())  # type: ignore[union-attr]
    assert meta["version"] == VERSION
    namespace = "envelope-release-e2e"
    try:
        cluster.helm("install", RELEASE, str(chart), "--namespace", namespace, "--create-namespace",
                     "--set", "image.local=true", timeout=120)
        [listed] = json.loads(cluster.helm("list", "--namespace", namespace, "-o", "json").stdout)
        assert (listed["name"], listed["status"], listed["chart"]) == \
            (RELEASE, "deployed", f"envelope-{VERSION}")
        name = f"{RELEASE}-envelope"
        hooks = cluster.kubectl_json("get", "validatingwebhookconfiguration", name)["webhooks"]
        # safeInstall: no replica can be ready here (no kubelet), so nothing is locked
        assert {h["failurePolicy"] for h in hooks} == {"Ignore"}
        assert cluster.kubectl_json("get", "deployment", name, "-n", namespace)["metadata"]["labels"][
            "helm.sh/chart"] == f"envelope-{VERSION}"
    finally:
        cluster.helm("uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s",
                     check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
