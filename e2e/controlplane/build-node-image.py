#!/usr/bin/env python3
"""Build the e2e node's container images without a registry: an OCI image layout
tarball (oci-layout, index.json, blobs) holding two images made of one layer, Debian's
busybox-static with its applet links:

- ``docker.io/local/busybox:1``: ``/bin/sh``; the test pods' image
  (``imagePullPolicy: Never``);
- ``docker.io/local/pause:1``: a signal-handling sleep loop, containerd's CRI
  ``sandbox_image`` (the pod sandbox; registry.k8s.io/pause cannot be pulled here).

Names carry ``docker.io/`` because the CRI normalises image names (``local/busybox:1``
is looked up as ``docker.io/local/busybox:1``). The tarball is imported with
``ctr -n k8s.io images import`` (e2e/harness/node.py), which names each image after
its ``io.containerd.image.name`` annotation.

Cached outside the clone, keyed by the busybox binary's digest and RECIPE:
``${ENVELOPE_NODE_DIR:-~/.cache/envelope/node}/images-<key>.tar``. The only line on
stdout is the tarball's path. Deterministic: the same busybox gives the same digests.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

RECIPE = "1"
BUSYBOX = Path(os.environ.get("ENVELOPE_NODE_BUSYBOX", "/bin/busybox"))
BUSYBOX_IMAGE = "docker.io/local/busybox:1"
PAUSE_IMAGE = "docker.io/local/pause:1"
PAUSE_SCRIPT = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
MTIME = 1_700_000_000  # fixed, so the layer's digest depends on busybox alone


def _die(message: str) -> None:
    print(f"[controlplane/build-node-image.py] ERROR: {message}", file=sys.stderr)
    sys.exit(1)


def _applets(busybox: Path) -> list[str]:
    out = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout
    return sorted({a for a in out.split() if a and "/" not in a and a != "busybox"})


def _layer(busybox: Path) -> bytes:
    """One uncompressed layer: /bin/busybox, a symlink per applet, the usual dirs."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, MTIME
            tar.addfile(info)

        for d in ("bin", "dev", "etc", "proc", "root", "sys", "var"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        data = busybox.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size, info.mode, info.mtime = len(data), 0o755, MTIME
        tar.addfile(info, io.BytesIO(data))
        for applet in _applets(busybox):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, MTIME
            tar.addfile(link)
        etc = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode, info.mtime = len(etc), 0o644, MTIME
        tar.addfile(info, io.BytesIO(etc))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def build(busybox: Path) -> bytes:
    """The OCI layout tarball's bytes."""
    blobs: dict[str, bytes] = {}
    layer = _layer(busybox)
    layer_desc = {"mediaType": "application/vnd.oci.image.layer.v1.tar", **_blob(blobs, layer)}
    manifests = []
    for name, entrypoint, cmd in ((BUSYBOX_IMAGE, None, ["/bin/sh"]),
                                  (PAUSE_IMAGE, ["/bin/sh", "-c", PAUSE_SCRIPT], None)):
        container: dict[str, object] = {"Env": ["PATH=/bin"], "WorkingDir": "/"}
        if entrypoint:
            container["Entrypoint"] = entrypoint
        if cmd:
            container["Cmd"] = cmd
        config = {"architecture": "amd64", "os": "linux", "config": container,
                  "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
                  "created": "2023-11-14T22:13:20Z"}
        config_desc = {"mediaType": "application/vnd.oci.image.config.v1+json",
                       **_blob(blobs, json.dumps(config, sort_keys=True).encode())}
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": config_desc, "layers": [layer_desc]}
        manifests.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                          **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
                          "platform": {"architecture": "amd64", "os": "linux"},
                          "annotations": {"io.containerd.image.name": name,
                                          "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}})
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": manifests}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, MTIME
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add("index.json", json.dumps(index, sort_keys=True).encode())
        for digest, data in sorted(blobs.items()):
            add(f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    return out.getvalue()


def main() -> None:
    if not BUSYBOX.is_file():
        _die(f"{BUSYBOX} is missing: the e2e node's images are made of Debian's busybox-static "
             "(apt-get install -y busybox-static)")
    if b"ld-linux" in BUSYBOX.read_bytes()[:8192]:  # a PT_INTERP: dynamically linked
        _die(f"{BUSYBOX} is dynamically linked: install busybox-static (apt-get install -y "
             "busybox-static), the images have no libc")
    key = hashlib.sha256(BUSYBOX.read_bytes() + RECIPE.encode()).hexdigest()[:16]
    root = Path(os.environ.get("ENVELOPE_NODE_DIR", Path.home() / ".cache" / "envelope" / "node"))
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"images-{key}.tar"
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(build(BUSYBOX))
        tmp.replace(target)
        print(f"[controlplane/build-node-image.py] built {target}", file=sys.stderr)
    print(target)


if __name__ == "__main__":
    main()
