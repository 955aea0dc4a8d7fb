"""Cost of the KAI quota rules: admission latency against cluster size, and `envelope check`.

Run by hand (``.venv/bin/python bench/quotas.py``), not in the test suite.

1. Admission: ``engine.evaluate(..., "validate")`` in-process for a Project UPDATE that
   grows a guarantee (so every rule runs its full path), in a view of 10,000 Projects,
   1,000 Departments, 50 NodePools and 5,000 Nodes, against the same update in a
   10-project cluster. Every request carries a new spec, as real requests do (the
   siblings it reads are the cluster's, parsed once). Targets: p99 ratio <= 1.5x,
   p99 <= 5 ms. Two Department UPDATEs are measured too: one on a labelled pool (pool
   capacity, shrink, limits) and one on the default pool, whose capacity is the one
   answer that reads every Node.
2. ``envelope check -f DIR`` wall time, as a fresh process, over a generated
   10,000-project tenancy. Target: < 5 s. The time of loading the YAML alone is
   printed beside it, because it is most of the total.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.cluster.view import StaticView  # noqa: E402
from app.core.config import Policy  # noqa: E402
from app.core.engine import evaluate  # noqa: E402
from app.core.ruleset import default_ruleset  # noqa: E402
from app.rules.base import Subject  # noqa: E402

RULES = default_ruleset()


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_tenancy", ROOT / "examples" / "make_tenancy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_tenancy"] = module
    spec.loader.exec_module(module)
    return module


TENANCY = _generator()


def cluster(departments: int, pools: int, usage: bool = True) -> list[dict[str, Any]]:
    """The generated tenancy, plus 4 unlabelled 8-card nodes (the default pool) and a
    department "shared" guaranteed 20 of their 32 cards. With ``usage``, the KAI Queue KRM
    generates for every queue entry, with a status (``status.allocated``, 4.5 cards per
    project queue, the sum on a department's), so the kai-usage-* rules run their full
    path (app/rules/quotas/usage.py)."""
    files = TENANCY.scaled(departments, projects_per_department=10, pools=pools, nodes_per_department=5)
    objects = [obj for text in files.values() for obj in TENANCY.load(text)]
    objects += [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"shared-{i}", "labels": {}},
                 "status": {"allocatable": {"nvidia.com/gpu": "8"}}} for i in range(4)]
    objects.append({"apiVersion": "kai.resources/v1alpha1", "kind": "Department",
                    "metadata": {"name": "shared"},
                    "spec": {"queues": [{"name": "shared", "nodepool": "default",
                                         "resources": {"gpu": {"deserved": 20, "limit": -1}}}]}})
    if usage:
        objects += _queues(objects)
    return objects


def _queues(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """KRM's generated Queues with KAI's status, for every Department and Project entry."""
    from app.crds.kai import queue_name

    out = []
    held: dict[tuple[str, str], float] = {}
    for kind in ("Project", "Department"):
        for obj in (o for o in objects if o["kind"] == kind):
            name = obj["metadata"]["name"]
            for entry in obj["spec"].get("queues") or []:
                queue = queue_name(entry.get("name") or "", name, entry["nodepool"])
                if kind == "Project":
                    cards = 4.5
                    key = (obj["spec"].get("parent") or "", entry["nodepool"])
                    held[key] = held.get(key, 0.0) + cards
                else:
                    cards = held.get((name, entry["nodepool"]), 0.0)
                owner = {"apiVersion": "kai.resources/v1alpha1", "kind": kind, "name": name, "uid": name}
                out.append({"apiVersion": "scheduling.run.ai/v2", "kind": "Queue",
                            "metadata": {"name": queue, "ownerReferences": [owner]},
                            "spec": {"resources": {}},
                            "status": {"allocated": {"nvidia.com/gpu": str(cards), "cpu": "4"},
                                       "requested": {"nvidia.com/gpu": str(cards), "cpu": "4"}}})
    return out


def _named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _update(old: dict[str, Any], gpu: float) -> Callable[[int], Subject]:
    """Subjects for UPDATEs of ``old``: gpu deserved set to ``gpu``, cpu different each time."""

    def make(i: int) -> Subject:
        new = copy.deepcopy(old)
        resources = new["spec"]["queues"][0]["resources"]
        resources["gpu"]["deserved"] = gpu
        resources["cpu"] = {"deserved": 0, "limit": 1000 + i, "overQuotaWeight": 1}
        return Subject("kai.resources", "v1alpha1", old["kind"], "UPDATE", "",
                       old["metadata"]["name"], new, old)

    return make


def _cut(old: dict[str, Any], limit: float) -> Callable[[int], Subject]:
    """UPDATEs that cut the first queue's gpu limit below what its projects hold (the
    kai-usage-* rules warn; nothing is refused), cpu different each time."""
    make_update = _update(old, old["spec"]["queues"][0]["resources"]["gpu"]["deserved"])

    def make(i: int) -> Subject:
        subject = make_update(i)
        assert subject.obj is not None
        gpu = subject.obj["spec"]["queues"][0]["resources"]["gpu"]
        gpu["limit"] = max(limit, gpu["deserved"])
        return subject

    return make


def latencies(view: StaticView, subjects: list[Subject]) -> list[float]:
    policy = Policy()
    out = []
    for subject in subjects:
        start = time.perf_counter_ns()
        result = evaluate(RULES, subject, view, policy, "validate")
        out.append((time.perf_counter_ns() - start) / 1e6)
        assert not result.errors and not result.internal_errors, (result.findings, result.internal_errors)
    return sorted(out)


def _p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def admission(n: int, rounds: int) -> dict[str, dict[str, float]]:
    """Both views are built first and frozen out of the garbage collector
    (``gc.freeze``, as a long-lived cache would be); then rounds of ``n`` requests
    alternate between them, so noise from the machine lands on both alike. A case's
    p99 is the median of its rounds' p99s; p50 and mean are over every request."""
    views = {}
    for label, departments, pools in (("small", 1, 2), ("large", 1000, 50)):
        objects = cluster(departments, pools)
        counts = {k: sum(o["kind"] == k for o in objects)
                  for k in ("Project", "Department", "NodePool", "Node", "Queue")}
        print(f"{label} view: {counts}")
        project = _named(objects, "Project", "dept-0000-p09")  # 3 of the department's 39 cards
        department = _named(objects, "Department", "dept-0000")
        views[label] = (StaticView(objects, RULES.indexes), {
            "project": _update(project, 4), "department": _update(department, 40),
            "default-pool": _update(_named(objects, "Department", "shared"), 21),
            "department-cut": _cut(department, 40)})
    gc.collect()
    gc.freeze()
    seen: dict[str, list[float]] = {}
    p99s: dict[str, list[float]] = {}
    for r in range(rounds + 1):
        for label, (view, makers) in views.items():
            for what, make in makers.items():
                values = latencies(view, [make(r * n + i) for i in range(n)])
                if r == 0:
                    continue  # warm-up round
                seen.setdefault(f"{what}/{label}", []).extend(values)
                p99s.setdefault(f"{what}/{label}", []).append(_p(values, 0.99))
    gc.unfreeze()
    return {case: {"p50": statistics.median(values), "p99": statistics.median(p99s[case]),
                   "mean": statistics.fmean(values)} for case, values in seen.items()}


