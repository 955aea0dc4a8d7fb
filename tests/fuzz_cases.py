"""What the fuzz suites share (tests/test_fuzz.py judges in-process, tests/test_fuzz_http.py
through the real server): a populated cluster view, valid objects of every kind the
rules judge, and the ways to take them apart — every path, a wrong type or null there,
nesting as deep as the JSON parser reads, quantity strings of many digits.

Knobs for longer runs (the defaults keep ``make unit`` short):

- ``ENVELOPE_FUZZ_ROUNDS`` (default 1): how many different wrong values, depths and
  quantity strings each path gets in the systematic tests, and the multiplier of the
  hypothesis examples.
- ``ENVELOPE_FUZZ_DIGITS`` (default 20,000): the longest quantity string. Quantity
  parsing on this branch is quadratic in the digits (~0.6 s for 20,000 on the 2-core
  machine); raise it once parsing is linear.
- ``ENVELOPE_FUZZ_NODES`` (default 5,000): Nodes in the populated view.
"""

from __future__ import annotations

import copy
import functools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import InternalError
from app.serve.admission import BadReview, Decision, Request, RuleHandler, parse_review, review_response
from tests.conftest import RULES, container, workload
from tests.helpers.actors import pool, template

ROUNDS = max(1, int(os.environ.get("ENVELOPE_FUZZ_ROUNDS", "1")))
DIGITS = int(os.environ.get("ENVELOPE_FUZZ_DIGITS", "20000"))
NODES = int(os.environ.get("ENVELOPE_FUZZ_NODES", "5000"))
BOUND_S = 2.0
"""Every review (parse, evaluate, decide, encode — what the server does for one
``/mutate`` or ``/validate``) is answered within this many seconds. Generous for a
noisy 2-core machine: the slowest fuzzed review measured ~0.6 s (a 20,000-digit
quantity on the quadratic parser, load average 7); a typical one takes 1-70 ms with
5,000 Nodes. See docs/reliability.md."""
PARSER_DEPTH = 1024
"""orjson's nesting limit: deeper documents are refused (a 400, not a 500)."""
NAMESPACES = ("team-a", "ns")
"""The namespaces the samples (team-a) and the HTTP fuzz's reviews (ns) are in; each
has the quotas, LimitRanges and a WorkerPool."""

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _yaml(*names: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name in names:
        for path in sorted(EXAMPLES.glob(name)):
            out.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return out


def node(i: int) -> dict[str, Any]:
    """A Node as a kubelet reports it: half of them GPU nodes of the KAI pool, some
    tainted, a few cordoned."""
    gpu = i % 2 == 0
    labels = {"kubernetes.io/hostname": f"node-{i}", "kubernetes.io/os": "linux",
              "topology.kubernetes.io/zone": f"zone-{i % 3}"}
    allocatable = {"cpu": "63500m", "memory": "250Gi", "pods": "110", "ephemeral-storage": "900Gi"}
    if gpu:
        labels.update({"pool": "rtx", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                       "nvidia.com/gpu.count": "8"})
        allocatable["nvidia.com/gpu"] = "8"
    spec: dict[str, Any] = {}
    if i % 7 == 3:
        spec["taints"] = [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]
    if i % 97 == 5:
        spec["unschedulable"] = True
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i}", "labels": labels},
            "spec": spec, "status": {"capacity": dict(allocatable), "allocatable": allocatable}}


def namespace_objects(ns: str) -> list[dict[str, Any]]:
    """Two ResourceQuotas (one scoped), three LimitRanges (container defaults, a Pod
    maximum, a limit/request ratio) and a WorkerPool."""
    def quota(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": name, "namespace": ns}, "spec": spec}

    def limit_range(name: str, *items: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": name, "namespace": ns},
                "spec": {"limits": list(items)}}

    return [
        quota("compute", {"hard": {"limits.cpu": "64", "limits.memory": "256Gi", "requests.cpu": "32",
                                   "requests.memory": "128Gi", "requests.nvidia.com/gpu": "16",
                                   "pods": "100"}}),
        quota("not-best-effort", {"hard": {"limits.cpu": "48", "pods": "50"},
                                  "scopes": ["NotBestEffort"]}),
        limit_range("defaults", {"type": "Container", "default": {"cpu": "1", "memory": "512Mi"},
                                 "defaultRequest": {"cpu": "500m", "memory": "256Mi"},
                                 "max": {"cpu": "16", "memory": "64Gi"}}),
        limit_range("pod-max", {"type": "Pod", "max": {"cpu": "32", "memory": "128Gi"}}),
        limit_range("ratio", {"type": "Container", "maxLimitRequestRatio": {"cpu": "4"}}),
        pool({"cpu": "2", "memory": "1Gi"}, namespace=ns, labels={"workload": "agent"}),
    ]


@functools.cache
def view_objects(nodes: int = NODES) -> tuple[dict[str, Any], ...]:
    """The populated view: per namespace its quotas, LimitRanges and WorkerPool; the
    tenancy example's KAI objects (NodePools, Departments, Projects, Queues and its
    Nodes); and ``nodes`` kubelet-like Nodes."""
    objects = [o for ns in NAMESPACES for o in namespace_objects(ns)]
    objects += _yaml("tenancy/*.yaml", "tenancy/projects/*.yaml")
    objects += [node(i) for i in range(nodes)]
    return tuple(objects)


@functools.cache
def populated_view(nodes: int = NODES) -> StaticView:
    return StaticView(view_objects(nodes), indexes=RULES.indexes)


ENV = [{"name": "RESOURCE_LIMITS", "value": "cpu=2,memory=1Gi"},
       {"name": "RESOURCE_REQUESTS", "value": "cpu=1,memory=1Gi"},
       {"name": "MODEL", "valueFrom": {"configMapKeyRef": {"name": "m", "key": "model"}}},
       {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}}]
