"""The webhook's cluster view, kept current by list + watch.

One thread per resource lists it, then watches from the list's resourceVersion
(with bookmarks), applying events to a :class:`Store` of trimmed plain dicts —
only the fields rules read, so 5,000 Nodes cost megabytes, not gigabytes. A 410
Gone re-lists; a broken connection retries with backoff; a watch silent longer than
``watch_timeout + LIVENESS_GRACE`` is hung and dropped. Nothing on the admission path
ever talks to the API server. Authentication and TLS come from the official client's
configuration (in-cluster service account, or a kubeconfig); the HTTP is its urllib3 pool.

How memory follows what is kept (pages trimmed as they arrive, one swap per re-list)
and why that silence means a hung watch: docs/cluster-view.md, "The live view".

Why one module of ~470 lines: list, watch, re-list after 410 Gone, bookmarks, liveness
and the trims are one informer's state per kind; the table of kinds is ``app/k8s/kinds.py``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from kubernetes.client import Configuration

from app.cluster.kube import ApiError, KubeClient, loads, pages
from app.cluster.view import Index, Store
from app.crds import exceptions
from app.k8s.kinds import KINDS, Kind, read_kinds
from app.k8s.namespace_policy import pods_at_once

__all__ = ["LIVENESS_GRACE", "RESOURCES", "TRIMS", "Informer", "LiveView", "Resource", "Shared",
           "resources_for", "share"]

LIVENESS_GRACE = 10.0
"""Seconds past a watch's expected end (its bookmark) before silence means hung."""

log = logging.getLogger("envelope.cache")

Trim = Callable[[dict[str, Any]], dict[str, Any] | None]


class Shared:
    """One instance of each repeated part of the trimmed objects (hash-consing).

    Thousands of Deployments share a handful of container sizes, Nodes a handful of
    capacities and taints; parsed from JSON, each would be its own dicts and strings.
    ``share(value)`` returns the instance already kept for an equal value (compared by
    canonical JSON), so each distinct part is stored once. Short strings are interned.
    The cache is bounded: when it fills it starts over, which only costs sharing, never
    correctness. Objects in the view are never mutated (rules only read them), which
    is what makes sharing safe.
    """

    def __init__(self, limit: int = 16384) -> None:
        self.limit = limit
        self._cache: dict[int, Any] = {}

    def text(self, value: Any) -> Any:
        return sys.intern(value) if isinstance(value, str) and len(value) <= 64 else value

    def values(self, mapping: Any) -> Any:
        """A dict with its short string values interned; the dict itself not shared
        (for parts unique to one object, such as a Node's labels)."""
        if not isinstance(mapping, dict):
            return mapping
        return {k: self.text(v) for k, v in mapping.items()}

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            value = {k: self(v) for k, v in value.items()}
        elif isinstance(value, list):
            value = [self(v) for v in value]
        else:
            return value
        try:
            # Keyed by the hash of the canonical JSON; equality is checked on a hit, so
            # a collision costs a missed share, never a wrong value.
            key = hash(orjson.dumps(value, option=orjson.OPT_SORT_KEYS))
        except TypeError:
            return value
        found = self._cache.get(key)
        if found is not None:
            return found if found == value else value
        if len(self._cache) >= self.limit:
            self._cache.clear()
        self._cache[key] = value
        return value


share = Shared()


def _meta(obj: dict[str, Any], *extra: str) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    out = {k: meta[k] for k in ("name", "namespace", "resourceVersion", *extra) if k in meta}
    if "namespace" in out:
        out["namespace"] = share.text(out["namespace"])
    return out


def _base(obj: dict[str, Any], kind: str, *extra_meta: str) -> dict[str, Any]:
    return {"apiVersion": share.text(obj.get("apiVersion")), "kind": kind,
            "metadata": _meta(obj, *extra_meta)}


def trim_node(obj: dict[str, Any]) -> dict[str, Any]:
    out = _base(obj, "Node", "labels")
    if "labels" in out["metadata"]:
        out["metadata"]["labels"] = share.values(out["metadata"]["labels"])
    spec = obj.get("spec") or {}
    out["spec"] = share({k: spec[k] for k in ("unschedulable", "taints") if k in spec})
    status = obj.get("status") or {}
    out["status"] = share({k: status[k] for k in ("allocatable", "capacity") if k in status})
    return out


