"""Bad input gets a clear answer: arbitrary JSON in every supported kind never makes
a rule crash (an internal error would deny by failure mode, not by policy)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.cluster.view import StaticView
from app.core.config import Mode, Policy
from app.core.engine import check_object
from app.rules.base import Subject
from tests import fuzz_cases
from tests.conftest import RULES
from tests.helpers.fuzz import VERSIONS, json_values, objects, scalars


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(target=objects(), old=st.one_of(st.none(), json_values), others=st.lists(objects(), max_size=3),
       operation=st.sampled_from(["CREATE", "UPDATE", "DELETE"]))
def test_no_rule_crashes_on_arbitrary_json(target: tuple[str, str, dict[str, Any]], old: Any,
                                           others: list[tuple[str, str, dict[str, Any]]],
                                           operation: str) -> None:
    group, kind, obj = target
    view = StaticView([o for _, _, o in others])
    subject = Subject(group, VERSIONS[group], kind, operation, "ns", "x",
                      None if operation == "DELETE" else obj,
                      old if isinstance(old, dict) else (obj if operation != "CREATE" else None))
    result = check_object(RULES, subject, view, Policy())
    assert result.internal_errors == []
    for finding in result.findings:
        assert finding.message and finding.severity in ("error", "warning")


review_keys = st.sampled_from(["apiVersion", "kind", "request", "uid", "group", "version", "operation",
                               "object", "oldObject", "namespace", "name", "dryRun", "metadata"])
review_values = st.recursive(
    st.one_of(scalars, st.sampled_from(["AdmissionReview", "admission.k8s.io/v1", "CREATE", "Pod"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(review_keys, inner, max_size=6)),
    max_leaves=25)


@settings(max_examples=400, deadline=None)
@given(body=review_values)
def test_any_body_is_a_review_or_a_bad_review(body: Any) -> None:
    import orjson

    from app.core.engine import evaluate
    from app.serve.admission import BadReview, decide, parse_review, review_response

    data = body if not isinstance(body, dict) else {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", **body}
    try:
        uid, subject = parse_review(orjson.dumps(data))
    except BadReview as exc:
        assert str(exc)
        return
    for phase in ("mutate", "validate"):
        evaluation = evaluate(RULES, subject, StaticView(), Policy(), phase)  # type: ignore[arg-type]
        out = orjson.loads(review_response(uid, decide(evaluation, "deny")))
        assert out["response"]["uid"] == uid


# --------------------------------------------------------------------------------------
# Systematic: every path of a valid object of every kind, judged as the server judges a
# review (decode, evaluate, decide, encode) against a populated view — quotas,
# LimitRanges, 5,000 Nodes, the tenancy example's KAI objects, WorkerPools. Required for
# every review: no exception, no internal error, no 500, the request's uid, and an
# answer within fuzz_cases.BOUND_S. Knobs: tests/fuzz_cases.py.

SAMPLES = fuzz_cases.samples()
SAMPLE_IDS = [o["kind"] for o in SAMPLES]


class Tally:
    def __init__(self, name: str) -> None:
        self.name, self.reviews, self.slowest, self.where = name, 0, 0.0, ""
        self.denied = self.bad = 0
        self.problems: list[str] = []

    def judge(self, body: bytes, uid: str, what: str, beyond: bool = False) -> None:
        for phase in ("mutate", "validate"):
            try:
                got = fuzz_cases.answer(body, phase, fuzz_cases.populated_view())
            except Exception as exc:  # the server would answer this with a 500
                self.problems.append(f"{what} {phase}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            self.reviews += 1
            if got.seconds > self.slowest:
                self.slowest, self.where = got.seconds, f"{what} {phase}"
            if got.decision is None:
                self.bad += 1
                if not beyond:
                    self.problems.append(f"{what} {phase}: not read as a review")
                continue
            if beyond:
                self.problems.append(f"{what} {phase}: read past the parser's depth limit")
            self.denied += not got.decision.allowed
            if got.internal_errors or got.decision.code >= 500:
                self.problems.append(f"{what} {phase}: {got.internal_errors or got.decision.message}")
            if orjson.loads(got.response)["response"]["uid"] != uid:
                self.problems.append(f"{what} {phase}: answer without uid {uid}")
            if got.seconds > fuzz_cases.BOUND_S:
                self.problems.append(f"{what} {phase}: {got.seconds:.2f} s > {fuzz_cases.BOUND_S} s")

    def check(self, at_least: int) -> None:
        print(f"{self.name}: {self.reviews} reviews ({self.denied} denied, {self.bad} not reviews), "
              f"slowest {self.slowest * 1000:.0f} ms ({self.where})")
        assert not self.problems, "\n".join(self.problems[:30])
        assert self.reviews >= at_least, f"only {self.reviews} reviews"


def _uid(*parts: object) -> str:
    return "fuzz-" + "-".join(map(str, parts))[:200]


@pytest.mark.parametrize("index", range(len(SAMPLES)), ids=SAMPLE_IDS)
def test_null_and_wrong_types_at_every_path_with_a_populated_view(index: int) -> None:
    """Each node of a valid object in turn replaced by null and by a value of another
    JSON type; CREATE, an UPDATE to it, and an UPDATE from it (the old object is judged
    when a rule ratchets)."""
    obj = SAMPLES[index]
    tally = Tally(f"null/wrong-type {obj['kind']}")
    all_paths = list(fuzz_cases.paths(obj))
    for round_ in range(fuzz_cases.ROUNDS):
        for n, path in enumerate(all_paths):
            for value in fuzz_cases.wrong_types(fuzz_cases.at(obj, path), round_):
                broken = fuzz_cases.replaced(obj, path, value)
                what = f"{'.'.join(map(str, path))}={str(value)[:20]}"
                uid = _uid(index, n, round_, fuzz_cases.json_type(value))
                tally.judge(fuzz_cases.review_text(broken, "CREATE", uid), uid, f"CREATE {what}")
                tally.judge(fuzz_cases.review_text(broken, "UPDATE", uid, old=obj), uid, f"UPDATE to {what}")
                if value is None:
                    tally.judge(fuzz_cases.review_text(obj, "UPDATE", uid, old=broken), uid,
                                f"UPDATE from {what}")
    tally.check(at_least=len(all_paths) * 8)


@pytest.mark.parametrize("index", range(len(SAMPLES)), ids=SAMPLE_IDS)
def test_nesting_from_600_levels_to_the_parser_limit_and_beyond(index: int) -> None:
    """At every path, a value nested between 600 levels and the deepest the JSON parser
    reads there (objects and lists in turn): CREATE, and an UPDATE whose old object is
    the same document decoded separately (the judged-part comparison at full depth).
    One level past the limit, and 3,000 levels, are not reviews (the server's 400)."""
    obj = SAMPLES[index]
    tally = Tally(f"nesting {obj['kind']}")
    all_paths = list(fuzz_cases.paths(obj))
    beyond = 0
    for round_ in range(fuzz_cases.ROUNDS):
        for n, path in enumerate(all_paths):
            room = fuzz_cases.PARSER_DEPTH - fuzz_cases.envelope_depth(obj, path)
            depth = room if n % 5 == 0 else 600 + (n * 37 + round_ * 101) % (room - 600 + 1)
            deep = fuzz_cases.nested(depth, as_list=(n + round_) % 2 == 1)
            broken = fuzz_cases.replaced(obj, path, "@deep@")
            what = f"{'.'.join(map(str, path))} {depth} deep"
            uid = _uid(index, n, round_, depth)
            tally.judge(fuzz_cases.review_text(broken, "CREATE", uid, splice={"@deep@": deep}), uid,
                        f"CREATE {what}")
            tally.judge(fuzz_cases.review_text(broken, "UPDATE", uid, old=broken,
                                               splice={"@deep@": deep}), uid, f"UPDATE {what}")
            if n % max(1, len(all_paths) // 3) == 0:
                for past in (room + 1, 3000):
                    text = fuzz_cases.review_text(broken, "CREATE", uid,
                                                  splice={"@deep@": fuzz_cases.nested(past)})
                    tally.judge(text, uid, f"CREATE {'.'.join(map(str, path))} {past} deep", beyond=True)
                    beyond += 2
    tally.check(at_least=len(all_paths) * 4)
    assert tally.bad == beyond  # exactly the documents past the limit were refused


SAME_POD_SPEC = ("StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController")
"""Kinds whose pod spec sits where a Deployment's does (spec.template.spec)."""


@pytest.mark.parametrize("index", range(len(SAMPLES)), ids=SAMPLE_IDS)
def test_long_quantity_strings_at_every_quantity_path(index: int) -> None:
    """Every quantity of the object replaced by strings of 1,000 digits (eight shapes;
    two, in turn, for the kinds whose pod spec is where a Deployment's is);
    one path in eight by one of 5,000, and one path per kind and round (a different one
    per kind: the workload kinds share a pod spec) by one of ENVELOPE_FUZZ_DIGITS
    (20,000) digits — up to ~0.7 s a review on the quadratic parser."""
    obj = SAMPLES[index]
    where = fuzz_cases.quantity_paths(obj)
    tally = Tally(f"long quantities {obj['kind']}")
    for round_ in range(fuzz_cases.ROUNDS):
        for n, path in enumerate(where):
            values = fuzz_cases.long_quantities(0)
            if obj["kind"] in SAME_POD_SPEC:  # Deployment's paths, shifted: two shapes each
                values = [values[(2 * n + index + k) % len(values)] for k in (0, 1)]
            if (n + index + round_) % 8 == 0:
                values.append(fuzz_cases.long_quantities(1)[(n + round_) % 8])
            if n == (index * 3 + round_) % len(where):
                values.append(fuzz_cases.long_quantities(2)[(index + round_) % 8])
            for k, value in enumerate(values):
                uid = _uid(index, n, round_, k)
                what = f"{'.'.join(map(str, path))}={value[:8]}...({len(value)})"
                body = fuzz_cases.review_text(fuzz_cases.replaced(obj, path, value), "CREATE", uid)
                tally.judge(body, uid, f"CREATE {what}")
    tally.check(at_least=len(where) * 2)


# --------------------------------------------------------------------------------------
# What the systematic fuzz found, kept as explicit regression tests.

def _judged(obj: dict[str, Any], operation: str = "CREATE", old: Any = None,
            splice: dict[str, str] | None = None) -> list[fuzz_cases.Answer]:
    body = fuzz_cases.review_text(obj, operation, "regression", old=old, splice=splice)
    return [fuzz_cases.answer(body, phase, fuzz_cases.populated_view())
            for phase in ("mutate", "validate")]


def _sample(kind: str) -> dict[str, Any]:
    return next(o for o in SAMPLES if o["kind"] == kind)


@pytest.mark.parametrize("kind", ["Queue", "Project", "ActorTemplate", "WorkerPool", "Deployment"])
def test_an_update_nested_1000_levels_deep_is_judged_not_an_internal_error(kind: str) -> None:
    """The engine's "did the judged part change" step compared the old and new judged
    parts with ``==``, which recurses in C: 1,000 levels raised RecursionError outside
    the per-rule isolation (the server answered 500, "Envelope internal error"). The
    ActorTemplate rules' judged part (quantities parsed) recursed in Python too."""
    obj = fuzz_cases.replaced(_sample(kind), ("spec", "extra"), "@deep@")
    deep = fuzz_cases.nested(fuzz_cases.PARSER_DEPTH - fuzz_cases.envelope_depth(obj, ("spec", "extra")))
    for got in _judged(obj, "UPDATE", old=obj, splice={"@deep@": deep}):
        assert got.decision is not None and got.internal_errors == []
        assert got.decision.code < 500, got.decision.message


@pytest.mark.parametrize("kind", ["Job", "CronJob", "Deployment"])
@pytest.mark.parametrize("field", ["initContainers", "containers"])
def test_resources_null_in_a_namespace_with_a_quota_and_a_limitrange(kind: str, field: str) -> None:
    """``resources: null`` (as a manifest may write it) made LimitRange defaulting call
    ``.get`` on None: quota-needs-cpu-limits and limitrange-needs-cpu-limits crashed
    (AttributeError), an internal error denied by failure mode. LimitRanger treats null
    as no resources and fills in its defaults; so do we."""
    obj = _sample(kind)
    spec_path = {"Job": ("spec", "template", "spec"), "Deployment": ("spec", "template", "spec"),
                 "CronJob": ("spec", "jobTemplate", "spec", "template", "spec")}[kind]
    broken = fuzz_cases.replaced(obj, (*spec_path, field, 0, "resources"), None)
    for got in _judged(broken):
        assert got.decision is not None and got.internal_errors == [], got.internal_errors


def test_a_replica_count_of_the_wrong_type_is_not_a_crash() -> None:
    """``parallelism: "x"`` (or a list) made namespace-memory-composition call int() on
    it: an internal error. The quantities rule's shape check does not cover counts; a
    count that is not an integer is counted as Kubernetes' default."""
    for value in ("x", [1], {"a": 1}, None, True):
        broken = fuzz_cases.replaced(_sample("Job"), ("spec", "parallelism"), value)
        for got in _judged(broken):
            assert got.internal_errors == [], (value, got.internal_errors)


@pytest.mark.parametrize("where", ["nodeSelector", "matchExpressions", "longValues"])
def test_placement_fields_pod_fits_node_compares_must_be_strings(where: str) -> None:
    """A nodeSelector value or a required node-affinity expression that is not a string
    was turned into text once per Node: an 870-level object took 12-16 s a review with
    5,000 Nodes (a 200,000-character ``values`` string, read as a list of characters,
    longer). The API server refuses these shapes; the quantities rule now says where,
    and pod-fits-node does not run on them."""
    obj = _sample("Deployment")
    spec = ("spec", "template", "spec")
    if where == "nodeSelector":
        broken = fuzz_cases.replaced(obj, (*spec, "nodeSelector", "pool"), "@deep@")
        splice = {"@deep@": fuzz_cases.nested(870)}
        named = "nodeSelector.pool: expected a string"
    else:
        expr = {"key": "pool", "operator": "In",
                "values": "@deep@" if where == "matchExpressions" else "x" * 200_000}
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}
        broken = fuzz_cases.replaced(obj, (*spec, "affinity"), affinity)
        splice = {"@deep@": fuzz_cases.nested(870, as_list=True)}
        named = "matchExpressions[0].values: expected a list of strings"
    mutated, validated = _judged(broken, splice=splice)
    assert validated.decision is not None and not validated.decision.allowed
    assert named in validated.decision.message and "[quantities]" in validated.decision.message
    assert validated.seconds < fuzz_cases.BOUND_S, validated.seconds
    assert mutated.internal_errors == validated.internal_errors == []


def test_warn_mode_mutations_copy_a_deeply_nested_object() -> None:
    """A mutating rule in warn mode ran on ``json_copy`` of the object, and orjson
    writes at most 255 levels: a Pod with a 300-level affinity made evaluate() raise
    (a 500). Warn mode now copies what the rules change, like enforce mode."""
    policy = Policy(rules={"cpu-limits": Mode.WARN, "memory-limit": Mode.WARN,
                           "env-envelope-cpu": Mode.WARN})
    obj = fuzz_cases.replaced(_sample("Pod"), ("spec", "affinity"), "@deep@")
    body = fuzz_cases.review_text(obj, "CREATE", "warn", splice={"@deep@": fuzz_cases.nested(300)})
    got = fuzz_cases.answer(body, "mutate", fuzz_cases.populated_view(), policy)
    assert got.decision is not None and got.internal_errors == [] and got.decision.allowed
    assert got.decision.warnings and not got.decision.patch  # warned, nothing changed


def _deep(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = {"a": value, "n": i} if i % 2 else [value, i]
    return value


def test_deep_documents_copy_and_patch() -> None:
    """engine.json_copy and jsonpatch.diff at 5,000 levels (past C recursion and
    orjson's 255-level writer): both raised before."""
    from app.core.engine import json_copy
    from app.k8s.jsonpatch import diff

    a, b, c = _deep(5000, "x"), _deep(5000, "x"), _deep(5000, "y")
    copied = json_copy(a)
    assert copied is not a and copied["a"] is not a["a"]
    ops = diff(a, c)
    assert len(ops) == 1 and ops[0]["op"] == "replace" and ops[0]["value"] == "y"
    assert ops[0]["path"].count("/") == 5000
    assert diff(a, b) == []
    assert diff(copied, b) == []


def test_same_compares_at_any_depth() -> None:
    from app.k8s.util import same

    a, b = _deep(5000, "x"), _deep(5000, "x")
    assert same(a, b) and not same(a, _deep(5000, "y")) and not same(a, _deep(4999, "x"))
    assert same({"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}) and not same([1], [1, 2])


def test_api_server_json_is_read_at_any_depth_it_stores() -> None:
    """The API server stores custom resources up to 10,000 levels deep; orjson reads
    1,024. ``kube.loads`` (every LIST and watch line of the live view, snapshots, the
    audit) reads deeper documents by a loop, with the same values, and still refuses
    what is not JSON (e2e/test_deep_objects.py shows the view on a real API server)."""
    import json

    from app.cluster.kube import loads

    deep = '{"items":[' + '{"a":' * 5000 + '[1, -2.5e3, true, null, "\\u00e9\\"", {}]' + "}" * 5000 + "]}"
    value = loads(deep.encode())["items"][0]
    for _ in range(5000):
        value = value["a"]
    assert value == [1, -2500.0, True, None, 'é"', {}]
    sample = json.dumps(SAMPLES, indent=1)
    inner = loads("[" * 1100 + sample + "]" * 1100)
    for _ in range(1100):
        inner = inner[0]
    assert inner == SAMPLES
    for bad in (b'{"a":1', b'{"a" 1}', b"[1,]", b'{"a":1}x', b"nul", b"{" * 2000):
        with pytest.raises(orjson.JSONDecodeError):
            loads(bad)


@pytest.mark.parametrize("depth", [600, 1019])
def test_a_deep_actortemplate_can_still_be_updated_and_a_deep_change_is_named(depth: int) -> None:
    """The ActorTemplate rules' canonical spec recursed (two frames a level): from ~500
    levels under a preserve-unknown-fields subtree, every UPDATE — a label change —
    was refused by actor-spec-immutable as "too deep to judge". Now it is a loop; a
    real change deep down is still refused and named."""
    obj = fuzz_cases.replaced(_sample("ActorTemplate"), ("spec", "extra"), "@deep@")
    splice = {"@deep@": fuzz_cases.nested(depth)}
    relabelled = fuzz_cases.replaced(obj, ("metadata", "labels"), {"team": "b"})
    _, validated = _judged(relabelled, "UPDATE", old=obj, splice=splice)
    assert validated.decision is not None and validated.decision.allowed, validated.decision
    shallow = fuzz_cases.replaced(obj, ("spec", "extra"), 1)
    changed = fuzz_cases.review_text(obj, "UPDATE", "changed", old=shallow, splice=splice)
    got = fuzz_cases.answer(changed, "validate", fuzz_cases.populated_view())
    assert got.decision is not None and not got.decision.allowed
    assert "changed spec.extra [actor-spec-immutable]" in got.decision.message
