"""A ConfigMap volume as the kubelet lays it out, for tests of the policy reload
(tests/serve/test_policyreload.py, e2e/test_policy_reload.py)."""

from __future__ import annotations

import os
from pathlib import Path


class ConfigMapVolume:
    """A directory laid out as the kubelet's atomic writer lays out a ConfigMap volume
    (kubernetes pkg/volume/util/atomic_writer.go): ``policy.yaml -> ..data/policy.yaml``,
    ``..data -> ..<timestamp>``; an update writes a new timestamped directory and renames
    a new ``..data_tmp`` symlink over ``..data``."""

    def __init__(self, root: Path, text: str) -> None:
        self.root = root
        self.n = 0
        self.update(text)
        (root / "policy.yaml").symlink_to("..data/policy.yaml")

    def update(self, text: str) -> None:
        self.n += 1
        payload = self.root / f"..2026_12_05_{self.n:02d}"
        payload.mkdir()
        (payload / "policy.yaml").write_text(text)
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(payload.name)
        os.rename(tmp, self.root / "..data")

    @property
    def path(self) -> Path:
        return self.root / "policy.yaml"