MAIN = container(requests={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                 limits={"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}, env=ENV,
                 ports=[{"containerPort": 8080}],
                 readinessProbe={"httpGet": {"path": "/ready", "port": 8080}})
INIT = container(name="setup", requests={"cpu": "500m"}, limits={"cpu": "1", "memory": "512Mi"},
                 restartPolicy="Always")
JOB_INIT = container(name="fetch", requests={"cpu": "250m", "memory": "128Mi"},
                     limits={"cpu": "500m", "memory": "128Mi"})
WORKLOADS = ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController",
             "Job", "CronJob")


def samples() -> list[dict[str, Any]]:
    """A valid object of every kind the rules judge, in namespace team-a."""
    out = []
    for kind in WORKLOADS:
        inits = [copy.deepcopy(INIT), copy.deepcopy(JOB_INIT)] if kind in ("Job", "CronJob") \
            else [copy.deepcopy(INIT)]
        obj = workload(kind, [copy.deepcopy(MAIN)], init=inits,
                       pod_resources={"limits": {"cpu": "4", "memory": "4Gi"},
                                      "requests": {"cpu": "2", "memory": "4Gi"}},
                       template_annotations={"team": "a"}, annotations={"owner": "me"})
        spec = obj
        for key in ("spec", "jobTemplate", "spec", "template", "spec") if kind == "CronJob" else \
                ("spec",) if kind == "Pod" else ("spec", "template", "spec"):
            spec = spec[key]
        spec.update({"nodeSelector": {"pool": "rtx"}, "overhead": {"memory": "10Mi"},
                     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infra",
                                      "effect": "NoSchedule"}]})
        if kind in ("Job", "CronJob"):
            spec["restartPolicy"] = "OnFailure"
        if kind != "Pod":
            obj["spec"]["replicas" if kind not in ("Job", "CronJob", "DaemonSet") else
                        "parallelism" if kind == "Job" else "revisionHistoryLimit"] = 2
        out.append(obj)
    out.append(template({"cpu": "1", "memory": "512Mi"},
                        workerSelector={"matchLabels": {"workload": "agent"}}))
    out.append(pool({"cpu": "2", "memory": "1Gi"}, name="sample"))
    kai = _yaml("tenancy/*.yaml", "tenancy/projects/*.yaml")
    for kind in ("Department", "Project", "Queue", "NodePool"):
        # the second of a kind has a parent where the kind has parents
        found = [o for o in kai if o.get("kind") == kind]
        out.append(copy.deepcopy(found[min(1, len(found) - 1)]))
    return out


