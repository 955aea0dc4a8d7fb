"""The namespace fact the in-tree policy's binding selects on: the label
:data:`~app.intree.compile.FACT_LABEL` = :data:`~app.intree.compile.FACT_VALUE` on a
Namespace holding no LimitRange and no ResourceQuota, where neither namespace guard can
report (``app/rules/namespace/cpu_limits.py`` ``_cpu_limit_needs`` returns nothing).

A policy cannot read LimitRanges or ResourceQuotas, so this writes what it needs onto
the Namespace, outside the admission path: :class:`ViewFactKeeper` (``envelope serve
--in-tree-facts``, in the replica holding the Lease, from the live view) and
:class:`FactKeeper` (LIST-based rounds, ``python -m app.intree.facts``). Both write one
JSON merge patch per namespace that touches the fact label only (:func:`label_patch`),
removals first; the writes are idempotent. :func:`desired_facts` and
:func:`fact_changes` are pure; the classes do the I/O. The keepers, the fact's Lease,
the window and its measurement: docs/in-tree.md, "Guards that read the namespace".

Why one module of ~506 lines: the fact, its Lease and the two keepers that write it are
one protocol over one label; the keepers share the writes, their order and the metrics.
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.cluster.kube import ApiError, KubeClient, pages
from app.intree.compile import FACT_LABEL, FACT_VALUE
from app.k8s.selectors import LabelSelector

__all__ = ["FACT_KINDS", "FACT_LEASE_SECONDS", "FIELD_MANAGER", "FactKeeper", "FactLease",
           "FactMetrics", "Leadership",
           "ViewFactKeeper", "desired_facts", "fact_changes", "label_patch", "parse_selector"]

log = logging.getLogger("envelope.intree.facts")

FIELD_MANAGER = "envelope-facts"
"""The field manager of every label write (``metadata.managedFields`` says who wrote it)."""

FACT_KINDS = ("Namespace", "LimitRange", "ResourceQuota")
"""What the fact is computed from: the live view must watch these three."""


FACT_LEASE_SECONDS = 30
"""How long the in-tree policy trusts the facts after the keeper last renewed its Lease
(``leaseDurationSeconds``; docs/in-tree.md "The fact expires")."""


class FactLease:
    """The Lease the in-tree policy reads as its param (``app.intree.compile``
    ``fact_lease_expression``): ``renewTime`` + ``leaseDurationSeconds`` is the time until
    which the namespace facts may be trusted. The keeper renews it every ``duration / 3``
    seconds while its facts are current; a keeper that stops (crash, scale to 0, lost
    leadership, refused writes, lost watches) stops renewing, and ``duration`` seconds
    later the policy no longer answers in labelled namespaces: the webhook does.

    One write per renewal, whatever the number of namespaces: a PUT with the
    resourceVersion of the last write (a Lease may be created by a PUT, but not updated
    without a resourceVersion: ``pkg/registry/coordination/lease/strategy.go``
    ``AllowCreateOnUpdate`` true, ``AllowUnconditionalUpdate`` false), read again after a
    conflict or when this replica has written none yet.
    ``renewTime`` is this replica's clock: a clock ahead of the API server's by *s*
    seconds stretches the trust by *s* (docs/in-tree.md)."""

    def __init__(self, client: KubeClient, namespace: str, name: str, identity: str,
                 duration: int = FACT_LEASE_SECONDS,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.clock = clock
        self.monotonic = monotonic
        self._renewed: float | None = None
        self._version: str | None = None
        """resourceVersion of the Lease as this replica last wrote or read it."""

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    def body(self) -> dict[str, Any]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.clock())) + ".000000Z"
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                         "renewTime": stamp}}

    def due(self) -> bool:
        """A third of the duration has passed since the last renewal (or there was none)."""
        return self._renewed is None or self.monotonic() - self._renewed >= self.duration / 3

    def renew(self, force: bool = False) -> bool:
        """Renew when :meth:`due` (or ``force``); True when written."""
        now = self.monotonic()
        if not force and not self.due():
            return False
        body = self.body()
        url = f"{self.path}/{self.name}"
        for attempt in range(3):
            if self._version is not None:
                body["metadata"]["resourceVersion"] = self._version
            else:
                body["metadata"].pop("resourceVersion", None)
            try:
                stored = self.client.request("PUT", url, body)
                break
            except ApiError as exc:
                # 422: it exists and this replica knows no resourceVersion; 409: another
                # writer came between; 404: gone (a PUT without one creates it)
                if exc.status not in (404, 409, 422) or attempt == 2:
                    raise
                self._version = None if exc.status == 404 else self._current_version(url)
        version = stored.get("metadata", {}).get("resourceVersion") if isinstance(stored, dict) else None
        self._version = version if isinstance(version, str) else None
        self._renewed = now
        return True

    def _current_version(self, url: str) -> str | None:
        try:
            current = self.client.request("GET", url)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        version = current.get("metadata", {}).get("resourceVersion")
        return version if isinstance(version, str) else None

    def forget(self) -> None:
        """Not current any more: the next healthy round renews at once."""
        self._renewed = None


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else ""


def _namespace_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return ns if isinstance(ns, str) else ""


def _labels(meta: Mapping[str, Any]) -> dict[str, Any]:
    found = meta.get("labels")
    return found if isinstance(found, dict) else {}


def desired_facts(namespaces: Iterable[Mapping[str, Any]],
                  guarded_objects: Iterable[Mapping[str, Any]],
                  selector: LabelSelector | None = None
                  ) -> dict[str, tuple[Any, str | None]]:
    """Namespace name -> (its label value now, the value it should have: ``FACT_VALUE``
    or None), for every namespace matching ``selector`` (when given). A terminating
    namespace is left alone (not listed)."""
    guarded = {_namespace_of(o) for o in guarded_objects}
    out: dict[str, tuple[Any, str | None]] = {}
    for ns in namespaces:
        name = _name(ns)
        found = ns.get("metadata")
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        labels = _labels(meta)
        if not name or meta.get("deletionTimestamp"):
            continue
        if selector is not None and not selector.matches({str(k): str(v) for k, v in labels.items()}):
            continue
        out[name] = (labels.get(FACT_LABEL), None if name in guarded else FACT_VALUE)
    return out


def fact_changes(namespaces: Iterable[Mapping[str, Any]],
                 guarded_objects: Iterable[Mapping[str, Any]],
                 selector: LabelSelector | None = None) -> dict[str, str | None]:
    """Namespace name -> the label value to write (``FACT_VALUE``) or None (remove it),
    for every namespace (matching ``selector``, when given) whose label is not what
    ``guarded_objects`` (its LimitRanges and ResourceQuotas) make it. A terminating
    namespace is left alone."""
    return {name: want for name, (have, want)
            in desired_facts(namespaces, guarded_objects, selector).items() if have != want}


def label_patch(value: str | None) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that sets the fact label to ``value`` (None:
    removes it) and touches nothing else: no other label, no annotation."""
    return {"metadata": {"labels": {FACT_LABEL: value}}}


