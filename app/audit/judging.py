"""``envelope audit``: judge what already runs, and write PolicyReports.

An audit reads, once, every kind the rules read (trimmed as the webhook's live view
trims them, into a :class:`~app.cluster.view.Store` with the rule set's indexes), then
lists every kind the rules judge, page by page, and judges each object as it stands:
a CREATE through :func:`app.engine.check_object`, the same call ``envelope check``
makes, so a result is exactly what the webhook pair would answer if the object were
written again today. Nothing is written to the objects: a mutation the webhook would
make is reported as a ``warn`` result carrying the RFC 6902 patch in its properties.

Only the objects a user writes are judged: a Pod whose controller is a judged kind
(a ReplicaSet, a Job...), a ReplicaSet of a Deployment and a Job of a CronJob are
counted as ``owned`` and skipped, since their controller's result already says it
(``include_owned`` judges them too).

Results follow the policy's modes: a rule in ``warn`` mode yields ``warn`` results
whose message is the webhook's warning. Per (object, rule):

=========  ==============================================================
``pass``   the rule applies (mode not ``off``) and found nothing
``fail``   an error: the webhook would refuse this object
``warn``   a warning, or a change the mutating webhook would make
``error``  the rule crashed or what it reads was not current
``skip``   the object is exempt (policy exceptions, the exempt annotation)
=========  ==============================================================

Reports (``wgpolicyk8s.io/v1alpha2``): one ``PolicyReport`` per namespace for
namespaced objects, one ``ClusterPolicyReport`` for cluster-scoped objects (KAI
trees), named ``envelope-audit`` (``-2``, ``-3``... when a namespace's results would
pass :data:`REPORT_BYTES`). Results list everything but passes, which the summary
counts: a namespace of 5,000 passing Deployments fits in one small report.
:func:`write_reports` replaces them by server-side apply and deletes the audit's
reports that the new audit no longer makes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal
from urllib.parse import quote

import orjson
from prometheus_client import CollectorRegistry, Gauge

from app.cluster.kube import ApiError, KubeClient, pages
from app.cluster.live import Informer, Resource, resources_for
from app.cluster.view import Store
from app.config import Policy
from app.engine import check_object
from app.exemptions import needs_namespaces
from app.kinds import KINDS, Kind
from app.rules.base import Subject
from app.ruleset import RuleSet

__all__ = ["AUDIT_SCHEMA", "JUDGED", "POLICY", "REPORT_BYTES", "Audit", "AuditMetrics", "Auditor", "Judged",
           "Result", "audit", "judge", "judged_for", "load_view", "policy_reports", "read_kinds",
           "summary_text", "write_reports"]

log = logging.getLogger("envelope.audit")

AUDIT_SCHEMA = "audit/v1"
"""``schemaVersion`` of ``audit -o json`` (docs/schemas/audit-output.v1.json)."""
POLICY = "envelope"
"""The ``source`` of every result, and the ``policy`` of a result no family owns (an
internal error)."""
CATEGORIES = {"workloads": "Workload resources", "quotas": "GPU quota trees",
              "actors": "Actor sandboxes"}
"""A result's ``category`` by its rule's family; its ``policy`` is ``envelope-<family>``, so
Policy Reporter's per-policy and per-category views split Envelope's results the way the
rule reference does (docs/rules/)."""


@cache
def _families() -> dict[str, str]:
    from app.ruledocs import family
    from app.ruleset import default_ruleset

    return {r.id: family(r) for r in default_ruleset().values()}


def policy_of(rule_id: str) -> tuple[str, str]:
    """(policy, category) of a rule's results."""
    fam = _families().get(rule_id)
    return (f"{POLICY}-{fam}", CATEGORIES[fam]) if fam else (POLICY, "Envelope")
REPORT_NAME = "envelope-audit"
REPORT_GROUP = "wgpolicyk8s.io"
REPORT_VERSION = "v1alpha2"
MANAGED = {"app.kubernetes.io/managed-by": "envelope", "envelope.io/report": "audit"}
SELECTOR = ",".join(f"{k}={v}" for k, v in MANAGED.items())
WRITERS = 8
"""Reports applied at once (the API server's default max-in-flight is 400 mutating)."""
REPORT_BYTES = 512 * 1024
"""Results per report object, in JSON bytes: etcd refuses objects over 1.5 MiB by
default, and a smaller object keeps every reader's watch cheap."""

