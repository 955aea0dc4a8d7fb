"""The inputs of ``envelope quotas`` and ``envelope quotas plan``: manifests from files
(``app.cluster.static.load``, its errors sorted by file, document and line) and the kinds
a command reads from a cluster (the listing of ``check --kubeconfig``,
``app.cluster.snapshot``: one LIST per kind, nothing written)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["read_cluster", "read_files"]


def read_files(paths: list[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The objects in the files (``-`` is stdin) and a line for each one that does not parse."""
    from app.cluster.static import load

    loaded = load(paths)
    problems = [str(e) for e in sorted(loaded.errors, key=lambda e: (e.source, e.document, e.line))]
    return [m.obj for m in loaded.manifests], problems


def read_cluster(kubeconfig: str, kinds: Iterable[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """The cluster's objects of ``kinds`` (and what their rules need beside them), and the
    problems met: a kubeconfig that cannot be used, a kind that could not be listed."""
    from app.cluster.kube import KubeClient, kube_configuration
    from app.cluster.snapshot import context_kinds, snapshot

    try:
        client = KubeClient(kube_configuration(kubeconfig))
    except Exception as exc:
        return [], [f"cannot use --kubeconfig {kubeconfig}: {exc}"]
    live = snapshot(client, context_kinds(set(kinds)))
    return live.objects, live.problems
