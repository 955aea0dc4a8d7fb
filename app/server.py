"""The HTTPS face: routes, body limits, errors, metrics and logs.

Everything a client can send gets a 2xx decision or a 4xx that says what is
wrong; nothing here lets an exception become a 500.

The application is FastAPI. ``POST /mutate`` and ``/validate`` are raw ASGI endpoints
mounted in its router (:class:`ReviewEndpoint`): raw body in, JSON out, without the
request/response objects and dependency solving that were a third of a review's cost.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.routing import Route

from app.admission import (
    BadReview,
    Decision,
    TooDeep,
    decide,
    parse_review,
    review_response,
    too_deep,
)
from app.callerauth import REASONS, Caller, CallerCheck, CallerTokenError
from app.cluster.view import ClusterView, StaticView
from app.config import Policy
from app.engine import evaluate
from app.httplimits import MAX_BODY
from app.logs import admission_log
from app.rules.base import Phase
from app.ruleset import RuleSet

__all__ = ["MAX_BODY", "Handler", "Metrics", "ReviewEndpoint", "WatchCollector", "create_app",
           "read_body", "send"]


log = logging.getLogger("envelope.admission")


class Metrics:
    """Everything ``/metrics`` exports (documented, one by one, in docs/metrics.md).

    Label values are bounded: kinds outside the rule set are ``other``, operations and
    decisions are fixed words, rule ids come from the rule set."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        if registry is None:  # the standard process and Python collectors
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            GCCollector(registry=self.registry)
        self.requests = Counter("envelope_admission_requests_total",
                                "Admission reviews answered, including malformed requests (4xx)",
                                ("endpoint", "kind", "operation", "decision"), registry=self.registry)
        self.latency = Histogram(
            "envelope_admission_duration_seconds", "Time to answer an admission review",
            ("endpoint", "kind", "decision"), registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        self.rule_results = Counter("envelope_rule_results_total",
                                    "Rule results per review: pass, fail, warn, skip, error",
                                    ("rule", "result"), registry=self.registry)
        self.patches = Counter("envelope_patches_total", "Reviews answered with a JSON patch",
                               ("kind",), registry=self.registry)
        self.leader = Gauge("envelope_leader",
                            "1 while this replica holds the certificate Lease (--tls-mode self)",
                            registry=self.registry)
        self._children: dict[tuple[Any, ...], Any] = {}
        self.watches = WatchCollector(None)
        """Set ``.view`` to a live view to export its watch health."""
        self.registry.register(self.watches)
        self.exemptions = Counter("envelope_rule_exemptions_total",
                                  "Rules not run on an object because it is exempt (policy "
                                  "exceptions or the object's exemption annotation)", ("rule",),
                                  registry=self.registry)
        self.cert_expiry = Gauge("envelope_certificate_expiry_timestamp_seconds",
                                 "When the serving certificate in use expires (Unix time)",
                                 registry=self.registry)
        self.caller_keys_read = Gauge(
            "envelope_caller_token_keys_read_timestamp_seconds",
            "When the API server's keys and our webhook configurations were last read for "
            "caller tokens (Unix time; 0 until the first read)", registry=self.registry)
        self.caller_tokens = Counter(
            "envelope_caller_tokens_total",
            "Review requests by what their caller token (KEP-6060) was: valid, missing, or why "
            "it was refused (refused in enforce mode, only counted in warn mode)",
            ("mode", "result"), registry=self.registry)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: a review touches a dozen series, and
        ``labels()`` takes a lock and builds its key each time (~2 µs a call). Label
        values are bounded (see above), so this holds as many entries as series."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found


#: FastAPI >= 0.165 traces every request through OpenTelemetry when it is installed (it
#: is a FastAPI dependency), asking for the global providers on each one: ~15 µs a
#: review. Envelope exports Prometheus metrics and JSON logs, not OpenTelemetry.
_NO_OTEL: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters else {})


def _error(status: int, message: str) -> tuple[int, bytes]:
    return status, orjson.dumps({"error": message})


Handler = Callable[[bytes, Caller | None], Awaitable[tuple[int, bytes]]]
_JSON = [(b"content-type", b"application/json")]
_CHALLENGE = [(b"www-authenticate", b'Bearer realm="envelope"')]


