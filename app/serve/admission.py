"""AdmissionReview in, AdmissionReview out (``admission.k8s.io/v1``).

Decoding errors are :class:`BadReview` (the server answers 400 with its message);
everything after decoding is a decision, never an exception.

The boundary between bytes and rules is controller-runtime's (``pkg/webhook/admission``):
a :class:`Handler` turns a decoded :class:`Request` into a :class:`Response` —
``Handle(ctx, Request) Response`` there, ``handle(request) -> Response`` here.
:class:`RuleHandler` is Envelope's: the rule set's verdict (``engine.evaluate`` then
:func:`decide`). The server (``app.serve.server``) reads and decodes the body, calls the
handler, counts and logs the answer and writes ``Response.encode()``.
"""

from __future__ import annotations

import base64
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from app.cluster.fieldschema import metadata_problems
from app.cluster.view import ClusterView
from app.core.config import Policy
from app.core.engine import Evaluation, evaluate
from app.core.exemptions import is_delegated
from app.core.ruleset import RuleSet
from app.k8s.util import brief, cut
from app.rules.base import Phase, Subject

__all__ = ["BadReview", "Decision", "Handler", "Request", "Response", "RuleHandler", "TooDeep",
           "decide", "parse_review", "review_response", "too_deep"]

log = logging.getLogger("envelope.admission")

API_VERSION = "admission.k8s.io/v1"
INTERNAL_ERROR_LIMIT = 300
"""Characters of one internal error (``rule: Type: text``) a message keeps."""


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer; the message says why."""


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
           required: bool = True) -> Any:
    if key not in data or data[key] is None:
        if required:
            raise BadReview(f"{where}{key}: required")
        return None
    value = data[key]
    if not isinstance(value, kind):
        names = {dict: "an object", str: "a string", bool: "a boolean", list: "a list"}
        expected = names.get(kind, str(kind)) if isinstance(kind, type) else "an object"
        raise BadReview(f"{where}{key}: expected {expected}, got {type(value).__name__}")
    return value


def _show(value: Any) -> str:
    """A value for a message: scalars as written (cut), anything else by its type, so a
    crafted deep structure costs nothing to describe."""
    if isinstance(value, str | int | float | bool) or value is None:
        return repr(value)[:80]
    return type(value).__name__


class TooDeep(BadReview):
    """A review whose object nests deeper than the decoder reads (1,024 levels). The API
    server stores custom resources up to 10,000 levels deep
    (``x-kubernetes-preserve-unknown-fields``), so it may send one: such a review is
    answered, with its uid, as one Envelope cannot judge (``failureMode``), instead of a
    400 the API server shows as "rejected our request for an unknown reason"."""

    def __init__(self, uid: str) -> None:
        super().__init__("the object nests deeper than 1,024 levels")
        self.uid = uid


DEEP_BODY_LIMIT = 1024 * 1024
"""Largest body read by the loop decoder to find a too-deep review's uid (its cost is
linear but Python's: ~1 s per few MiB)."""


def _too_deep_uid(body: bytes) -> str | None:
    """The uid of a well-formed review nested past orjson's limit, else None."""
    from app.cluster.kube import loads  # orjson, then an explicit-stack decoder

    if len(body) > DEEP_BODY_LIMIT:
        return None
    try:
        data = loads(body)
    except (ValueError, orjson.JSONDecodeError):
        return None
    request = data.get("request") if isinstance(data, dict) else None
    uid = request.get("uid") if isinstance(request, dict) else None
    if (isinstance(uid, str) and data.get("kind") == "AdmissionReview"
            and data.get("apiVersion") == API_VERSION):
        return uid
    return None