def parse_selector(text: str) -> LabelSelector | None:
    """``key=value,key2=value2`` (equality only, as ``kubectl -l``) as a LabelSelector;
    empty text: None (every namespace). Raises ValueError on anything else."""
    pairs: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or "!" in key or "=" in value:
            raise ValueError(f"{part!r} is not key=value")
        pairs[key.strip()] = value.strip()
    if not pairs:
        return None
    selector = LabelSelector.model_validate({"matchLabels": pairs})
    problems = selector.problems()
    if problems:
        raise ValueError("; ".join(problems))
    return selector


def _sorted_changes(changes: Mapping[str, str | None]) -> list[tuple[str, str | None]]:
    """Removals first (a namespace must lose the fact before another gains it)."""
    return sorted(changes.items(), key=lambda kv: (kv[1] is not None, kv[0]))


def _write(client: KubeClient, name: str, value: str | None) -> None:
    client.request("PATCH", f"/api/v1/namespaces/{name}?fieldManager={FIELD_MANAGER}",
                   label_patch(value), content_type="application/merge-patch+json")


class FactMetrics:
    """What the keeper does, exported on ``serve``'s metrics port (docs/metrics.md)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rounds = Counter(
            "envelope_intree_fact_rounds",
            "Namespace fact rounds run by this replica while leading: ok, or failed (a label "
            "write refused or unreachable; retried)", ("result",), registry=registry)
        self.last_success = Gauge(
            "envelope_intree_fact_last_success_timestamp_seconds",
            "When this replica last finished a round with every label correct (Unix time)",
            registry=registry)
        self.labelled = Gauge(
            "envelope_intree_fact_namespaces_labelled",
            "Namespaces that carry the fact label after this replica's last round",
            registry=registry)
        self.writes = Counter(
            "envelope_intree_fact_writes", "Label writes: added or removed", ("change",),
            registry=registry)
        self.leading = Gauge(
            "envelope_intree_fact_leader",
            "1 while this replica holds the Lease and keeps the namespace fact", registry=registry)


class Elector(Protocol):
    def try_acquire(self) -> bool: ...


class Leadership:
    """Holds the Lease for the keeper: renews it every ``retry`` seconds on its own
    thread. :meth:`leading` is true while the last successful renewal is younger than
    ``deadline`` — client-go's RenewDeadline (k8s.io/client-go/tools/leaderelection,
    ``renew``): a replica that cannot renew stops writing before the Lease can expire
    for the others (``deadline`` < the Lease's duration, 15 s), and one that sees
    another holder stops at once."""

    def __init__(self, elector: Elector, retry: float = 2.0, deadline: float = 10.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.elector = elector
        self.retry = retry
        self.deadline = deadline
        self.monotonic = monotonic
        self._renewed: float | None = None
        self._stop = threading.Event()

    def step(self) -> None:
        try:
            held = self.elector.try_acquire()
        except Exception as exc:  # the API server unreachable: lead until the deadline
            log.warning("namespace facts: lease renewal failed",
                        extra={"fields": {"error": type(exc).__name__}})
            return
        self._renewed = self.monotonic() if held else None

    def leading(self) -> bool:
        renewed = self._renewed
        return renewed is not None and self.monotonic() - renewed < self.deadline

    def start(self) -> None:
        def loop() -> None:
            while True:
                self.step()
                if self._stop.wait(self.retry):
                    return

        threading.Thread(target=loop, daemon=True, name="intree-facts-lease").start()

    def stop(self) -> None:
        self._stop.set()


class FactView(Protocol):
    def list(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]: ...

    def version(self, kind: str, namespace: str | None = None) -> int: ...

    def problems(self, kinds: Iterable[str] | None = None) -> builtins.list[str]: ...


class ViewFactKeeper:
    """The keeper ``envelope serve --in-tree-facts`` runs: reads Namespaces, LimitRanges
    and ResourceQuotas from the live view, writes only while ``leading()``.

    A round runs when one of the three kinds changed in the view (a watch event; checked
    every ``tick`` seconds from the view's change counters, without I/O), every
    ``resync`` seconds, and ``retry`` seconds after a failed write (doubling to 30 s).
    While the view of a kind is not synced or its watch is lost, only removals are
    written: a quota the view cannot see must not earn a namespace the fact. A write the
    view has not reflected yet (its watch event is on the way) is not repeated for
    ``settle`` seconds."""

    def __init__(self, client: KubeClient, view: FactView, leading: Callable[[], bool],
                 metrics: FactMetrics | None = None, selector: LabelSelector | None = None,
                 tick: float = 0.05, resync: float = 30.0, settle: float = 5.0,
                 monotonic: Callable[[], float] = time.monotonic,
                 lease: FactLease | None = None) -> None:
        self.client = client
        self.lease = lease
        """Renewed after every tick that finds the facts current (leading, the view of
        the three kinds synced, no write failing)."""
        self.view = view
        self.leading = leading
        self.metrics = metrics
        self.selector = selector
        self.tick = tick
        self.resync = resync
        self.settle = settle
        self.monotonic = monotonic
        self._seen: tuple[int, ...] | None = None
        self._due = 0.0
        self._backoff = 0.0
        self._written: dict[str, tuple[str | None, float]] = {}
        self._stop = threading.Event()

    def step(self) -> dict[str, str | None] | None:
        """One check: the changes written by the round it ran, None when no round was due
        (or this replica is not leading)."""
        now = self.monotonic()
        leading = self.leading()
        if self.metrics is not None:
            self.metrics.leading.set(1.0 if leading else 0.0)
        if not leading:
            self._seen, self._written = None, {}  # a new term starts from a full round
            if self.lease is not None:
                self.lease.forget()
            return None
        versions = tuple(self.view.version(kind) for kind in FACT_KINDS)
        if versions == self._seen and now < self._due:
            self._renew()
            return None
        # The versions are read before the lists: a change made while listing runs
        # another round.
        self._seen, self._due = versions, now + self.resync
        complete = not self.view.problems(FACT_KINDS)
        wanted = desired_facts(self.view.list("Namespace"),
                               self.view.list("LimitRange") + self.view.list("ResourceQuota"),
                               self.selector)
        changes = {name: want for name, (have, want) in wanted.items() if have != want
                   and (complete or want is None)}
        self._written = {n: w for n, w in self._written.items() if n in changes}
        todo = {name: want for name, want in changes.items()
                if name not in self._written or self._written[name][0] != want
                or now - self._written[name][1] >= self.settle}
        failed = self._write_changes(todo, now)
        if todo:
            log.info("namespace facts written", extra={"fields": {
                "added": sum(1 for v in todo.values() if v is not None),
                "removed": sum(1 for v in todo.values() if v is None), "failed": failed}})
        if failed:
            self._backoff = min(30.0, max(1.0, self._backoff * 2))
            self._due = now + self._backoff
        else:
            self._backoff = 0.0
        if self.metrics is not None:
            self.metrics.rounds.labels("failed" if failed else "ok").inc()
            labelled = sum(1 for name, (have, _) in wanted.items()
                           if (self._written[name][0] if name in self._written else have)
                           == FACT_VALUE)
            self.metrics.labelled.set(labelled)
            if not failed and complete:
                self.metrics.last_success.set_to_current_time()
        if failed or not complete:
            if self.lease is not None:
                self.lease.forget()
        else:
            self._renew()
        return todo

    def _write_changes(self, todo: dict[str, str | None], now: float) -> int:
        """Write each label change, removals first; how many failed (a Namespace
        deleted meanwhile is not a failure)."""
        failed = 0
        for name, want in _sorted_changes(todo):
            try:
                _write(self.client, name, want)
            except ApiError as exc:
                if exc.status == 404:  # deleted meanwhile: nothing to keep
                    continue
                failed += 1
                self._written.pop(name, None)
                log.warning("namespace facts: label write refused", extra={"fields": {
                    "namespace": name, "status": exc.status, "change": _change(want)}})
                continue
            except Exception as exc:  # connection: retried
                failed += 1
                self._written.pop(name, None)
                log.warning("namespace facts: label write failed", extra={"fields": {
                    "namespace": name, "error": type(exc).__name__, "change": _change(want)}})
                continue
            self._written[name] = (want, now)
            if self.metrics is not None:
                self.metrics.writes.labels(_change(want)).inc()
        return failed

    def _renew(self) -> None:
        """Renew the fact Lease if the facts are current: the last round wrote all it
        had to (no backoff) and the view of the three kinds is synced."""
        if (self.lease is None or not self.lease.due() or self._backoff
                or self.view.problems(FACT_KINDS)):
            return
        try:
            if self.lease.renew():
                log.debug("namespace facts: lease renewed")
        except Exception as exc:  # retried on the next tick
            log.warning("namespace facts: fact lease renewal failed",
                        extra={"fields": {"error": type(exc).__name__}})

    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or self._stop
        while not stop.is_set():
            try:
                self.step()
            except Exception as exc:  # never leave the thread; the next tick retries
                log.warning("namespace facts: round failed",
                            extra={"fields": {"error": type(exc).__name__}})
                self._due = self.monotonic() + 1.0
            stop.wait(self.tick)

    def start(self) -> None:
        threading.Thread(target=self.run, daemon=True, name="intree-facts").start()

    def stop(self) -> None:
        self._stop.set()


def _change(value: str | None) -> str:
    return "removed" if value is None else "added"


class FactKeeper:
    """Keeps the fact label current in LIST rounds (``python -m app.intree.facts``):
    LIST LimitRanges and ResourceQuotas, then Namespaces, then one merge patch per
    namespace whose label is wrong. Removals are written before additions."""

    def __init__(self, client: KubeClient, interval: float = 2.0,
                 selector: LabelSelector | None = None, lease: FactLease | None = None) -> None:
        self.client = client
        self.interval = interval
        self.selector = selector
        """Only namespaces whose labels match (None: every namespace)."""
        self.lease = lease
        """Renewed (at once) after every round that wrote every change."""

    def _list(self, path: str) -> list[dict[str, Any]]:
        return [item for page in pages(self.client, path) for item in page.get("items") or []]

    def run_once(self) -> dict[str, str | None]:
        # Guarded kinds first: a quota created during the namespace LIST is still seen.
        guarded = self._list("/api/v1/limitranges") + self._list("/api/v1/resourcequotas")
        changes = fact_changes(self._list("/api/v1/namespaces"), guarded, self.selector)
        for name, value in _sorted_changes(changes):
            _write(self.client, name, value)
        if self.lease is not None:
            self.lease.renew(force=True)
        return changes

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception as exc:  # a failed round is retried; the label stays as it was
                log.warning("namespace facts: round failed",
                            extra={"fields": {"error": type(exc).__name__}})
            stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def main(argv: list[str] | None = None) -> int:
    """``python -m app.intree.facts [--kubeconfig PATH] [--interval S] [--once]``: run the
    LIST-based keeper until interrupted (``envelope serve --in-tree-facts`` runs the
    watch-driven one in its leader). Needs list on
    namespaces, limitranges and resourcequotas and patch on namespaces."""
    import argparse

    from app.cluster.kube import kube_configuration

    parser = argparse.ArgumentParser(prog="python -m app.intree.facts", description=main.__doc__)
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, else $KUBECONFIG")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between rounds")
    parser.add_argument("--once", action="store_true", help="one round, print the changes")
    parser.add_argument("--lease", default="", metavar="NAMESPACE/NAME",
                        help="the Lease the in-tree policy's binding reads (paramRef): renewed "
                             "after every complete round; without it the policy stops "
                             "answering in labelled namespaces once the Lease lapses")
    args = parser.parse_args(argv)
    client = KubeClient(kube_configuration(args.kubeconfig))
    lease = None
    if args.lease:
        namespace, _, name = args.lease.partition("/")
        if not namespace or not name:
            parser.error(f"--lease {args.lease!r}: expected NAMESPACE/NAME")
        import socket
        lease = FactLease(client, namespace, name, socket.gethostname())
    keeper = FactKeeper(client, args.interval, lease=lease)
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