class ReviewEndpoint:
    """A raw ASGI endpoint for one review path: ``POST`` with a body, answered by
    ``handler``; any other method gets 405. With ``caller`` (KEP-6060 tokens), the
    caller's token is checked before the body is read: in enforce mode a request
    without a good one gets 401 and is never parsed."""

    def __init__(self, handler: Handler, on_malformed: Callable[[], None] | None = None,
                 caller: CallerCheck | None = None) -> None:
        self.handler = handler
        self.on_malformed = on_malformed
        self.caller = caller

    async def __call__(self, scope: dict[str, Any], receive: Any, send_: Any) -> None:
        if scope["method"] != "POST":
            status, payload = _error(405, "use POST with an AdmissionReview")
            await send(send_, status, payload, [(b"allow", b"POST")])
        else:
            media = _content_type(scope)
            who: Caller | CallerTokenError | None = None
            if self.caller is not None:
                who = await self.caller.check(scope.get("headers", ()), scope["path"])
            extra: list[tuple[bytes, bytes]] = []
            if isinstance(who, CallerTokenError) and self.caller and self.caller.mode == "enforce":
                status, payload = _error(401, f"caller token refused ({who.reason}): {who.detail}")
                extra = _CHALLENGE
            elif media != b"application/json":
                # As controller-runtime's webhook server: the API server always sends JSON.
                shown = media.decode("latin-1")[:80] if media else "none"
                status, payload = _error(415, f"Content-Type must be application/json, got {shown}")
            else:
                body = await read_body(scope, receive)
                caller = who if isinstance(who, Caller) else None
                if isinstance(body, tuple):
                    status, payload = body
                else:  # the handler counts the caller once it knows the review's groups
                    status, payload = await self.handler(body, caller)
                    who = None
            if isinstance(who, Caller) and self.caller is not None:
                self.caller.count("valid")  # never reached the review: no group to check
            await send(send_, status, payload, extra)
        if status >= 400 and self.on_malformed is not None:
            self.on_malformed()


def _content_type(scope: dict[str, Any]) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower()
    return b""