def paths(node: Any, prefix: tuple[Any, ...] = (), *,
          keep_type: bool = False) -> Iterator[tuple[Any, ...]]:
    """Every path of a document but the root (and its apiVersion and kind, unless
    ``keep_type``)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if prefix == () and key in ("apiVersion", "kind") and not keep_type:
                continue
            yield (*prefix, key)
            yield from paths(value, (*prefix, key), keep_type=keep_type)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield (*prefix, i)
            yield from paths(value, (*prefix, i), keep_type=keep_type)


def at(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def replaced(obj: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    at(out, path[:-1])[path[-1]] = value
    return out


def json_type(value: Any) -> str:
    return ("null" if value is None else "boolean" if isinstance(value, bool)
            else "number" if isinstance(value, int | float) else "string" if isinstance(value, str)
            else "array" if isinstance(value, list) else "object")


OTHERS: list[Any] = ["x", 7, 2.5, True, [], {}, ["x"], {"x": 1}, "-1", 10**30, False, "1Gi"]


def wrong_types(value: Any, round_: int = 0) -> list[Any]:
    """null, and values of other JSON types than ``value`` (one more per round)."""
    fitting = [o for o in OTHERS if json_type(o) != json_type(value)]
    return [None, *[fitting[(round_ * 5 + i * 3) % len(fitting)] for i in range(1 + round_)]]


QUANTITY_KEYS = frozenset({"cpu", "memory", "nvidia.com/gpu", "ephemeral-storage", "pods",
                           "limits.cpu", "limits.memory", "requests.cpu", "requests.memory",
                           "requests.nvidia.com/gpu", "quota", "limit", "deserved", "divisor",
                           "quantity"})


def quantity_paths(obj: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [p for p in paths(obj) if isinstance(p[-1], str) and p[-1] in QUANTITY_KEYS
            and not isinstance(at(obj, p), dict | list)]


def long_quantities(round_: int = 0) -> list[str]:
    """Quantity strings of up to ``DIGITS`` digits, as a CRD quantity reaches the webhook
    as written: plain, suffixed, fractional, exponent, signed, and just past a valid one."""
    lengths = sorted({min(DIGITS, n) for n in (1_000, 5_000, DIGITS)})
    n = lengths[round_ % len(lengths)]
    return ["9" * n, "1" + "0" * n + "Mi", "0." + "0" * n + "1", "1" * n + "m", "-" + "7" * n,
            "1" * n + "e3", "2" * n + "Ki ", "3" * (n // 2) + "." + "4" * (n // 2)]


def nested(depth: int, as_list: bool = False, leaf: Any = "1Gi") -> str:
    """JSON text ``depth`` levels deep (a string: deeper than json.dumps writes)."""
    leaf_text = orjson.dumps(leaf).decode()
    if as_list:
        return "[" * depth + leaf_text + "]" * depth
    return '{"a":' * depth + leaf_text + "}" * depth


def review_text(obj: Any, operation: str, uid: str, old: Any = None,
                splice: dict[str, str] | None = None) -> bytes:
    """An AdmissionReview as the API server sends it (``old`` as the oldObject of an
    UPDATE); each ``splice`` marker string in the objects is replaced by raw JSON text."""
    group, _, version = str(obj.get("apiVersion", "v1")).rpartition("/") \
        if isinstance(obj, dict) else ("", "", "v1")
    kind = obj.get("kind", "Pod") if isinstance(obj, dict) else "Pod"
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    namespace = meta.get("namespace", "") if isinstance(meta, dict) else ""
    request: dict[str, Any] = {
        "uid": uid, "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": f"{str(kind).lower()}s"},
        "operation": operation,
        "namespace": namespace if isinstance(namespace, str) and namespace not in (splice or {}) else "",
        "name": "x", "dryRun": False,
        "userInfo": {"username": "fuzz", "groups": ["system:authenticated"]}, "object": obj}
    if operation == "UPDATE":
        request["oldObject"] = obj if old is None else old
    text = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": request}).decode()
    for marker, raw in (splice or {}).items():
        text = text.replace(orjson.dumps(marker).decode(), raw)
    return text.encode()


def envelope_depth(obj: dict[str, Any], path: tuple[Any, ...]) -> int:
    """Levels that enclose a value at ``path`` of the object in a review (the review and
    its request; the object and each step but the last), so a value ``PARSER_DEPTH -
    envelope_depth`` levels deep is the deepest the parser reads there."""
    return 2 + len(path)


@dataclass
class Answer:
    uid: str | None
    decision: Decision | None
    """None when the body is not a review (a 400)."""
    internal_errors: list[InternalError]
    seconds: float
    response: bytes


def answer(body: bytes, phase: str, view: StaticView, policy: Policy | None = None) -> Answer:
    """What ``envelope serve`` does for one ``POST /mutate`` or ``/validate``, in
    process: decode, evaluate, decide, encode — timed."""
    policy = policy or Policy()
    started = time.perf_counter()
    try:
        uid, subject = parse_review(body)
    except BadReview:
        return Answer(None, None, [], time.perf_counter() - started, b"")
    # The server's own handler (app/serve/admission.py RuleHandler): the metadata check it makes
    # before the engine, then evaluate and decide.
    handled = RuleHandler(RULES, policy, view).handle(Request(uid, subject, phase))  # type: ignore[arg-type]
    decision = handled.decision
    internal = handled.evaluation.internal_errors if handled.evaluation is not None else []
    try:
        response = review_response(uid, decision)
    except (TypeError, orjson.JSONEncodeError):  # the server answers these with a 400 denial
        decision = Decision(False, "cannot encode an answer", 400)
        response = review_response(uid, decision)
    return Answer(uid, decision, internal, time.perf_counter() - started, response)
