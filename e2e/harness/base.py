"""What every part of the harness shares: the repository's paths, the binaries' names,
the webhook registration's names, the two errors, and unique object names."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
BUILD_SCRIPT = REPO_ROOT / "e2e" / "controlplane" / "build.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager", "kubectl", "helm")
BIN_ENV = "ENVELOPE_CONTROLPLANE_BIN"

READY_TIMEOUT = 120.0
"""Seconds to wait for kube-apiserver's /readyz."""

# Names used by the webhook registration (see register_webhook).
MUTATING_WEBHOOK_NAME = "workloads.mutate.envelope.io"
VALIDATING_WEBHOOK_NAME = "workloads.validate.envelope.io"
WEBHOOK_CONFIGURATION_NAME = "envelope-e2e"
PROBE_NAMESPACE = "envelope-e2e-probe"
ISOLATED_NAMESPACE_LABEL = "envelope.test/isolated"
"""Namespaces carrying this label (any value) are skipped by the session
webhook's configurations, for tests that register a webhook of their own."""


class HarnessError(RuntimeError):
    """The control plane (or the webhook) could not be built, started or used."""


class CommandError(subprocess.CalledProcessError):
    """A kubectl/helm call failed; str() includes its stdout and stderr."""

    def __str__(self) -> str:
        cmd = " ".join(str(c) for c in self.cmd) if isinstance(self.cmd, list) else self.cmd
        return (
            f"command failed with exit code {self.returncode}: {cmd}\n"
            f"--- stdout ---\n{self.stdout or ''}\n--- stderr ---\n{self.stderr or ''}"
        )


def unique_name(prefix: str, max_length: int = 63) -> str:
    """A DNS-1123 label: ``prefix`` (sanitised, truncated) plus a random suffix."""
    cleaned = "".join(c if c.isalnum() else "-" for c in prefix.lower())
    cleaned = "-".join(part for part in cleaned.split("-") if part) or "e2e"
    suffix = uuid.uuid4().hex[:6]
    return f"{cleaned[: max_length - len(suffix) - 1].rstrip('-')}-{suffix}"




def warning_texts(headers: Any) -> list[str]:
    """The API server's ``Warning: 299 - "text"`` headers as their texts, in order (RFC 7234
    quoting undone)."""
    out = []
    for value in headers.get_all("Warning") or []:
        text = value.split(" ", 2)[2] if value.startswith("299 ") else value
        if text.startswith('"') and text.endswith('"'):
            text = text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        out.append(text)
    return out