def _trim_pod_spec(spec: dict[str, Any]) -> dict[str, Any]:
    def containers(items: Any, keep: tuple[str, ...]) -> list[dict[str, Any]]:
        return [{k: c[k] for k in keep if k in c} for c in items or [] if isinstance(c, dict)]

    out: dict[str, Any] = {"containers": containers(spec.get("containers"), ("name", "resources"))}
    if spec.get("initContainers"):
        out["initContainers"] = containers(spec["initContainers"],
                                           ("name", "resources", "restartPolicy"))
    # What a quota's scopes read of a pod (app/k8s/namespace_policy.py quota_matches_pod), and
    # the RuntimeClass whose overhead it is charged (app/k8s/podmodel.py admit).
    for key in ("overhead", "resources", "nodeSelector", "activeDeadlineSeconds", "priorityClassName",
                "runtimeClassName"):
        if key in spec:
            out[key] = spec[key]
    affinity = spec.get("affinity")
    if isinstance(affinity, dict):
        pod_terms = {k: affinity[k] for k in ("podAffinity", "podAntiAffinity") if k in affinity}
        if pod_terms:
            out["affinity"] = share(pod_terms)
    return out


def _trim_job_spec(spec: Any) -> dict[str, Any]:
    spec = spec if isinstance(spec, dict) else {}
    template = (spec.get("template") or {}).get("spec") or {}
    out = {k: spec[k] for k in ("parallelism", "completions", "suspend") if k in spec}
    out["template"] = share({"spec": _trim_pod_spec(template)})
    return out


def _owners(obj: dict[str, Any]) -> list[dict[str, Any]]:
    refs = (obj.get("metadata") or {}).get("ownerReferences")
    return [{k: r[k] for k in ("kind", "name", "uid", "controller") if k in r}
            for r in (refs if isinstance(refs, list) else []) if isinstance(r, dict)]


def trim_workload(kind: str) -> Trim:
    """What the namespace memory budget needs (``namespace-memory-composition``): the
    pod count's fields (replicas; a Job's parallelism, completions, suspend, succeeded
    and finished conditions; a CronJob's suspend and its Job template), the pod
    template's resources and the fields quota scopes read, the uid and controller
    owner references (a ReplicaSet is counted through its Deployment, a Job through
    its CronJob, when that owner exists). An object that runs no pods now (a ReplicaSet
    scaled to 0 — a Deployment's old revisions —, a finished Job) is not kept."""

    def trim(obj: dict[str, Any]) -> dict[str, Any] | None:
        if not pods_at_once(kind, obj):
            return None  # runs no pods: nothing to count
        out = _base(obj, kind, "uid")
        owners = _owners(obj)
        if owners:
            out["metadata"]["ownerReferences"] = owners
        spec = obj.get("spec") or {}
        if kind == "Job":
            out["spec"] = _trim_job_spec(spec)
            status = obj.get("status") or {}
            conditions = [{k: c.get(k) for k in ("type", "status")} for c in status.get("conditions") or []
                          if isinstance(c, dict) and c.get("type") in ("Complete", "Failed")]
            out["status"] = {"succeeded": status.get("succeeded", 0), "conditions": conditions}
        elif kind == "CronJob":
            out["spec"] = {k: spec[k] for k in ("suspend", "concurrencyPolicy") if k in spec}
            out["spec"]["jobTemplate"] = {"spec": _trim_job_spec((spec.get("jobTemplate") or {}).get("spec"))}
        else:
            template = (spec.get("template") or {}).get("spec") or {}
            out["spec"] = {"replicas": spec.get("replicas", 1),
                           "template": share({"spec": _trim_pod_spec(template)})}
        return out

    return trim


def trim_whole(kind: str, status: tuple[str, ...] = ()) -> Trim:
    """Small objects (LimitRanges, quotas, CRDs): keep all but managedFields and status
    (but for the ``status`` fields named: a KAI Queue's usage, app/rules/quotas/usage.py)."""

    def trim(obj: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in obj.items() if k != "status"}
        out["kind"] = kind
        meta = dict(out.get("metadata") or {})
        meta.pop("managedFields", None)
        out["metadata"] = meta
        found = obj.get("status")
        if status and isinstance(found, dict):
            out["status"] = {k: found[k] for k in status if k in found}
        return out

    return trim


