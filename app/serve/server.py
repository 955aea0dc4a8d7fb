"""The HTTPS face: routes, body limits, errors, metrics and logs.

Everything a client can send gets a 2xx decision or a 4xx that says what is wrong;
nothing here lets an exception become a 500. ``POST /mutate`` and ``/validate`` are raw
ASGI endpoints (:class:`ReviewEndpoint`: method, caller token, media type, body limits),
then :meth:`Reviews.decode`, the caller's attested group (``CallerCheck.settle``), the
``admission.Handler`` and :meth:`Reviews.answer` (metrics, the log line, the encoded
response), in that order and in one place each: docs/architecture.md, "A request,
from bytes to verdict". ``POST /validate/in-tree/<rule,rule>`` (:class:`InTreeEndpoint`) is
``/validate`` without the named rules (docs/in-tree.md, "Validation").

Why one module of ~453 lines: the endpoints, their metrics and the app that mounts them
are the one path every review takes; a status code or a metric label is decided here and
nowhere else.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import orjson
from fastapi import FastAPI
from fastapi import Request as Request_
from fastapi.responses import Response as Response_
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
from starlette.types import Receive, Scope, Send

from app.cluster.view import ClusterView, StaticView
from app.core.config import Mode, Policy
from app.core.ruleset import RuleSet
from app.intree.validating import COMPILABLE, VALIDATE_PATH
from app.rules.base import Phase
from app.serve.admission import BadReview, Handler, Request, Response, RuleHandler, TooDeep, parse_review
from app.serve.callerauth import REASONS, Caller, CallerCheck, CallerTokenError
from app.serve.httplimits import MAX_BODY
from app.serve.logs import admission_log

__all__ = ["MAX_BODY", "InTreeEndpoint", "Metrics", "ReviewEndpoint", "Reviews", "Service", "WatchCollector",
           "create_app", "read_body", "send"]


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

    def caller_counter(self, mode: str) -> Callable[[str], None]:
        """``CallerCheck.count`` for ``mode``: one series per reason, made once."""
        counters = {reason: self.caller_tokens.labels(mode, reason) for reason in REASONS}
        return lambda reason: counters[reason].inc()

    def malformed(self, endpoint: str) -> Callable[[], None]:
        """Count one request of ``endpoint`` answered 4xx."""
        counter = self.requests.labels(endpoint, "other", "", "malformed")
        return counter.inc

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


PHASES: tuple[Phase, ...] = ("mutate", "validate")
_JSON = [(b"content-type", b"application/json")]
_CHALLENGE = [(b"www-authenticate", b'Bearer realm="envelope"')]


class Service(Protocol):
    """What a :class:`ReviewEndpoint` serves: a body decoded into a request, or the
    answer that ends it there (a 4xx, or a review that cannot be judged); then the
    answer to a request."""

    def decode(self, body: bytes) -> Request | tuple[int, bytes]: ...

    def answer(self, request: Request) -> tuple[int, bytes]: ...


class ReviewEndpoint:
    """A raw ASGI endpoint for one review path: ``POST`` with a body, answered by
    ``service``; any other method gets 405. With ``caller`` (KEP-6060 tokens), the
    caller's token is checked before the body is read: in enforce mode a request
    without a good one gets 401 and is never parsed."""

    def __init__(self, service: Service, on_malformed: Callable[[], None] | None = None,
                 caller: CallerCheck | None = None) -> None:
        self.service = service
        self.on_malformed = on_malformed
        self.caller = caller

    async def __call__(self, scope: dict[str, Any], receive: Any, send_: Any) -> None:
        extra: list[tuple[bytes, bytes]] = []
        if scope["method"] != "POST":
            status, payload = _error(405, "use POST with an AdmissionReview")
            extra = [(b"allow", b"POST")]
        else:
            checker = self.caller
            who = None if checker is None else await checker.check(scope.get("headers", ()),
                                                                   scope["path"])
            media = _content_type(scope)
            if isinstance(who, CallerTokenError) and checker and checker.mode == "enforce":
                status, payload = _error(401, f"caller token refused ({who.reason}): {who.detail}")
                extra = _CHALLENGE
            elif media != b"application/json":
                # As controller-runtime's webhook server: the API server always sends JSON.
                shown = media.decode("latin-1")[:80] if media else "none"
                status, payload = _error(415, f"Content-Type must be application/json, got {shown}")
            else:
                body = await read_body(scope, receive)
                decoded = body if isinstance(body, tuple) else self.service.decode(body)
                refused = None
                if isinstance(who, Caller) and checker is not None:
                    # The one place a verified caller is counted: against the review's API
                    # groups when there is a review, else (a body that is none) as valid.
                    subject = decoded.subject if isinstance(decoded, Request) else None
                    groups = (subject.group, subject.api_group) if subject is not None else ()
                    refused = checker.settle(who, groups, scope["path"])
                if refused is not None and checker is not None and checker.mode == "enforce":
                    status, payload = _error(403, f"caller token refused (api-group): "
                                                  f"{refused.detail}")
                elif isinstance(decoded, Request):
                    status, payload = self.service.answer(decoded)
                else:
                    status, payload = decoded
        await send(send_, status, payload, extra)
        if status >= 400 and self.on_malformed is not None:
            self.on_malformed()


def _content_type(scope: dict[str, Any]) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return value.split(b";", 1)[0].strip().lower()  # type: ignore[no-any-return]
    return b""


async def send(send_: Any, status: int, payload: bytes,
                extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [*_JSON, (b"content-length", str(len(payload)).encode()), *(extra or [])]
    await send_({"type": "http.response.start", "status": status, "headers": headers})
    await send_({"type": "http.response.body", "body": payload})


async def read_body(scope: dict[str, Any], receive: Any) -> bytes | tuple[int, bytes]:
    """The whole body, or a 4xx. The cap is ``--max-body-bytes`` as the guarded protocol
    (app/serve/httplimits.py, which enforces it on the wire too) hands it over, else MAX_BODY."""
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


class InTreeEndpoint:
    """``/validate/in-tree/<rule,rule>``: the validating review without the named rules
    (each run as ``off``), one :class:`ReviewEndpoint` per distinct list. Only rules that
    ``app.intree.validating`` compiles may be named: anything else is answered 400, so a
    configuration can never switch off a rule no policy answers for."""

    def __init__(self, rules: RuleSet, handler: RuleHandler, metrics: Metrics,
                 known_kinds: frozenset[str], caller: CallerCheck | None) -> None:
        self.rules, self.handler, self.view = rules, handler, handler.view
        self.metrics, self.known_kinds, self.caller = metrics, known_kinds, caller
        self.allowed = frozenset(rid for rid in COMPILABLE if rid in rules.rules)
        # Per list, the policy serving when its endpoint was made: a reloaded policy
        # (app/serve/policyreload.py swaps ``handler.policy``) makes a new one.
        self.endpoints: dict[frozenset[str], tuple[Policy, ReviewEndpoint]] = {}

    def endpoint(self, names: str) -> ReviewEndpoint | str:
        """The endpoint for a path's list, or why the list is refused."""
        skipped = frozenset(names.split(","))
        wrong = sorted(skipped - self.allowed)
        if wrong or not names:
            return (f"{VALIDATE_PATH}<rules> names rules compiled in-tree, one of "
                    f"{', '.join(sorted(self.allowed))}; got {', '.join(wrong) or 'none'}")
        serving = self.handler.policy
        made = self.endpoints.get(skipped)
        if made is not None and made[0] is serving:
            return made[1]
        policy = serving.model_copy(update={"rules": {
            **serving.rules, **dict.fromkeys(skipped, Mode.OFF)}})
        handler = RuleHandler(self.rules, policy, self.view)
        found = ReviewEndpoint(Reviews("validate", handler, self.metrics, self.known_kinds),
                               self.metrics.malformed("validate"), self.caller)
        self.endpoints[skipped] = (serving, found)
        return found

    async def __call__(self, scope: dict[str, Any], receive: Any, send_: Any) -> None:
        found = self.endpoint(str(scope.get("path_params", {}).get("rules", "")))
        if isinstance(found, str):
            status, payload = _error(400, found)
            await send(send_, status, payload)
            self.metrics.malformed("validate")()
            return
        await found(scope, receive, send_)