_CHECK = "import sys, app.rules.quotas; from app.cli import main; sys.exit(main(['check', '-f', {dir!r}]))"
_LOAD = ("import time; from app.cluster.static import load_manifests; t = time.perf_counter(); "
         "c = time.process_time(); load_manifests([{dir!r}]); "
         "print(time.perf_counter() - t, time.process_time() - c)")


def _timed(code: str, env: dict[str, str] | None = None
           ) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU (user + system, from the child's rusage) seconds of a fresh process."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu, done


USAGE_OFF = {f"ENVELOPE_RULE_KAI_USAGE_{r}": "off" for r in ("LIMIT", "GUARANTEE", "CHILDREN")}


def check_wall_time(departments: int, usage: bool = False) -> dict[str, float]:
    """``envelope check`` as a fresh process (wall and CPU seconds), then the YAML loading
    alone (libyaml's parser, go-yaml v2 scalar resolution, node marks). With ``usage``,
    the generated KAI Queues with status are written too (``queues.yaml``), and the check
    runs again with the kai-usage-* rules off: the difference is their cost."""
    with tempfile.TemporaryDirectory() as tmp:
        target = str(Path(tmp) / "tenancy")
        files = TENANCY.scaled(departments)
        if usage:
            import yaml

            generated = [o for text in files.values() for o in TENANCY.load(text)]
            files["queues.yaml"] = yaml.safe_dump_all(_queues(generated))
        TENANCY.write(files, Path(target))
        wall, cpu, done = _timed(_CHECK.format(dir=target))
        summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr
        print(f"envelope check: exit {done.returncode}; {summary}")
        _, _, loaded = _timed(_LOAD.format(dir=target))
        load_wall, load_cpu = (float(x) for x in (loaded.stdout.split() or ["nan", "nan"]))
        out = {"wall": wall, "cpu": cpu, "load": load_wall, "load_cpu": load_cpu,
               "exit": done.returncode}
        if usage:
            off_wall, off_cpu, _ = _timed(_CHECK.format(dir=target), USAGE_OFF)
            out.update(off_wall=off_wall, off_cpu=off_cpu)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000, help="requests per case and round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--skip-admission", action="store_true")
    args = parser.parse_args(argv)

    results = admission(args.n, args.rounds) if not args.skip_admission else {}
    print(f"\n{'case':<26}{'p50 ms':>9}{'p99 ms':>9}{'mean ms':>9}")
    for case, r in results.items():
        print(f"{case:<26}{r['p50']:>9.3f}{r['p99']:>9.3f}{r['mean']:>9.3f}")
    ok = True
    for what in ("project", "department", "default-pool", "department-cut") if results else ():
        ratio = results[f"{what}/large"]["p99"] / results[f"{what}/small"]["p99"]
        p99 = results[f"{what}/large"]["p99"]
        print(f"{what + ' update:':<21} p99 large/small = {ratio:.2f}x (target <= 1.5x), "
              f"p99 large = {p99:.3f} ms (target <= 5 ms)")
        ok = ok and (what != "project" or (ratio <= 1.5 and p99 <= 5))
    if not args.skip_check:
        check = check_wall_time(1000)
        print(f"envelope check over 10,000 projects: {check['wall']:.2f} s wall (target < 5 s), "
              f"{check['cpu']:.2f} s CPU; loading the YAML alone {check['load']:.2f} s wall, "
              f"{check['load_cpu']:.2f} s CPU")
        ok = ok and check["wall"] < 5 and check["exit"] == 0
        usage = check_wall_time(1000, usage=True)
        print(f"envelope check over 10,000 projects and their 11,001 KAI Queues with status: "
              f"{usage['wall']:.2f} s wall, {usage['cpu']:.2f} s CPU; with the kai-usage-* rules "
              f"off {usage['off_wall']:.2f} s wall, {usage['off_cpu']:.2f} s CPU; loading the YAML "
              f"alone {usage['load_cpu']:.2f} s CPU")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
