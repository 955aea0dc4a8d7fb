"""Same answer first: generated Deployments created through Envelope and through each
peer (real creates, one namespace per peer) must be stored equal.

Run by hand (``make bench-peers`` runs it before timing) or from bench/apiserver.py.
Prints every difference (peer, object, JSON path, Envelope's value, the peer's) and
exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "e2e"))

import peers  # noqa: E402
import urllib3  # noqa: E402
from objects import comparable, generated_deployments  # noqa: E402
from rounds import PEER_ROUNDS, PeerRound  # noqa: E402

import harness  # noqa: E402


def create_all(cluster: harness.Cluster, namespace: str, objects: list[dict[str, Any]], *,
               strict: bool = False) -> dict[str, Any]:
    """Create each object; returns name -> the stored object (the 201 body) or the error.
    ``strict``: Envelope's bookkeeping annotation is compared too, and the warnings."""
    pool = urllib3.PoolManager(maxsize=4, ssl_context=cluster.admin_ssl_context())
    url = f"{cluster.api_url}/apis/apps/v1/namespaces/{namespace}/deployments"
    out: dict[str, Any] = {}
    for obj in objects:
        response = pool.request("POST", url, body=json.dumps(obj).encode(),
                                headers={"Content-Type": "application/json"}, timeout=30)
        data = json.loads(response.data)
        if response.status != 201:
            out[obj["metadata"]["name"]] = {
                "error": f"HTTP {response.status}: {data.get('message', '')[:300]}"}
        elif strict:
            out[obj["metadata"]["name"]] = {**comparable(data, bookkeeping=True),
                                            "warnings": sorted(harness.warning_texts(response.headers))}
        else:
            out[obj["metadata"]["name"]] = comparable(data)
    return out


def differences(a: Any, b: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    if isinstance(a, dict) and isinstance(b, dict):
        found = []
        for key in sorted(set(a) | set(b)):
            found += differences(a.get(key), b.get(key), f"{path}.{key}")
        return found
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True))
                for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [(path or ".", a, b)]


def stored_through(cluster: harness.Cluster, workdir: Path, labels: tuple[str, ...],
                   objects: list[dict[str, Any]], *, strict: bool = False) -> dict[str, dict[str, Any]]:
    """Per round label, what :func:`create_all` returns for ``objects`` created through it."""
    probe_ns = cluster.create_namespace(harness.unique_name("peers-probe", max_length=40))
    stored: dict[str, dict[str, Any]] = {}
    for label in labels:
        peer = PeerRound(label, cluster, workdir)
        try:
            peer.start(probe_ns)
            ns = cluster.create_namespace(harness.unique_name(f"same-{label}", max_length=40))
            peer.prepare([ns])
            stored[label] = create_all(cluster, ns, objects, strict=strict)
        finally:
            peer.stop()
    return stored


def same_answer(cluster: harness.Cluster, workdir: Path, count: int,
                labels: tuple[str, ...] = ("envelope", "map", "kyverno-cpol", "kyverno-mpol"), *,
                strict: bool = False, objects: list[dict[str, Any]] | None = None) -> int:
    """How many of ``objects`` (default: ``count`` generated Deployments) each of
    ``labels[1:]`` stores differently from ``labels[0]``; prints the differences."""
    if objects is None:
        objects = generated_deployments(count)
    stored = stored_through(cluster, workdir, labels, objects, strict=strict)
    base = stored[labels[0]]
    errors = {n: v["error"] for n, v in base.items() if "error" in v}
    if errors:
        print(f"{labels[0]} refused {len(errors)} objects: {list(errors.items())[:3]}")
    total = 0
    for label in labels[1:]:
        diffs = [(name, d) for name, obj in stored[label].items() for d in differences(base[name], obj)]
        changed = sorted({name for name, _ in diffs})
        print(f"{label}: {len(objects) - len(changed)}/{len(objects)} stored equal to {labels[0]}")
        for name, (path, want, got) in diffs[:20]:
            print(f"  {name} {path}: {labels[0]}={json.dumps(want)} {label}={json.dumps(got)}")
        total += len(changed)
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=60)
    parser.add_argument("--peers", default=",".join(p for p in PEER_ROUNDS if p != "envelope-mc"))
    args = parser.parse_args()
    labels = tuple(args.peers.split(","))
    work = Path(tempfile.mkdtemp(prefix="envelope-same-answer-"))
    cluster = harness.start_control_plane(work / "cp", peers_bin_dir(),
                                          apiserver_args=peers.MAP_APISERVER_ARGS)
    try:
        return 1 if same_answer(cluster, work, args.count, labels) else 0
    finally:
        cluster.stop()


def peers_bin_dir() -> Path:
    import os
    import subprocess
    env = os.environ.get("ENVELOPE_CONTROLPLANE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(["bash", str(HERE.parents[1] / "e2e/controlplane/build.sh")],
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip().splitlines()[-1])


if __name__ == "__main__":
    sys.exit(main())