class Reviews:
    """One review endpoint's work around its handler: decode the body into a
    :class:`~app.serve.admission.Request`, and answer it — the handler's response, counted
    (Prometheus), logged (one JSON line, no object contents) and encoded."""

    def __init__(self, phase: Phase, handler: Handler, metrics: Metrics,
                 known_kinds: frozenset[str]) -> None:
        self.phase = phase
        self.handler = handler
        self.metrics = metrics
        self.known_kinds = known_kinds

    def decode(self, body: bytes) -> Request | tuple[int, bytes]:
        started = time.perf_counter()
        try:
            uid, subject = parse_review(body)
        except TooDeep as exc:
            return 200, self.handler.too_deep(exc.uid).encode()
        except BadReview as exc:
            return _error(400, f"not an AdmissionReview: {exc}")
        except (RecursionError, ValueError, TypeError) as exc:  # defence in depth: all 400s
            return _error(400, f"not an AdmissionReview: {type(exc).__name__}")
        return Request(uid, subject, self.phase, started)

    def answer(self, request: Request) -> tuple[int, bytes]:
        response = self.handler.handle(request)
        self._record(request, response, time.perf_counter() - request.received)
        return 200, response.encode()

    def _record(self, request: Request, response: Response, elapsed: float) -> None:
        m, phase, subject = self.metrics, self.phase, request.subject
        decision, evaluation = response.decision, response.evaluation
        # Bounded label values: whoever reaches the port must not grow our series.
        kind = subject.kind if subject.kind in self.known_kinds else "other"
        operation = subject.operation  # parse_review admits four words only
        m.child(m.requests, phase, kind, operation, decision.word).inc()
        m.child(m.latency, phase, kind, decision.word).observe(elapsed)
        if evaluation is not None:
            for rule_id, result in evaluation.results.items():
                m.child(m.rule_results, rule_id, result).inc()
            if decision.patch:
                m.patches.labels(kind).inc()
            for rule_id in evaluation.skipped:
                m.exemptions.labels(rule_id).inc()  # rule ids come from the rule set: bounded
        if admission_log.enabled:
            record: dict[str, Any] = {
                "uid": request.uid, "kind": subject.kind, "namespace": subject.namespace,
                "name": subject.name, "operation": subject.operation, "endpoint": phase,
                "dryRun": subject.dry_run, "decision": decision.word,
                "user": subject.user, "groups": subject.groups,
                "rules": evaluation.rule_ids if evaluation else [],
                "durationMs": round(elapsed * 1000, 3),
            }
            if evaluation and evaluation.internal_errors:
                record["internalErrors"] = [str(e) for e in evaluation.internal_errors]
            if evaluation and evaluation.skipped:
                record["exempted"] = evaluation.skipped
            if not decision.allowed:
                record["message"] = decision.message  # cut by app.serve.logs, like every field
            admission_log.write(record)


