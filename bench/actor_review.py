"""Cost of one ActorTemplate CREATE through the validate phase, in-process.

Run by hand (``.venv/bin/python bench/actor_review.py``), not in the test suite.

The engine judges a micro-VM ActorTemplate (every ActorTemplate rule that applies to
a CREATE) against ``--pools`` WorkerPools of its class in its namespace, as
``engine.evaluate`` does for ``POST /validate``. Each review is a new template name,
``--distinct`` distinct templates in turn (so the decode memo of ``app.crds.actortypes``
sees repeats only after that many). Prints the best and the median of 5 rounds, in
microseconds per review.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import evaluate
from app.core.ruleset import default_ruleset
from app.rules.base import Subject

NS = "team-a"


def pool(i: int) -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": f"pool-{i}", "namespace": NS, "labels": {"tier": "gold"}},
            "spec": {"sandboxClass": "microvm", "replicas": 2,
                     "template": {"resources": {"limits": {"cpu": str(2 + i % 8), "memory": f"{4 + i}Gi"}}}}}


def review(i: int) -> Subject:
    obj = {"apiVersion": "ate.dev/v1alpha1", "kind": "ActorTemplate",
           "metadata": {"name": f"agent-{i}", "namespace": NS},
           "spec": {"sandboxClass": "microvm", "workerSelector": {"matchLabels": {"tier": "gold"}},
                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}},
                    "containers": [{"name": "main", "image": "registry.example/agent@sha256:00"}]}}
    return Subject("ate.dev", "v1alpha1", "ActorTemplate", "CREATE", NS, f"agent-{i}", obj)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--distinct", type=int, default=10_000)
    parser.add_argument("--reviews", type=int, default=2_000)
    args = parser.parse_args()
    rules = default_ruleset()
    view = StaticView([pool(i) for i in range(args.pools)], rules.indexes)
    policy = Policy.model_validate({})
    for i in range(200):
        evaluate(rules, review(i % args.distinct), view, policy, "validate")
    rounds = []
    done = 0
    for _ in range(5):
        subjects = [review((done + i) % args.distinct) for i in range(args.reviews)]
        done += args.reviews
        start = time.perf_counter()
        for subject in subjects:
            evaluate(rules, subject, view, policy, "validate")
        rounds.append((time.perf_counter() - start) / args.reviews * 1e6)
    print(f"ActorTemplate CREATE, validate, {args.pools} WorkerPools: best {min(rounds):.0f} us, "
          f"median {statistics.median(rounds):.0f} us per review")


if __name__ == "__main__":
    main()
