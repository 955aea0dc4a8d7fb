"""The audit's PolicyReports: made from an :class:`~app.audit.judging.Audit`, and written.

Reports (``wgpolicyk8s.io/v1alpha2``): one ``PolicyReport`` per namespace for
namespaced objects, one ``ClusterPolicyReport`` for cluster-scoped objects (KAI
trees), named ``envelope-audit`` (``-2``, ``-3``... when a namespace's results would
pass :data:`REPORT_BYTES`). Results list everything but passes, which the summary
counts: a namespace of 5,000 passing Deployments fits in one small report.
:func:`write_reports` replaces them by server-side apply and deletes the audit's
reports that the new audit no longer makes.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any
from urllib.parse import quote

import orjson

from app.audit.judging import OUTCOMES, Audit, Result
from app.cluster.kube import ApiError, KubeClient

POLICY = "envelope"
"""The ``source`` of every result, and the ``policy`` of a result no family owns (an
internal error)."""
CATEGORIES = {"workloads": "Workload resources", "quotas": "GPU quota trees",
              "actors": "Actor sandboxes", "exceptions": "Delegated exceptions"}
"""A result's ``category`` by its rule's family; its ``policy`` is ``envelope-<family>``, so
Policy Reporter's per-policy and per-category views split Envelope's results the way the
rule reference does (docs/rules/)."""


@cache
def _families() -> dict[str, str]:
    from app.core.ruleset import default_ruleset
    from app.ruledocs import family

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
