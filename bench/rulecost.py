"""Cost of every rule against the size of its input and of the cluster view.

Run by hand (``.venv/bin/python bench/rulecost.py``), not in the test suite; the table
goes to docs/benchmarks.md ("Rule cost against input size").

For each rule of ``default_ruleset()`` and each dimension that can grow under it, a
review is built at four sizes (each twice the last) and judged through the engine
(``engine.evaluate`` with a rule set of that one rule, the full set's copiers and
indexes, a ``StaticView`` built once per size, default policy). The time of a size is
the minimum over repetitions (at least 3, until 0.3 s were spent): the least noisy
figure on a shared machine. The slope is the least-squares exponent of time against
size on a log-log scale: about 1 is linear, 2 quadratic, near 0 means the dimension
does not reach the rule. Time on a shared machine also grows with cache misses as the
view grows, so the work is counted too: the function calls of one review (cProfile's
total, Python and built-in), whose slope the load cannot move. ``--quick`` halves the
sizes; ``--rule`` keeps the rules whose id contains it.

Dimensions (what grows):

- ``containers``: containers in the workload (a quarter as many init containers);
- ``env``: env vars in each of 4 containers (RESOURCE_LIMITS refers to one of them);
- ``digits``: the length of one quantity as a tenant writes it in a CRD (ActorTemplate,
  WorkerPool) or a workload (the API server canonicalises Pod quantities, not
  templates of unknown kinds: a workload quantity here is an upper bound);
- ``limitranges``: LimitRanges in the namespace, each with container defaults (the
  worst case for LimitRanger's orders: each may come first, so each is one outcome to
  judge, up to ``MAX_LIMIT_RANGE_ORDERS``); ``limitranges>32``: beyond that bound;
- ``quotas``: ResourceQuotas in the namespace with limits.cpu, requests.memory;
- ``nodes``: Nodes in the view (pod-fits-node, and the KAI default pool's capacity);
  ``nodes, none fits``: a pod that fits no Node (pod-fits-node reads them all);
- ``workloads``: Deployments (and their ReplicaSets) in the namespace;
- ``projects``, ``queues``: KAI Projects under one Department, KAI Queues under one
  parent;
- ``entries``: queue entries in the judged Department's spec;
- ``pools``, ``templates``: WorkerPools / ActorTemplates in the namespace.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import gc
import math
import platform
import pstats
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cluster.view import StaticView  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.core.engine import evaluate  # noqa: E402
from app.core.ruleset import RuleSet, default_ruleset  # noqa: E402
from app.k8s import quantity  # noqa: E402
from app.rules.base import Rule, Subject  # noqa: E402

RULES = default_ruleset()
POLICY = Policy()
NS = "team-a"
KRM = "kai.resources/v1alpha1"
KAI = "scheduling.run.ai/v2"
ATE = "ate.dev/v1alpha1"

Objects = list[dict[str, Any]]
Build = Callable[[int], tuple[dict[str, Any], dict[str, Any] | None, str, Objects]]
"""size -> (object, old object or None, operation, view objects)"""


# --------------------------------------------------------------------------- builders

def _container(name: str, env: int = 0, cpu: str = "2", memory: str = "1Gi") -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "registry.example/app:1",
                         "resources": {"requests": {"cpu": "500m", "memory": memory},
                                       "limits": {"cpu": cpu, "memory": memory}}}
    if env:
        c["env"] = [{"name": f"V{i}", "value": f"value-{i}"} for i in range(env)] + \
            [{"name": "RESOURCE_LIMITS", "value": f"cpu={cpu},memory={memory},x=$(V{env // 2})"}]
    return c


def _deployment(containers: int = 2, env: int = 0, cpu: str = "2", memory: str = "1Gi",
                name: str = "web") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [_container(f"c{i}", env, cpu, memory) for i in range(containers)],
            "initContainers": [_container(f"i{i}", 0, cpu, memory) for i in range(containers // 4)]}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}


def _limit_range(i: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": f"lr{i}", "namespace": NS},
            "spec": {"limits": [{"type": "Container", "default": {"cpu": f"{i + 1}", "memory": f"{i + 1}Gi"},
                                 "defaultRequest": {"cpu": "100m"}, "max": {"cpu": "64"}},
                                {"type": "Pod", "max": {"cpu": "128"}}]}}


def _quota(i: int) -> dict[str, Any]:
    hard = {"limits.cpu": f"{100 + i}", "requests.memory": "1Ti", "limits.memory": "2Ti"}
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": f"q{i}", "namespace": NS},
            "spec": {"hard": hard}, "status": {"hard": hard, "used": {"limits.cpu": "1"}}}


def _node(i: int, pool: str | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": f"n{i}", "zone": f"z{i % 3}", **({"pool": pool} if pool else {})}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"n{i}", "labels": labels},
            "status": {"allocatable": {"cpu": f"{8 + i % 4}", "memory": f"{32 + i % 8}Gi", "pods": "110",
                                       "nvidia.com/gpu": "8"}}}


def _workload_ns(n: int) -> Objects:
    out: Objects = []
    for i in range(n):
        d = _deployment(2, name=f"w{i}")
        rs = copy.deepcopy(d)
        owner = [{"kind": "Deployment", "name": f"w{i}"}]
        rs["kind"], rs["metadata"] = "ReplicaSet", {"name": f"w{i}-abc", "namespace": NS,
                                                    "ownerReferences": owner}
        out += [d, rs]
    return out


def _entry(name: str, pool: str = "rtx", gpu: float = 1) -> dict[str, Any]:
    return {"name": name, "nodepool": pool,
            "resources": {"gpu": {"deserved": gpu, "limit": -1, "overQuotaWeight": 1},
                          "cpu": {"deserved": 0, "limit": -1, "overQuotaWeight": 1},
                          "memory": {"deserved": 0, "limit": -1, "overQuotaWeight": 1}}}


def _department(name: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "Department", "metadata": {"name": name}, "spec": {"queues": entries}}


def _project(name: str, parent: str, gpu: float = 0.01) -> dict[str, Any]:
    return {"apiVersion": KRM, "kind": "Project", "metadata": {"name": name},
            "spec": {"parent": parent, "queues": [_entry(name, gpu=gpu)]}}


def _kai_queue(name: str, parent: str = "", quota: float = 0.01) -> dict[str, Any]:
    spec: dict[str, Any] = {"resources": {"gpu": {"quota": quota, "limit": -1, "overQuotaWeight": 1}}}
    if parent:
        spec["parentQueue"] = parent
    return {"apiVersion": KAI, "kind": "Queue", "metadata": {"name": name}, "spec": spec}


def _kai_base(nodes: int = 4) -> Objects:
    return [{"apiVersion": KRM, "kind": "NodePool", "metadata": {"name": "rtx"},
             "spec": {"labelKey": "pool", "labelValue": "rtx"}},
            _department("research", [_entry("research", gpu=1_000_000)]),
            *(_node(i, "rtx") for i in range(nodes))]


def _template(limits: dict[str, str], name: str = "agent") -> dict[str, Any]:
    return {"apiVersion": ATE, "kind": "ActorTemplate", "metadata": {"name": name, "namespace": NS},
            "spec": {"sandboxClass": "microvm", "snapshotsConfig": {"location": "gs://s/team-a"},
                     "containers": [{"name": "main", "image": "registry.example/agent@sha256:00"}],
                     "resources": {"limits": dict(limits)}}}


def _pool(name: str, cpu: str = "8", memory: str = "16Gi") -> dict[str, Any]:
    return {"apiVersion": ATE, "kind": "WorkerPool", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 2, "ateomImage": "registry.example/ateom@sha256:00",
                     "sandboxClass": "microvm",
                     "template": {"resources": {"limits": {"cpu": cpu, "memory": memory}}}}}


# --------------------------------------------------------------------------- cases

@dataclass(frozen=True)
class Case:
    dimension: str
    sizes: tuple[int, ...]
    build: Build
    reads: frozenset[str] = frozenset()
    """View kinds the dimension grows: rules reading none of them are not measured on
    it (input dimensions, with no reads, apply to every rule of the kind)."""


def _wl(containers: int = 2, env: int = 0, **kw: Any) -> dict[str, Any]:
    return _deployment(containers, env, **kw)


DEFAULT_NS = [_limit_range(0), _quota(0)]

CASES: dict[str, list[Case]] = {
    "Deployment": [
        Case("containers", (100, 200, 400, 800), lambda n: (_wl(n), None, "CREATE", DEFAULT_NS)),
        Case("env", (250, 500, 1000, 2000), lambda n: (_wl(4, n), None, "CREATE", DEFAULT_NS)),
        Case("digits", (25_000, 50_000, 100_000, 200_000),
             lambda n: (_wl(2, memory="1" * n), None, "CREATE", DEFAULT_NS)),
        Case("limitranges", (4, 8, 16, 32),
             lambda n: (_wl(4), None, "CREATE", [*(_limit_range(i) for i in range(n)), _quota(0)]),
             frozenset({"LimitRange"})),
        Case("limitranges>32", (64, 128, 256, 512),
             lambda n: (_wl(4), None, "CREATE", [*(_limit_range(i) for i in range(n)), _quota(0)]),
             frozenset({"LimitRange"})),
        Case("quotas", (25, 50, 100, 200),
             lambda n: (_wl(4), None, "CREATE", [_limit_range(0)] + [_quota(i) for i in range(n)]),
             frozenset({"ResourceQuota"})),
        Case("nodes", (250, 500, 1000, 2000),
             lambda n: (_wl(4), None, "CREATE", [_node(i) for i in range(n)]), frozenset({"Node"})),
        Case("nodes, none fits", (250, 500, 1000, 2000),
             lambda n: (_wl(1, cpu="100"), None, "CREATE", [_node(i) for i in range(n)]),
             frozenset({"Node"})),
        Case("workloads", (100, 200, 400, 800),
             lambda n: (_wl(4), None, "CREATE", [*_workload_ns(n), _quota(0)]),
             frozenset({"Deployment", "ReplicaSet", "StatefulSet"})),
    ],
    "Project": [
        Case("projects", (250, 500, 1000, 2000),
             lambda n: (_project("p-new", "research", 0.5), None, "CREATE",
                        _kai_base() + [_project(f"p{i}", "research") for i in range(n)]),
             frozenset({"Project"})),
        Case("nodes", (250, 500, 1000, 2000),
             lambda n: (_project("p-new", "research", 0.5), None, "CREATE", _kai_base(n)),
             frozenset({"Node"})),
    ],
    "Queue": [
        Case("queues", (250, 500, 1000, 2000),
             lambda n: (_kai_queue("q-new", "parent", 0.5), _kai_queue("q-new", "parent", 0.25), "UPDATE",
                        [_kai_queue("parent", quota=1_000_000)]
                        + [_kai_queue(f"q{i}", "parent") for i in range(n)]),
             frozenset({"Queue"})),
    ],
    "Department": [
        Case("entries", (50, 100, 200, 400),
             lambda n: (_department("big", [_entry(f"e{i}", pool=f"pool{i}", gpu=0) for i in range(n)]),
                        None, "CREATE", _kai_base())),
        Case("nodes", (250, 500, 1000, 2000),
             lambda n: (_department("d", [_entry("d", pool="default", gpu=2)]), None, "CREATE",
                        [_node(i) for i in range(n)]),
             frozenset({"Node"})),
    ],
    "ActorTemplate": [
        Case("digits", (25_000, 50_000, 100_000, 200_000),
             lambda n: (_template({"cpu": "1", "memory": "1" * n}), _template({"cpu": "1", "memory": "1Gi"}),
                        "UPDATE", [_pool("roomy")])),
        Case("pools", (100, 200, 400, 800),
             lambda n: (_template({"cpu": "1", "memory": "1Gi"}), None, "CREATE",
                        [_pool(f"p{i}", cpu=f"{1 + i % 8}") for i in range(n)]),
             frozenset({"WorkerPool"})),
    ],
    "WorkerPool": [
        Case("digits", (25_000, 50_000, 100_000, 200_000),
             lambda n: (_pool("roomy", cpu="1" * n), _pool("roomy"), "UPDATE", [_pool("roomy")])),
        Case("templates", (100, 200, 400, 800),
             lambda n: (_pool("roomy", cpu="1"), _pool("roomy"), "UPDATE",
                        [_pool("roomy")] + [_template({"cpu": "2", "memory": "1Gi"}, name=f"t{i}")
                                            for i in range(n)]),
             frozenset({"ActorTemplate"})),
    ],
}


# --------------------------------------------------------------------------- timing

def _subject(obj: dict[str, Any], old: dict[str, Any] | None, operation: str) -> Subject:
    group, _, version = obj["apiVersion"].rpartition("/")
    meta = obj["metadata"]
    return Subject(group, version, obj["kind"], operation, meta.get("namespace", ""), meta["name"],
                   obj, old)


def _time(rules: RuleSet, rule: Rule, subject: Subject, view: StaticView) -> float:
    """The garbage collector is off while a review runs (its full passes over the
    views of every size would be charged to whichever review they land in), and long
    quantity strings are parsed afresh each time (a new review carries new strings)."""
    times: list[float] = []
    spent = 0.0
    while len(times) < 3 or (spent < 0.3 and len(times) < 50):
        quantity.clear_long_cache()
        gc.disable()
        try:
            start = time.perf_counter()
            evaluate(rules, subject, view, POLICY, rule.phase)
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        times.append(elapsed)
        spent += elapsed
    return min(times)


def _calls(rules: RuleSet, rule: Rule, subject: Subject, view: StaticView) -> int:
    """Function calls (Python and built-in) of one review, counted by cProfile: a
    measure of work that the machine's load and caches do not move."""
    quantity.clear_long_cache()
    profiler = cProfile.Profile()
    profiler.enable()
    evaluate(rules, subject, view, POLICY, rule.phase)
    profiler.disable()
    return int(pstats.Stats(profiler).total_calls)  # type: ignore[attr-defined]