def trim_karpenter_nodepool(obj: dict[str, Any]) -> dict[str, Any]:
    """What ``pod-fits-node`` reads of a Karpenter NodePool (app/crds/autoscaling.py): the
    node template's labels, taints and requirements, ``spec.limits`` and
    ``status.resources``."""
    out = _base(obj, "NodePool")
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels")
    node_spec = template.get("spec") or {}
    out["spec"] = {"template": {"metadata": {"labels": labels or {}},
                                "spec": {k: node_spec[k] for k in ("taints", "requirements")
                                         if k in node_spec}},
                   "limits": spec.get("limits") or {}}
    out["status"] = {"resources": (obj.get("status") or {}).get("resources") or {}}
    return out


TRIMS: dict[str, Callable[[str], Trim]] = {
    "whole": trim_whole,
    "node": lambda kind: trim_node,
    "workload": trim_workload,
    "karpenter-nodepool": lambda kind: trim_karpenter_nodepool,
    "exception": lambda kind: exceptions.trim,
}
"""``app.k8s.kinds.Kind.trim`` -> the trim of that kind."""


@dataclass(frozen=True)
class Resource:
    kind: str
    """The kind's view name (``app.k8s.kinds.Kind.name``): the store files it there."""
    path: str
    """Collection URL path, e.g. ``/api/v1/nodes`` or ``/apis/kai.resources/v1alpha1/projects``."""
    trim: Trim
    optional: bool = False
    """A CRD that may not be installed: absent counts as synced and empty."""

    @classmethod
    def of(cls, kind: Kind) -> Resource:
        if kind.trim is None:
            raise ValueError(f"{kind.name} has no trim in app/k8s/kinds.py: the view cannot keep it")
        trim = trim_whole(kind.kind, kind.status) if kind.trim == "whole" else TRIMS[kind.trim](kind.kind)
        return cls(kind.name, kind.path, trim, kind.optional)


#: Every kind the live view can keep (``app.k8s.kinds.KINDS`` with a trim), in table order.
RESOURCES: tuple[Resource, ...] = tuple(Resource.of(k) for k in KINDS if k.trim is not None)


def resources_for(kinds: Iterable[str]) -> tuple[Resource, ...]:
    """What to watch for rules that read ``kinds``: a rule set's reads decide the watch
    list, so a rule that reads a new kind gets its watch without a second edit (and a
    kind nobody reads is not watched). A kind with no entry in ``app/k8s/kinds.py`` raises."""
    return tuple(Resource.of(k) for k in read_kinds(kinds))