def parse_review(body: bytes) -> tuple[str, Subject]:
    """Decode a request body into (uid, subject)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc) or "recursion" in str(exc).lower():
            uid = _too_deep_uid(body)
            if uid is not None:
                raise TooDeep(uid) from None
        raise BadReview(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadReview(f"expected an AdmissionReview object, got {type(data).__name__}")
    if data.get("kind") != "AdmissionReview":
        raise BadReview(f"kind: expected AdmissionReview, got {_show(data.get('kind'))}")
    if data.get("apiVersion") != API_VERSION:
        raise BadReview(f"apiVersion: expected {API_VERSION}, got {_show(data.get('apiVersion'))}")
    request = _field(data, "request", dict, "")
    uid = _field(request, "uid", str, "request.")
    kind = _field(request, "kind", dict, "request.")
    group = _field(kind, "group", str, "request.kind.", required=False) or ""
    version = _field(kind, "version", str, "request.kind.")
    kind_name = _field(kind, "kind", str, "request.kind.")
    operation = _field(request, "operation", str, "request.")
    if operation not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        raise BadReview(f"request.operation: expected CREATE, UPDATE, DELETE or CONNECT, "
                        f"got {_show(operation)}")
    obj = _field(request, "object", dict, "request.", required=False)
    old = _field(request, "oldObject", dict, "request.", required=False)
    if operation in ("CREATE", "UPDATE") and obj is None:
        raise BadReview(f"request.object: required for {operation}")
    namespace = _field(request, "namespace", str, "request.", required=False) or ""
    name = _field(request, "name", str, "request.", required=False) or ""
    if not name and obj is not None:
        meta = obj.get("metadata")
        if isinstance(meta, dict):
            found = meta.get("name") or meta.get("generateName")
            name = found if isinstance(found, str) else ""  # a rule reports a wrong type
    dry_run = _field(request, "dryRun", bool, "request.", required=False) or False
    user_info = request.get("userInfo")
    user, groups = "", 0
    if isinstance(user_info, dict):
        found = user_info.get("username")
        user = found[:256] if isinstance(found, str) else ""
        groups = len(user_info["groups"]) if isinstance(user_info.get("groups"), list) else 0
    resource = request.get("resource")
    found = resource.get("group") if isinstance(resource, dict) else None
    resource_group = found if isinstance(found, str) and found != group else None
    subresource = _field(request, "subResource", str, "request.", required=False) or ""
    return uid, Subject(group, version, kind_name, operation, namespace, name, obj, old, dry_run,
                        user, groups, resource_group, subresource)


@dataclass
class Decision:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] | None = None
    warnings: list[str] | None = None

    @property
    def word(self) -> str:
        if not self.allowed:
            return "deny"
        return "patch" if self.patch else "allow"


def decide(evaluation: Evaluation, failure_mode: str) -> Decision:
    """Turn findings into an admission decision."""
    # The message is kept under the limit its rule wrote it for, then named: the API
    # server truncates a warning only past 256 characters.
    warnings = [f"envelope[{f.rule}]: {brief(f.message)}" for f in evaluation.warnings]
    # What a namespace owner's EnvelopeException excused, said to whoever writes the object
    # (the policy's own exceptions and annotations are in the log line and metrics only).
    warnings += [f"envelope[{rule_id}]: {brief(f'not judged: excused by {why}')}"
                 for rule_id, why in evaluation.skipped.items() if is_delegated(why)]
    if evaluation.internal_errors:
        # An exception's text may quote the object: each is cut, like a finding.
        reason = "; ".join(cut(str(e), INTERNAL_ERROR_LIMIT)
                           for e in evaluation.internal_errors[:8])
        if len(evaluation.internal_errors) > 8:
            reason += f"; and {len(evaluation.internal_errors) - 8} more"
        if failure_mode == "deny":
            return Decision(False, f"Envelope could not evaluate this object ({reason}); "
                                   f"denied because failureMode is deny", 500,
                            warnings=warnings or None)
        warnings.append(brief(f"envelope: skipped a rule after an internal error: {reason}"))
    errors = evaluation.errors
    if errors:
        message = "; ".join(f"{f.message} [{f.rule}]" for f in errors)
        return Decision(False, message, 403, warnings=warnings or None)
    return Decision(True, patch=evaluation.patch or None, warnings=warnings or None)


def too_deep(failure_mode: str) -> Decision:
    """The answer to a :class:`TooDeep` review: it cannot be judged, so ``failureMode``
    decides, as for an internal error; the message says why and what to change."""
    why = ("Envelope cannot judge this object: it nests deeper than 1,024 levels (the most "
           "its JSON decoder reads; no built-in Kubernetes object comes close). Flatten the "
           "nested value")
    if failure_mode == "deny":
        return Decision(False, f"{why}; denied because failureMode is deny", 400)
    return Decision(True, warnings=[brief(f"envelope: {why}; allowed because failureMode is "
                                          f"allow")])


def review_response(uid: str, decision: Decision) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        reason = {403: "Forbidden", 400: "BadRequest"}.get(decision.code, "InternalError")
        response["status"] = {"code": decision.code, "reason": reason,
                              "message": decision.message}
    if decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(decision.patch)).decode()
    if decision.warnings:
        response["warnings"] = decision.warnings
    return orjson.dumps({"apiVersion": API_VERSION, "kind": "AdmissionReview",
                         "response": response})


# --------------------------------------------------------------------------- the handler


@dataclass(frozen=True)
class Request:
    """A decoded review, as a :class:`Handler` gets it (controller-runtime's
    ``admission.Request``): its uid, what it asks about, and the endpoint it came in on."""

    uid: str
    subject: Subject
    phase: Phase
    received: float = 0.0
    """``time.perf_counter()`` when decoding began (the latency metric starts there)."""


@dataclass(frozen=True)
class Response:
    """A :class:`Handler`'s answer (controller-runtime's ``admission.Response``): the
    decision for the request's uid, and the evaluation it came from (``None`` when
    there is none: the engine itself failed, or the review could not be judged)."""

    uid: str
    decision: Decision
    evaluation: Evaluation | None = None

    def encode(self) -> bytes:
        """The AdmissionReview to send. A patch nested past what orjson writes (255
        levels) cannot be encoded: that is a refusal saying why, never an exception."""
        try:
            return review_response(self.uid, self.decision)
        except (TypeError, orjson.JSONEncodeError) as exc:
            return review_response(self.uid, Decision(
                False, f"Envelope cannot encode an answer for this object ({exc}); it nests "
                       f"too deeply to be a Kubernetes object", 400))


class Handler(Protocol):
    """Turns a decoded review into the answer to it; never raises."""

    def handle(self, request: Request) -> Response: ...

    def too_deep(self, uid: str) -> Response:
        """The answer to a review whose uid could be read but whose object nests past
        what the decoder reads (:class:`TooDeep`): it cannot be judged."""
        ...


class RuleHandler:
    """Envelope's handler: the rule set's verdict on one review, per the policy's modes
    and ``failureMode``, against the view of the cluster."""

    def __init__(self, rules: RuleSet, policy: Policy, view: ClusterView) -> None:
        self.rules = rules
        self.policy = policy
        self.view = view

    def handle(self, request: Request) -> Response:
        policy = self.policy
        subject = request.subject
        if isinstance(subject.obj, dict) and "metadata" in subject.obj and self.rules.applicable(
                subject.group, subject.kind, request.phase, subject.operation, policy):
            # The API server decodes metadata into ObjectMeta before any webhook, so a label
            # value true or annotations that are a list never come from it: refused as it
            # refuses them (app/cluster/fieldschema.py), with the uid, never judged.
            wrong = metadata_problems(subject.obj["metadata"])
            if wrong:
                return Response(request.uid, Decision(
                    False, "; ".join(p.message for p in wrong[:5]), 400))
        try:
            evaluation = evaluate(self.rules, request.subject, self.view, policy, request.phase)
            return Response(request.uid, decide(evaluation, policy.failure_mode), evaluation)
        except Exception as exc:  # defence in depth: the engine already isolates rules
            log.exception("evaluation failed", extra={"uid": request.uid})
            return Response(request.uid, Decision(
                policy.failure_mode == "allow", f"Envelope internal error: {type(exc).__name__}",
                500))

    def too_deep(self, uid: str) -> Response:
        return Response(uid, too_deep(self.policy.failure_mode))