def slope(sizes: list[int], times: list[float]) -> float:
    """Least-squares exponent of time against size (log-log)."""
    xs = [math.log(s) for s in sizes]
    ys = [math.log(max(t, 1e-9)) for t in times]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _applies(rule: Rule, subject: Subject) -> bool:
    return (subject.group, subject.kind) in rule.kinds and subject.operation in rule.operations


Row = tuple[str, str, list[int], list[float], float, list[int], float]
"""rule, what grows, sizes, seconds, time slope, calls, calls slope"""


def measure(quick: bool, only: str | None) -> list[Row]:
    rows = []
    for kind, cases in CASES.items():
        for case in cases:
            sizes = [max(1, s // 2) for s in case.sizes] if quick else list(case.sizes)
            built = []
            for n in sizes:
                obj, old, operation, objects = case.build(n)
                built.append((_subject(obj, old, operation), StaticView(objects, RULES.indexes)))
            subject0 = built[0][0]
            for rule in RULES.rules.values():
                if only and only not in rule.id:
                    continue
                if not _applies(rule, subject0) or (case.reads and not case.reads & rule.reads):
                    continue
                one = RuleSet([rule], RULES.copiers, RULES.indexes, RULES.updates)
                gc.collect()
                times = [_time(one, rule, subject, view) for subject, view in built]
                calls = [_calls(one, rule, subject, view) for subject, view in built]
                rows.append((rule.id, f"{kind} {case.dimension}", sizes, times, slope(sizes, times),
                             calls, slope(sizes, [float(c) for c in calls])))
                print(f"{rule.id:32} {kind + ' ' + case.dimension:26} "
                      + " ".join(f"{t * 1000:9.3f}" for t in times)
                      + f"   slope {rows[-1][4]:5.2f}   calls {calls[-1]:>9,} slope {rows[-1][6]:5.2f}",
                      flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="half the sizes")
    parser.add_argument("--rule", help="only rules whose id contains this")
    args = parser.parse_args(argv)
    print(f"# rulecost {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, Python {platform.python_version()}, "
          f"{platform.machine()}, times in ms (minimum of repetitions) at each size")
    rows = measure(args.quick, args.rule)
    print("\n| rule | grows | sizes | ms at each size | time slope | calls at largest | calls slope |"
          "\n|---|---|---|---|---|---|---|")
    for rid, what, sizes, times, exponent, calls, calls_exponent in rows:
        print(f"| {rid} | {what} | {', '.join(f'{s:,}' for s in sizes)} | "
              f"{', '.join(f'{t * 1000:.3g}' for t in times)} | {exponent:.2f} | {calls[-1]:,} | "
              f"{calls_exponent:.2f} |")
    worst = [r for r in rows if r[6] > 1.2]
    print(f"\nsuper-linear work (calls slope > 1.2): "
          f"{', '.join(f'{r[0]} ({r[1]}, {r[6]:.2f})' for r in worst) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