async def send(send_: Any, status: int, payload: bytes,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [*_JSON, (b"content-length", str(len(payload)).encode()), *(extra or [])]
    await send_({"type": "http.response.start", "status": status, "headers": headers})
    await send_({"type": "http.response.body", "body": payload})


async def read_body(scope: dict[str, Any], receive: Any) -> bytes | tuple[int, bytes]:
    """The whole body, or a 4xx. The cap is ``--max-body-bytes`` as the guarded protocol
    (app/httplimits.py, which enforces it on the wire too) hands it over, else MAX_BODY."""
    cap = scope.get("extensions", {}).get("envelope.max_body_bytes", MAX_BODY)
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            if not value.isdigit():
                return _error(400, "Content-Length is not a number")
            if int(value) > cap:
                return _error(413, f"body of {value.decode()} bytes exceeds the {cap}-byte "
                                   f"limit (envelope serve --max-body-bytes)")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _error(400, "client disconnected before the body was complete")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return _error(413, f"body exceeds the {cap}-byte limit (envelope serve --max-body-bytes)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def create_app(
    rules: RuleSet,
    policy: Policy,
    view: ClusterView | None = None,
    ready_checks: dict[str, Callable[[], list[str]]] | None = None,
    metrics: Metrics | None = None,
    caller: CallerCheck | None = None,
) -> FastAPI:
    """Build the webhook app. ``ready_checks`` gate ``/readyz``: each returns its
    problems (caches not synced, no certificate), empty when ready. ``caller``: check
    KEP-6060 caller tokens on the review paths (``app.callerauth``)."""
    app = FastAPI(title="Envelope", docs_url=None, redoc_url=None, openapi_url=None, **_NO_OTEL)
    app.state.policy = policy
    app.state.view = view or StaticView()
    app.state.metrics = metrics or Metrics()
    checks = ready_checks if ready_checks is not None else {}
    known_kinds = {kind for _, kind in rules.kinds}
    checker = caller
    if checker is not None:
        m0: Metrics = app.state.metrics
        counters = {reason: m0.caller_tokens.labels(checker.mode, reason) for reason in REASONS}
        checker.count = lambda reason: counters[reason].inc()

    async def review(body: bytes, phase: Phase, caller: Caller | None) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            uid, subject = parse_review(body)
        except TooDeep as exc:
            if caller is not None and checker is not None:
                checker.count("valid")
            return 200, review_response(exc.uid, too_deep(app.state.policy.failure_mode))
        except (BadReview, RecursionError, ValueError, TypeError) as exc:  # all 400s
            if caller is not None and checker is not None:
                checker.count("valid")  # a good token, a body that is not a review
            if isinstance(exc, BadReview):
                return _error(400, f"not an AdmissionReview: {exc}")
            return _error(400, f"not an AdmissionReview: {type(exc).__name__}")  # defence in depth
        if caller is not None and checker is not None:
            refused = checker.judged(caller, (subject.group, subject.api_group), f"/{phase}")
            if refused is not None and checker.mode == "enforce":
                return _error(403, f"caller token refused (api-group): {refused.detail}")
        policy: Policy = app.state.policy
        try:
            evaluation = evaluate(rules, subject, app.state.view, policy, phase)
            decision = decide(evaluation, policy.failure_mode)
        except Exception as exc:  # defence in depth: the engine already isolates rules
            log.exception("evaluation failed", extra={"uid": uid})
            evaluation = None
            allowed = policy.failure_mode == "allow"
            decision = Decision(allowed, f"Envelope internal error: {type(exc).__name__}",
                                500)
        elapsed = time.perf_counter() - started
        m: Metrics = app.state.metrics
        # Bounded label values: whoever reaches the port must not grow our series.
        kind = subject.kind if subject.kind in known_kinds else "other"
        operation = subject.operation  # parse_review admits four words only
        m.child(m.requests, phase, kind, operation, decision.word).inc()
        m.child(m.latency, phase, kind, decision.word).observe(elapsed)
        if evaluation is not None:
            for rule_id, result in evaluation.results.items():
                m.child(m.rule_results, rule_id, result).inc()
            if decision.patch:
                m.patches.labels(kind).inc()
        if evaluation is not None:
            for rule_id in evaluation.skipped:
                m.exemptions.labels(rule_id).inc()  # rule ids come from the rule set: bounded
        if admission_log.enabled:
            record: dict[str, Any] = {
                "uid": uid, "kind": subject.kind, "namespace": subject.namespace,
                "name": subject.name, "operation": subject.operation, "endpoint": phase,
                "dryRun": subject.dry_run, "decision": decision.word,
                "user": subject.user, "groups": subject.groups,
                "rules": evaluation.rule_ids if evaluation else [],
                "durationMs": round(elapsed * 1000, 3),
            }
            if evaluation and evaluation.internal_errors:
                record["internalErrors"] = evaluation.internal_errors
            if evaluation and evaluation.skipped:
                record["exempted"] = evaluation.skipped
            if not decision.allowed:
                record["message"] = decision.message  # cut by app.logs, like every field
            admission_log.write(record)
        try:
            return 200, review_response(uid, decision)
        except (TypeError, orjson.JSONEncodeError) as exc:  # e.g. a patch nested past orjson's limit
            return 200, review_response(uid, Decision(
                False, f"Envelope cannot encode an answer for this object ({exc}); it nests too "
                       f"deeply to be a Kubernetes object", 400))

    async def mutate(body: bytes, caller: Caller | None) -> tuple[int, bytes]:
        return await review(body, "mutate", caller)

    async def validate(body: bytes, caller: Caller | None) -> tuple[int, bytes]:
        return await review(body, "validate", caller)

    async def healthz(request: Request) -> Response:
        return Response(b"ok", media_type="text/plain")

    async def readyz(request: Request) -> Response:
        failing = [f"{name}: {problem}" for name, check in checks.items()
                   for problem in check()]
        if failing:
            return Response(("not ready: " + "; ".join(failing)).encode(), status_code=503,
                            media_type="text/plain")
        return Response(b"ok", media_type="text/plain")

    app.add_route("/healthz", healthz, methods=["GET"])
    app.add_route("/readyz", readyz, methods=["GET"])

    # First in the router: a review matches on the first route it is compared with.
    metrics_ = app.state.metrics

    def malformed(endpoint: str) -> Callable[[], None]:
        return metrics_.requests.labels(endpoint, "other", "", "malformed").inc

    app.router.routes[:0] = [
        Route("/mutate", ReviewEndpoint(mutate, malformed("mutate"), checker)),
        Route("/validate", ReviewEndpoint(validate, malformed("validate"), checker))]
    return app


class WatchCollector:
    """Watch health per kind, read from the live view's informers at scrape time."""

    def __init__(self, view: Any) -> None:
        self.view = view

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        synced = GaugeMetricFamily("envelope_watch_synced",
                                   "1 once the kind's first list completed and while it is current",
                                   labels=["kind"])
        age = GaugeMetricFamily("envelope_watch_last_event_age_seconds",
                                "Seconds since the kind's watch last heard from the API server "
                                "(an event or a bookmark)", labels=["kind"])
        relists = CounterMetricFamily("envelope_watch_relists",
                                      "Full re-lists of the kind (410 Gone, a broken or hung watch)",
                                      labels=["kind"])
        now = time.monotonic()
        for informer in getattr(self.view, "informers", ()):
            kind = informer.resource.kind
            stale = informer.stale_for(now) > getattr(self.view, "staleness", float("inf"))
            synced.add_metric([kind], 1.0 if informer.synced and not stale else 0.0)
            heard = getattr(informer, "last_heard", None)
            if heard is not None:
                age.add_metric([kind], max(0.0, now - heard))
            relists.add_metric([kind], float(informer.relists))
        yield synced
        yield age
        yield relists