Outcome = Literal["pass", "fail", "warn", "error", "skip"]
OUTCOMES: tuple[Outcome, ...] = ("pass", "fail", "warn", "error", "skip")


Judged = Kind
"""A kind the rules judge, and where to list it (``app.kinds.Kind``)."""

JUDGED: tuple[Kind, ...] = KINDS
"""Every kind with a list path; :func:`judged_for` picks those a rule set judges."""

#: Controllers whose objects are skipped as ``owned``: (owner kind, owned kind).
OWNERS: frozenset[tuple[str, str]] = frozenset({
    ("ReplicaSet", "Pod"), ("ReplicationController", "Pod"), ("StatefulSet", "Pod"),
    ("DaemonSet", "Pod"), ("Job", "Pod"), ("Deployment", "ReplicaSet"), ("CronJob", "Job"),
})


def judged_for(rules: RuleSet) -> tuple[Judged, ...]:
    """What to list for ``rules``: every kind they judge (a kind with no entry in
    :data:`JUDGED` is a programming error, said at start)."""
    wanted = rules.kinds
    missing = wanted - {j.ref for j in JUDGED}
    if missing:
        raise ValueError(f"no list path for judged kind(s) {sorted(missing)}; add them to "
                         f"KINDS in app/kinds.py")
    return tuple(j for j in JUDGED if j.ref in wanted)


@dataclass(frozen=True, slots=True)
class Result:
    """One rule's result on one object."""

    rule: str
    result: Outcome
    message: str
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""
    properties: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "result": self.result, "message": self.message,
                "apiVersion": self.api_version, "kind": self.kind,
                "namespace": self.namespace, "name": self.name,
                "properties": dict(self.properties)}


@dataclass
class Audit:
    """What one audit found."""

    results: list[Result] = field(default_factory=list)
    """Everything but passes."""
    passes: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(namespace, rule) -> objects that passed."""
    namespaces: set[str] = field(default_factory=set)
    """Every namespace with at least one judged object ("" for cluster scope)."""
    objects: int = 0
    owned: int = 0
    absent: list[str] = field(default_factory=list)
    """Optional kinds whose CRD is not installed."""
    started: float = 0.0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """``audit -o json`` (schema ``AUDIT_SCHEMA``)."""
        counts = [{"namespace": ns, "rule": rule_id, "result": res, "count": n}
                  for (ns, rule_id, res), n in sorted(self.counts().items())]
        return {"schemaVersion": AUDIT_SCHEMA, "objects": self.objects, "owned": self.owned,
                "absent": self.absent, "seconds": round(self.seconds, 3), "summary": counts,
                "results": [r.as_dict() for r in self.results]}

    def counts(self) -> Counter[tuple[str, str, str]]:
        """(namespace, rule, result) -> results, passes included."""
        out: Counter[tuple[str, str, str]] = Counter()
        for (ns, rule_id), n in self.passes.items():
            out[(ns, rule_id, "pass")] += n
        for r in self.results:
            out[(r.namespace, r.rule, r.result)] += 1
        return out


def _text(path: str, message: str) -> str:
    return f"{path}: {message}" if path else message


def judge(rules: RuleSet, view: Any, policy: Policy, obj: dict[str, Any], judged: Judged,
          out: Audit) -> None:
    """Judge one object as it stands (a CREATE of itself) and add its results to ``out``."""
    meta = obj.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    subject = Subject(judged.group, judged.version, judged.kind, "CREATE", namespace, name, obj)
    evaluation = check_object(rules, subject, view, policy)
    ref = (judged.api_version, judged.kind, namespace, name, str(meta.get("uid") or ""))
    out.objects += 1
    out.namespaces.add(namespace)
    modes = rules.modes(policy)
    reported: set[str] = set()
    patch = orjson.dumps(evaluation.patch).decode() if evaluation.patch else ""
    for f in evaluation.findings:
        outcome: Outcome = "fail" if f.severity == "error" else "warn"
        props = [("mode", modes[f.rule].value)]
        if f.path:
            props.append(("path", f.path))
        out.results.append(Result(f.rule, outcome, _text(f.path, f.message), *ref,
                                  properties=tuple(props)))
        reported.add(f.rule)
    for f in evaluation.changes:
        props = [("mode", modes[f.rule].value), ("change", "the mutating webhook would make "
                                                 "this change on the object's next write")]
        if f.path:
            props.append(("path", f.path))
        if patch:
            props.append(("patch", patch))
        out.results.append(Result(f.rule, "warn", _text(f.path, f"would change: {f.message}"),
                                  *ref, properties=tuple(props)))
        reported.add(f.rule)
    for problem in evaluation.internal_errors:
        rule_id = problem.rule if problem.rule in rules else "internal"
        out.results.append(Result(rule_id, "error", problem.message, *ref,
                                  properties=(("mode", modes[rule_id].value
                                               if rule_id in modes else ""),)))
        reported.add(rule_id)
    for rule_id, why in evaluation.skipped.items():
        if rule_id not in reported:
            out.results.append(Result(rule_id, "skip", f"exempt: {why}", *ref,
                                      properties=(("mode", modes[rule_id].value),)))
            reported.add(rule_id)
    for phase in ("mutate", "validate"):
        for r, _ in rules.applicable(judged.group, judged.kind, phase, "CREATE", policy):
            if r.id in reported or (r.requires is not None and not r.requires(subject, obj)):
                continue  # reported, or does not apply to this object (as the engine gates)
            out.passes[(namespace, r.id)] += 1
            reported.add(r.id)


def _owned(obj: dict[str, Any], kind: str) -> bool:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller") and (ref.get("kind"), kind) in OWNERS:
            return True
    return False


def _pages(client: KubeClient, path: str, page_size: int) -> Iterator[list[dict[str, Any]]]:
    """The items of each page (``app.cluster.kube.pages``)."""
    for body in pages(client, path, page_size, 60):
        yield body.get("items") or []


def read_kinds(rules: RuleSet, policy: Policy) -> frozenset[str]:
    """What the audit's view must hold: what the rules read, and Namespaces when the
    policy's exceptions select namespaces by label."""
    return rules.reads | ({"Namespace"} if needs_namespaces(policy) else frozenset())