def create_app(
    rules: RuleSet,
    policy: Policy,
    view: ClusterView | None = None,
    ready_checks: dict[str, Callable[[], list[str]]] | None = None,
    metrics: Metrics | None = None,
    caller: CallerCheck | None = None,
    serving: Callable[[], str] | None = None,
) -> FastAPI:
    """Build the webhook app. ``ready_checks`` gate ``/readyz``: each returns its
    problems (caches not synced, no certificate), empty when ready. ``caller``: check
    KEP-6060 caller tokens on the review paths (``app.serve.callerauth``). ``serving``: which
    policy serves (``PolicyReloader.describe``), said in ``/readyz``'s body. The policy
    serving is ``app.state.handler.policy``: one assignment swaps it."""
    app = _ReviewsFirst(title="Envelope", docs_url=None, redoc_url=None, openapi_url=None, **_NO_OTEL)
    metrics = app.state.metrics = metrics or Metrics()
    handler = app.state.handler = RuleHandler(rules, policy, view or StaticView())
    checks = ready_checks if ready_checks is not None else {}
    if caller is not None:
        caller.count = metrics.caller_counter(caller.mode)
    known_kinds = frozenset(kind for _, kind in rules.kinds)

    async def healthz(request: Request_) -> Response_:
        return Response_(b"ok", media_type="text/plain")

    async def readyz(request: Request_) -> Response_:
        failing = [f"{name}: {problem}" for name, check in checks.items()
                   for problem in check()]
        which = f" ({serving()})" if serving is not None else ""
        if failing:
            return Response_(("not ready: " + "; ".join(failing) + which).encode(),
                             status_code=503, media_type="text/plain")
        return Response_(f"ok{which}".encode(), media_type="text/plain")

    app.add_route("/healthz", healthz, methods=["GET"])
    app.add_route("/readyz", readyz, methods=["GET"])
    # First in the router: a review matches on the first route it is compared with.
    app.reviews = {f"/{phase}": ReviewEndpoint(Reviews(phase, handler, metrics, known_kinds),
                                               metrics.malformed(phase), caller)
                   for phase in PHASES}
    app.in_tree = InTreeEndpoint(rules, handler, metrics, known_kinds, caller)
    app.router.routes[:0] = [*(Route(path, endpoint) for path, endpoint in app.reviews.items()),
                             Route(VALIDATE_PATH + "{rules}", app.in_tree)]
    return app


class _ReviewsFirst(FastAPI):
    """The app, with the review paths answered before FastAPI's middleware stack and
    router (seven layers a review does not use: every one of its answers, 4xx included,
    is made by :class:`ReviewEndpoint`). A path is taken here only when the router would
    match it to the same endpoint (``/mutate``, ``/validate``, ``/validate/in-tree/<one
    segment>``, no root path); anything else — ``/healthz``, a trailing slash, a lifespan
    event — goes through FastAPI as before. Measured: docs/benchmarks.md, run K."""

    reviews: dict[str, ReviewEndpoint]
    in_tree: InTreeEndpoint | None = None

    async def __call__(self, scope: Scope, receive: Receive, send_: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            path = scope["path"]
            endpoint = self.reviews.get(path)
            if endpoint is not None:
                await endpoint(cast(dict[str, Any], scope), receive, send_)  # uvicorn's is a dict
                return
            if self.in_tree is not None and path.startswith(VALIDATE_PATH):
                names = path[len(VALIDATE_PATH):]
                if names and "/" not in names:
                    scope["path_params"] = {"rules": names}
                    await self.in_tree(cast(dict[str, Any], scope), receive, send_)
                    return
        await super().__call__(scope, receive, send_)


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
