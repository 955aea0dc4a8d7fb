"""Cost of ``namespace-memory-composition`` in ``envelope check``: one namespace of N
Deployments, with no memory ResourceQuota, with one the Deployments fit in, and with one
they exceed (every Deployment then draws the warning, with its breakdown).

Run by hand (``.venv/bin/python bench/composition.py``), not in the test suite. Each case
is ``envelope check -f DIR`` in a fresh process; the CPU seconds (user + system, from
the child's rusage) are the comparable number on a shared machine. ``--root`` runs the
same files through another checkout (``git archive <commit> | tar -x -C DIR``) with this
interpreter, for a before/after comparison: the child's working directory is that root,
so its ``app`` package is imported.

``--webhook``: the webhook path, in-process (``engine.evaluate(..., "validate")`` of a
Deployment UPDATE that replaces its stored copy, the view a ``StaticView`` of the same
namespace), CPU per review: with the view unchanged between reviews, with a change to
another namespace before each, and with a change to a Deployment of the same namespace
before each (the worst case: the namespace is summed again).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHECK = "import sys; from app.cli import main; sys.exit(main(['check', '-f', {dir!r}]))"

MEMORY_MI = 64
"""Each Deployment: 1 replica, two containers of 32Mi (64Mi a pod)."""


def manifests(count: int, quota_mi: int | None) -> str:
    """``count`` Deployments in namespace ``team``, and a ``requests.memory`` quota of
    ``quota_mi`` MiB (none when None)."""
    docs = []
    if quota_mi is not None:
        docs.append("apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: memory, namespace: team}\n"
                    f"spec:\n  hard: {{requests.memory: {quota_mi}Mi}}\n")
    half = MEMORY_MI // 2
    for i in range(count):
        docs.append(
            "apiVersion: apps/v1\nkind: Deployment\n"
            f"metadata: {{name: svc-{i}, namespace: team}}\n"
            "spec:\n  replicas: 1\n"
            f"  selector: {{matchLabels: {{app: svc-{i}}}}}\n"
            "  template:\n"
            f"    metadata: {{labels: {{app: svc-{i}}}}}\n"
            "    spec:\n      containers:\n"
            + "".join(f"      - name: c{c}\n        image: registry.example/app:1\n"
                      f"        resources:\n          requests: {{memory: {half}Mi}}\n"
                      f"          limits: {{memory: {half}Mi}}\n" for c in range(2)))
    return "---\n".join(docs)


def timed(root: Path, target: str) -> tuple[float, float, int, str]:
    """Wall and CPU seconds of ``envelope check -f target`` run from ``root``, its exit
    status and the last line of its output."""
    before = os.times()
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _CHECK.format(dir=target)], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    wall = time.perf_counter() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    lines = done.stdout.strip().splitlines() or done.stderr.strip().splitlines() or [""]
    return wall, cpu, done.returncode, lines[-1]


CASES = {
    "no quota": None,
    "within the quota": lambda n: n * MEMORY_MI + 1024,
    "over the quota": lambda n: n * MEMORY_MI // 2,
}


_WEBHOOK = r"""
import statistics, sys, time
import yaml
from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import evaluate
from app.rules.base import Subject
from app.core.ruleset import default_ruleset
rules = default_ruleset()
objs = list(yaml.safe_load_all(open(sys.argv[1])))
view = StaticView(objs)
deployments = [o for o in objs if o["kind"] == "Deployment"]
def review(i):
    obj = deployments[i % len(deployments)]
    evaluate(rules, Subject("apps", "v1", "Deployment", "UPDATE", "team", obj["metadata"]["name"], obj, obj),
             view, Policy(), "validate")
out = []
for case in ("unchanged", "other namespace changed", "same namespace changed"):
    times = []
    for i in range(int(sys.argv[2])):
        if case != "unchanged":
            ns = "team" if case.startswith("same") else "other"
            meta = {"name": "svc-0" if ns == "team" else "x", "namespace": ns}
            spec = {**deployments[0]["spec"], "replicas": 1 + i % 2}
            changed = {**deployments[0], "metadata": meta, "spec": spec}
            view.add(changed)
        start = time.process_time()
        review(i)
        times.append(time.process_time() - start)
    out.append(f"{case}={statistics.median(times) * 1000:.3f}")
print(" ".join(out))
"""


def webhook(root: Path, target: str, reviews: int) -> str:
    done = subprocess.run([sys.executable, "-c", _WEBHOOK, target, str(reviews)], cwd=root,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root)})
    return done.stdout.strip() or done.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--deployments", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=1, help="runs per case (the median is shown)")
    parser.add_argument("--root", type=Path, action="append",
                        help="a checkout to run (repeatable; default: this one)")
    parser.add_argument("--case", choices=list(CASES), action="append")
    parser.add_argument("--webhook", type=int, metavar="REVIEWS", default=0,
                        help="also time REVIEWS webhook reviews per case, in-process (ms CPU, median)")
    args = parser.parse_args(argv)
    roots = args.root or [ROOT]
    print(f"{args.deployments} Deployments in one namespace; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or list(CASES):
            size = CASES[case]
            quota = None if size is None else size(args.deployments)  # type: ignore[operator]
            target = Path(tmp) / case.replace(" ", "-")
            target.mkdir()
            (target / "all.yaml").write_text(manifests(args.deployments, quota))
            for root in roots:
                runs = [timed(root, str(target)) for _ in range(args.rounds)]
                cpu = statistics.median(r[1] for r in runs)
                wall = statistics.median(r[0] for r in runs)
                print(f"{case:18} {root}: {cpu:6.2f} s CPU, {wall:6.2f} s wall, exit {runs[0][2]}; "
                      f"{runs[0][3][:100]}", flush=True)
                if args.webhook and quota is not None:
                    found = webhook(root, str(target / "all.yaml"), args.webhook)
                    print(f"{'':18} webhook review, ms CPU: {found}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