def load_view(client: KubeClient, rules: RuleSet, policy: Policy,
              page_size: int = 500) -> tuple[Store, list[str]]:
    """One LIST of every kind the audit reads, trimmed as the live view trims them.
    Returns the view and the optional kinds that are not installed."""
    view = Store(indexes=rules.indexes)
    absent: list[str] = []
    for resource in resources_for(read_kinds(rules, policy)):
        # Trimmed page by page (an Informer's list keeps every full object of the kind
        # until the last page: 8,000 Deployments are 80 MiB that way).
        trimmed: list[dict[str, Any]] = []
        try:
            for page in _pages(client, resource.path, page_size):
                trimmed.extend(t for t in map(resource.trim, page) if t is not None)
        except ApiError as exc:
            if exc.status == 404 and resource.optional:
                view.replace(resource.kind, [])
                absent.append(resource.kind)
                continue
            raise
        view.replace(resource.kind, trimmed)
    return view, absent


def audit(client: KubeClient, rules: RuleSet, policy: Policy, *, view: Any = None,
          include_owned: bool = False, page_size: int = 500) -> Audit:
    """List and judge every object the rules judge. ``view``: what the rules read
    (default: one LIST of each kind, :func:`load_view`)."""
    out = Audit(started=time.time())
    begun = time.perf_counter()
    if view is None:
        view, out.absent = load_view(client, rules, policy, page_size=page_size)
    for judged in judged_for(rules):
        try:
            for page in _pages(client, judged.path, page_size):
                for obj in page:
                    obj.setdefault("apiVersion", judged.api_version)
                    obj.setdefault("kind", judged.kind)
                    meta = obj.get("metadata")
                    if isinstance(meta, dict):
                        meta.pop("managedFields", None)
                    if not include_owned and _owned(obj, judged.kind):
                        out.owned += 1
                        continue
                    judge(rules, view, policy, obj, judged, out)
        except ApiError as exc:
            if exc.status == 404 and judged.optional:
                if judged.kind not in out.absent:
                    out.absent.append(judged.kind)
                continue
            raise
    out.seconds = time.perf_counter() - begun
    return out


# --- reports -------------------------------------------------------------------------


