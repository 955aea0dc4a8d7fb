"""The namespace fact the in-tree policy's binding selects on: the label
:data:`~app.intree.compile.FACT_LABEL` = :data:`~app.intree.compile.FACT_VALUE` on a
Namespace holding no LimitRange and no ResourceQuota, so that neither namespace guard
(``quota-needs-cpu-limits``, ``limitrange-needs-cpu-limits``) can report on any of its
workloads (``app/rules/namespace.py`` ``_cpu_limit_needs`` returns nothing without one).

A policy cannot read LimitRanges or ResourceQuotas (it sees the object, the request and
``namespaceObject``), so this loop writes what it would need to know onto the Namespace.
It runs outside the admission path (one replica: whoever runs ``FactKeeper.run``; its
writes are idempotent, so two keepers agree). Its window — a quota created in a
labelled namespace, until the label is removed — is measured and documented in
docs/in-tree.md; writes in that window are answered by the policy as in a namespace
without the quota.

:func:`fact_changes` is pure; :class:`FactKeeper` does the I/O.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from app.cluster.kube import KubeClient, pages
from app.intree.compile import FACT_LABEL, FACT_VALUE
from app.selectors import LabelSelector

__all__ = ["FactKeeper", "fact_changes"]

log = logging.getLogger("envelope.intree.facts")


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _namespace_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) else ""


def fact_changes(namespaces: Iterable[Mapping[str, Any]],
                 guarded_objects: Iterable[Mapping[str, Any]],
                 selector: LabelSelector | None = None) -> dict[str, str | None]:
    """Namespace name -> the label value to write (``FACT_VALUE``) or None (remove it),
    for every namespace (matching ``selector``, when given) whose label is not what
    ``guarded_objects`` (its LimitRanges and ResourceQuotas) make it. A terminating
    namespace is left alone."""
    guarded = {_namespace_of(o) for o in guarded_objects}
    out: dict[str, str | None] = {}
    for ns in namespaces:
        name = _name(ns)
        found = ns.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        found = meta.get("labels")
        labels: dict[str, Any] = found if isinstance(found, dict) else {}
        if not name or meta.get("deletionTimestamp"):
            continue
        if selector is not None and not selector.matches({str(k): str(v) for k, v in labels.items()}):
            continue
        want = None if name in guarded else FACT_VALUE
        if labels.get(FACT_LABEL) != want:
            out[name] = want
    return out


class FactKeeper:
    """Keeps the fact label current: LIST Namespaces, LimitRanges and ResourceQuotas,
    then one merge patch per namespace whose label is wrong. Removals are written
    before additions (a namespace must lose the fact before another gains it)."""

    def __init__(self, client: KubeClient, interval: float = 2.0,
                 selector: LabelSelector | None = None) -> None:
        self.client = client
        self.interval = interval
        self.selector = selector
        """Only namespaces whose labels match (None: every namespace)."""

    def _list(self, path: str) -> list[dict[str, Any]]:
        return [item for page in pages(self.client, path) for item in page.get("items") or []]

    def run_once(self) -> dict[str, str | None]:
        # Guarded kinds first: a quota created during the namespace LIST is still seen.
        guarded = self._list("/api/v1/limitranges") + self._list("/api/v1/resourcequotas")
        changes = fact_changes(self._list("/api/v1/namespaces"), guarded, self.selector)
        for name, value in sorted(changes.items(), key=lambda kv: kv[1] is not None):
            self.client.request("PATCH", f"/api/v1/namespaces/{name}",
                                {"metadata": {"labels": {FACT_LABEL: value}}},
                                content_type="application/merge-patch+json")
        return changes

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # a failed round is retried; the label stays as it was
                log.exception("namespace facts: round failed")
            stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def main(argv: list[str] | None = None) -> int:
    """``python -m app.intree.facts [--kubeconfig PATH] [--interval S] [--once]``: run the
    keeper until interrupted (until ``serve``'s leader runs it). Needs list on
    namespaces, limitranges and resourcequotas and patch on namespaces."""
    import argparse

    from app.cluster.kube import kube_configuration

    parser = argparse.ArgumentParser(prog="python -m app.intree.facts", description=main.__doc__)
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, else $KUBECONFIG")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds")
    parser.add_argument("--once", action="store_true", help="one round, print the changes")
    args = parser.parse_args(argv)
    keeper = FactKeeper(KubeClient(kube_configuration(args.kubeconfig)), args.interval)
    if args.once:
        for name, value in sorted(keeper.run_once().items()):
            print(f"{name}: {FACT_LABEL}={value}" if value else f"{name}: {FACT_LABEL} removed")
        return 0
    stop = threading.Event()
    try:
        keeper.run(stop)
    except KeyboardInterrupt:
        stop.set()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