@dataclass
class Informer:
    """List + watch of one resource into the store."""

    resource: Resource
    store: Store
    client: KubeClient
    page_size: int = 500
    watch_timeout: int = 30
    """``timeoutSeconds`` of each watch: the API server sends a bookmark 2 s before it."""
    synced: bool = False
    absent: bool = False
    disconnected_since: float | None = None
    last_heard: float = field(default_factory=time.monotonic)
    relists: int = 0
    events: int = 0
    bookmarks: int = 0
    hung: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def liveness(self) -> float:
        """Seconds of silence after which a connected watch counts as hung."""
        return self.watch_timeout + LIVENESS_GRACE

    def stale_for(self, now: float) -> float:
        """Seconds this kind may have been missing events (0: it is current)."""
        if self.absent:
            return 0.0  # a CRD that is not installed: looked for again every 30 s
        if self.disconnected_since is not None:
            return now - self.disconnected_since
        silent = now - self.last_heard
        return silent if silent > self.liveness else 0.0

    def _apply(self, obj: dict[str, Any]) -> None:
        trimmed = self.resource.trim(obj)
        meta = obj.get("metadata") or {}
        if trimmed is None:
            self.store.remove(self.resource.kind, meta.get("name", ""), meta.get("namespace"))
            return
        self.store.add(trimmed, self.resource.kind)

    def list(self) -> str:
        """List every page, trimming each as it arrives, then swap the kind's set.

        At most one page of full objects is alive at a time. An object whose
        resourceVersion is unchanged is taken from the store as it is (no second copy
        during a re-list)."""
        kind, trim = self.resource.kind, self.resource.trim
        kept: list[dict[str, Any]] = []
        meta: dict[str, Any] = {}
        for body in pages(self.client, self.resource.path, self.page_size, 60):
            items = body.pop("items", None) or []
            for i, obj in enumerate(items):
                items[i] = None  # drop the full object as soon as it is read
                obj_meta = obj.get("metadata") or {}
                old = self.store.get(kind, obj_meta.get("name", ""), obj_meta.get("namespace"))
                if old is not None and obj_meta.get("resourceVersion") is not None and (
                        (old.get("metadata") or {}).get("resourceVersion")
                        == obj_meta.get("resourceVersion")):
                    kept.append(old)
                    continue
                trimmed = trim(obj)
                if trimmed is not None:
                    kept.append(trimmed)
            del items
            self.last_heard = time.monotonic()
            meta = body.get("metadata") or {}
        self.store.replace(kind, kept)
        self.relists += 1
        return str(meta.get("resourceVersion", ""))

    def watch(self, version: str) -> str | None:
        """Follow events from ``version``; returns the last version, or None to re-list."""
        fields = {"watch": "true", "resourceVersion": version, "allowWatchBookmarks": "true",
                  "timeoutSeconds": self.watch_timeout}
        # The read timeout is the liveness deadline: a healthy watch hears its bookmark
        # before ``watch_timeout`` ends, so a longer silence is a hung connection.
        response = self.client.get(self.resource.path, fields, self.liveness, True)
        self.disconnected_since = None
        self.last_heard = time.monotonic()
        try:
            buffer = b""
            for chunk in response.stream(65536, decode_content=True):
                self.last_heard = time.monotonic()
                if self._stop.is_set():
                    return version
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            return None
                        raise ApiError(int(obj.get("code") or 500), str(obj.get("message")))
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if kind == "BOOKMARK":
                        self.bookmarks += 1
                        continue
                    if kind in ("ADDED", "MODIFIED"):
                        self._apply(obj)
                    elif kind == "DELETED":
                        meta = obj.get("metadata") or {}
                        self.store.remove(self.resource.kind, meta.get("name", ""),
                                          meta.get("namespace"))
                    self.events += 1
        finally:
            response.release_conn()
        return version

    def run(self) -> None:
        backoff = 1.0
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self.list()
                    self.synced, self.absent = True, False
                    self.disconnected_since = None
                version = self.watch(version)
                backoff = 1.0
            except ApiError as exc:
                if exc.status == 404 and self.resource.optional:
                    # CRD not installed: nothing to read; look again later.
                    self.store.replace(self.resource.kind, [])
                    self.synced, self.absent, version = True, True, None
                    self.disconnected_since = None
                    self._stop.wait(30)
                    continue
                if exc.status == 410:
                    version = None
                    continue
                self._failed(exc, backoff)
                backoff = min(backoff * 2, 30)
                version = None
            except Exception as exc:  # connection refused, reset, timeout, bad JSON
                self._failed(exc, backoff)
                backoff = min(backoff * 2, 30)
                version = None

    def _failed(self, exc: Exception, backoff: float) -> None:
        if self.disconnected_since is None:
            # Stale since it last heard anything: for a hung watch that is well before
            # the read timeout fired.
            self.disconnected_since = min(self.last_heard, time.monotonic())
        if "timed out" in str(exc).lower():
            self.hung += 1
        log.warning("watch failed", extra={"fields": {
            "kind": self.resource.kind, "error": f"{type(exc).__name__}: {exc}"[:300],
            "retryIn": backoff}})
        self._stop.wait(backoff)

    def stop(self) -> None:
        self._stop.set()


class LiveView(Store):
    """A :class:`Store` fed by informers; readiness follows their state."""

    def __init__(self, configuration: Configuration, resources: tuple[Resource, ...],
                 staleness: float = 60.0, indexes: Iterable[Index] = ()) -> None:
        super().__init__(indexes=indexes)
        client = KubeClient(configuration)
        self.staleness = staleness
        # A watch hears at least every ``watch_timeout`` s; hung ones are caught within
        # watch_timeout + LIVENESS_GRACE, inside the staleness window (30 + 10 < 60).
        watch_timeout = int(min(290, max(10, staleness / 2)))
        self.informers = [Informer(r, self, client, watch_timeout=watch_timeout)
                          for r in resources]
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for informer in self.informers:
            thread = threading.Thread(target=informer.run, daemon=True,
                                      name=f"watch-{informer.resource.kind}")
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def problems(self, kinds: Iterable[str] | None = None) -> list[str]:
        """Why the view of ``kinds`` (default: all) cannot be trusted now; empty when it can."""
        now = time.monotonic()
        wanted = None if kinds is None else set(kinds)
        out = []
        for informer in self.informers:
            kind = informer.resource.kind
            if wanted is not None and kind not in wanted:
                continue
            if not informer.synced:
                out.append(f"{kind} not synced")
            elif informer.stale_for(now) > self.staleness:
                out.append(f"{kind} watch lost {informer.stale_for(now):.0f}s ago")
        return out