def _timestamp(when: float) -> dict[str, int]:
    seconds = int(when)
    return {"seconds": seconds, "nanos": int((when - seconds) * 1e9)}


def _report_result(r: Result, when: dict[str, int]) -> dict[str, Any]:
    resource: dict[str, Any] = {"apiVersion": r.api_version, "kind": r.kind, "name": r.name}
    if r.namespace:
        resource["namespace"] = r.namespace
    if r.uid:
        resource["uid"] = r.uid
    policy, category = policy_of(r.rule)
    out: dict[str, Any] = {"policy": policy, "rule": r.rule, "category": category,
                           "result": r.result,
                           "message": r.message, "source": POLICY, "scored": True,
                           "timestamp": dict(when), "resources": [resource]}
    if r.result == "fail":
        out["severity"] = "high"
    elif r.result in ("warn", "error"):
        out["severity"] = "medium"
    if r.properties:
        out["properties"] = dict(r.properties)
    return out


def _summary(items: Iterable[str], passes: int = 0) -> dict[str, int]:
    counted = Counter(items)
    counted["pass"] += passes
    return {k: counted[k] for k in OUTCOMES}


def policy_reports(found: Audit, labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The PolicyReports (per namespace) and ClusterPolicyReports the audit makes.

    Every namespace with a judged object gets a report, empty results included, so a
    fixed object leaves its namespace's report. Passes are counted in the summary of
    a namespace's first report only."""
    when = _timestamp(found.started or time.time())
    by_ns: dict[str, list[Result]] = {ns: [] for ns in found.namespaces}
    for r in found.results:
        by_ns.setdefault(r.namespace, []).append(r)
    passes: Counter[str] = Counter()
    for (ns, _), n in found.passes.items():
        passes[ns] += n
    meta_labels = {**MANAGED, **(labels or {})}
    reports: list[dict[str, Any]] = []
    for ns in sorted(by_ns):
        items = sorted(by_ns[ns], key=lambda r: (r.kind, r.name, r.rule, r.result, r.message))
        shards: list[list[dict[str, Any]]] = [[]]
        size = 0
        for r in items:
            entry = _report_result(r, when)
            n = len(orjson.dumps(entry))
            if shards[-1] and size + n > REPORT_BYTES:
                shards.append([])
                size = 0
            shards[-1].append(entry)
            size += n
        for i, shard in enumerate(shards):
            name = REPORT_NAME if i == 0 else f"{REPORT_NAME}-{i + 1}"
            metadata: dict[str, Any] = {"name": name, "labels": dict(meta_labels)}
            if ns:
                metadata["namespace"] = ns
            reports.append({
                "apiVersion": f"{REPORT_GROUP}/{REPORT_VERSION}",
                "kind": "PolicyReport" if ns else "ClusterPolicyReport",
                "metadata": metadata,
                "summary": _summary((e["result"] for e in shard), passes[ns] if i == 0 else 0),
                "results": shard,
            })
    return reports


def _collection(kind: str, namespace: str | None) -> str:
    base = f"/apis/{REPORT_GROUP}/{REPORT_VERSION}"
    if kind == "ClusterPolicyReport":
        return f"{base}/clusterpolicyreports"
    if namespace is None:
        return f"{base}/policyreports"
    return f"{base}/namespaces/{quote(namespace)}/policyreports"


def _request(client: KubeClient, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    """A request, retried while the API server answers 429 (a CRD's storage that is
    still initialising, API priority and fairness): up to ~10 s, as client-go's
    default retries honour Retry-After."""
    for attempt in range(10):
        try:
            return client.request(method, path, body, **kw)
        except ApiError as exc:
            if exc.status != 429 or attempt == 9:
                raise
            time.sleep(1.0)
    raise AssertionError("unreachable")


def write_reports(client: KubeClient, reports: list[dict[str, Any]]) -> tuple[int, int]:
    """Apply ``reports`` (server-side apply, field manager ``envelope-audit``: the
    results list is replaced whole) and delete the audit's reports not among them.
    Returns (applied, deleted). A namespace deleted meanwhile is skipped."""
    try:
        _request(client, "GET", f"/apis/{REPORT_GROUP}/{REPORT_VERSION}")
    except ApiError as exc:
        if exc.status == 404:
            raise ApiError(404, f"the report CRDs ({REPORT_GROUP}/{REPORT_VERSION}) are not "
                                f"installed: install the chart with audit.installCRDs=true, or "
                                f"kubectl apply -f charts/envelope/files/crds/") from None
        raise
    keep = {(r["kind"], r["metadata"].get("namespace") or "", r["metadata"]["name"])
            for r in reports}

    def apply(report: dict[str, Any]) -> int:
        meta = report["metadata"]
        ns = meta.get("namespace")
        path = f"{_collection(report['kind'], ns)}/{quote(meta['name'])}"
        try:
            _request(client, "PATCH", f"{path}?fieldManager=envelope-audit&force=true", report,
                     content_type="application/apply-patch+yaml", timeout=30)
            return 1
        except ApiError as exc:
            if exc.status == 404 and ns:  # the namespace is gone (or going)
                return 0
            raise

    with ThreadPoolExecutor(WRITERS) as pool:  # one report per namespace: in parallel
        applied = sum(pool.map(apply, reports))
    deleted = 0
    for kind in ("PolicyReport", "ClusterPolicyReport"):
        listed = _request(client, "GET", f"{_collection(kind, None)}?labelSelector="
                                         f"{quote(SELECTOR)}", timeout=30)
        for item in listed.get("items") or []:
            meta = item.get("metadata") or {}
            ns, name = meta.get("namespace") or "", meta.get("name") or ""
            if (kind, ns, name) in keep:
                continue
            try:
                _request(client, "DELETE", f"{_collection(kind, ns or None)}/{quote(name)}")
                deleted += 1
            except ApiError as exc:
                if exc.status != 404:
                    raise
    return applied, deleted


# --- text ----------------------------------------------------------------------------


def summary_text(found: Audit) -> str:
    """A table per rule and namespace (results other than pass), then the totals."""
    lines = []
    counts = found.counts()
    rows = sorted((rule_id, ns, res, n) for (ns, rule_id, res), n in counts.items()
                  if res != "pass")
    for r in sorted(found.results, key=lambda r: (r.namespace, r.kind, r.name, r.rule)):
        where = f"{r.namespace}/{r.name}" if r.namespace else r.name
        lines.append(f"{r.result:<5} {r.kind} {where} {r.rule}: {r.message}")
    if lines:
        lines.append("")
    if rows:
        lines.append(f"{'RULE':<34} {'NAMESPACE':<24} {'RESULT':<6} COUNT")
        for rule_id, ns, res, n in rows:
            lines.append(f"{rule_id:<34} {ns or '(cluster)':<24} {res:<6} {n}")
        lines.append("")
    totals: Counter[str] = Counter()
    for (_, _, res), n in counts.items():
        totals[res] += n
    absent = f"; not installed: {', '.join(found.absent)}" if found.absent else ""
    lines.append(f"{found.objects} objects audited ({found.owned} owned by a controller, "
                 f"judged through it){absent} in {found.seconds:.1f}s: "
                 + ", ".join(f"{totals[k]} {k}" for k in OUTCOMES))
    return "\n".join(lines) + "\n"


# --- in the cluster ----------------------------------------------------------------


class AuditMetrics:
    """Gauges of the last successful audit. Registered on ``registry`` (the server's
    ``Metrics.registry`` when the audit runs inside ``envelope serve``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.violations = Gauge(
            "envelope_audit_violations",
            "Results other than pass of the last audit, by rule, namespace and result",
            ("rule", "namespace", "result"), registry=self.registry)
        self.objects = Gauge("envelope_audit_objects", "Objects judged by the last audit",
                             registry=self.registry)
        self.last_success = Gauge("envelope_audit_last_success_timestamp_seconds",
                                  "When the last audit that wrote its reports finished "
                                  "(Unix time)", registry=self.registry)
        self.duration = Gauge("envelope_audit_duration_seconds",
                              "How long the last successful audit took",
                              registry=self.registry)
        self.failures = Gauge("envelope_audit_consecutive_failures",
                              "Audits that failed since the last success",
                              registry=self.registry)
        self._series: set[tuple[str, str, str]] = set()
        from app.quotametrics import QuotaMetrics  # the quota-tree gauges (app/quotametrics.py)

        self.quotas = QuotaMetrics(self.registry)

    def observe(self, found: Audit) -> None:
        now = {k: n for k, n in found.counts().items() if k[2] != "pass"}
        series = {(rule_id, ns, res) for ns, rule_id, res in now}
        for gone in self._series - series:  # fixed or deleted: the series leaves
            self.violations.remove(*gone)
        for (ns, rule_id, res), n in now.items():
            self.violations.labels(rule_id, ns, res).set(n)
        self._series = series
        self.objects.set(found.objects)
        self.duration.set(found.seconds)
        self.last_success.set(time.time())
        self.failures.set(0)


def _fingerprint(kind: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """What the change trigger keeps of a judged object: its key and a hash of all but
    status and bookkeeping metadata, so a status heartbeat is not a change."""

    def trim(obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj.get("metadata") or {}
        body = {k: v for k, v in obj.items() if k not in ("status", "metadata")}
        body["labels"] = meta.get("labels")
        body["annotations"] = meta.get("annotations")
        body["owners"] = meta.get("ownerReferences")
        return {"kind": kind, "metadata": {k: meta[k] for k in ("name", "namespace") if k in meta},
                "h": hash(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))}

    return trim


class Auditor:
    """Runs the audit on start, on change (debounced) and every ``interval`` seconds,
    writing the reports and metrics each time.

    Changes come from watches of every kind the rules read or judge (client-go style
    list + watch, :class:`~app.cluster.live.Informer`) into a store that keeps, per
    object, only a hash of what a rule could judge: the store's versions move only
    on a real change. The kinds the rules read are kept trimmed in a second store,
    which is the audit's view (no re-LIST of them per audit)."""

    def __init__(self, client: KubeClient, rules: RuleSet, policy: Policy,
                 metrics: AuditMetrics, *, interval: float = 600.0, debounce: float = 10.0,
                 include_owned: bool = False) -> None:
        self.client, self.rules, self.policy, self.metrics = client, rules, policy, metrics
        self.interval, self.debounce, self.include_owned = interval, debounce, include_owned
        self.view = Store(indexes=rules.indexes)
        self.changes = Store()
        read = resources_for(read_kinds(rules, policy))
        judged = [Resource(j.name, j.path, _fingerprint(j.kind), j.optional)
                  for j in judged_for(rules)]
        self.informers = [Informer(r, self.view, client) for r in read] + \
                         [Informer(r, self.changes, client) for r in judged]
        self._stop = threading.Event()
        self.last: Audit | None = None

    def _versions(self) -> tuple[int, ...]:
        kinds = [i.resource.kind for i in self.informers]
        return (*(self.view.version(k) for k in kinds), *(self.changes.version(k) for k in kinds))

    def synced(self) -> bool:
        return all(i.synced for i in self.informers)

    def run_once(self) -> Audit:
        try:
            found = audit(self.client, self.rules, self.policy, view=self.view,
                          include_owned=self.include_owned)
            found.absent = [i.resource.kind for i in self.informers if i.absent]
            applied, deleted = write_reports(self.client, policy_reports(found))
        except Exception as exc:
            self.metrics.failures.inc()
            log.warning("audit failed", extra={"fields": {
                "error": f"{type(exc).__name__}: {exc}"[:300]}})
            raise
        self.metrics.observe(found)
        self.metrics.quotas.observe(self.view)
        self.last = found
        log.info("audit done", extra={"fields": {
            "objects": found.objects, "results": len(found.results), "reports": applied,
            "deletedReports": deleted, "seconds": round(found.seconds, 3)}})
        return found

    def run(self) -> None:
        for informer in self.informers:
            threading.Thread(target=informer.run, daemon=True,
                             name=f"audit-watch-{informer.resource.kind}").start()
        while not self.synced() and not self._stop.wait(0.5):
            pass
        seen = self._versions()
        periodic = 0.0  # audit at once on start
        settled: float | None = None  # when a change has settled
        pending = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            versions = self._versions()
            if versions != seen:
                # A change: audit once nothing changed for `debounce` seconds, and at
                # the latest 6 debounces after the first change.
                seen = versions
                pending = now if settled is None else pending
                settled = min(now + self.debounce, pending + 6 * self.debounce)
            if now >= periodic or (settled is not None and now >= settled):
                settled = None
                try:
                    self.run_once()
                    periodic = time.monotonic() + self.interval
                except Exception:
                    periodic = time.monotonic() + min(self.interval, 30.0)
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()

