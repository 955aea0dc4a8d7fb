"""``downward-cpu-limit`` on the real kubelet: what a container reads of ``limits.cpu``
through its environment, with the limit (as written) and without
it (through Envelope), is what the rule's warning says it reads: the limit, then the
node's allocatable CPU (``pkg/kubelet/kubelet_resources.go``
``defaultPodLimitsForDownwardAPI``), rounded up by the divisor. (A downwardAPI volume
reads the same value but is a tmpfs the kubelet mounts, which containerd cannot see on
this node: docs/testing.md "The node".)"""

from __future__ import annotations

import math
from typing import Any

import nodepods as p
import pytest
from conftest import NodeEnv

from app.cluster.view import StaticView
from app.core.config import Policy
from app.core.engine import check_object
from app.core.ruleset import default_ruleset
from app.k8s.quantity import parse_quantity
from app.rules.base import Subject

pytestmark = pytest.mark.e2e

READ = 'echo "env=$CPU_LIMIT milli=$CPU_LIMIT_MILLI request=$CPU_REQUEST"; ' \
       "while :; do sleep 5; done"


def _reader(name: str, ns: str, env: NodeEnv) -> dict[str, Any]:
    def field(resource: str, divisor: str = "1") -> dict[str, Any]:
        return {"resourceFieldRef": {"containerName": "app", "resource": resource, "divisor": divisor}}

    res = {"cpu": "1", "memory": "16Mi"}
    return p.pod(name, ns, env.node, p.box(
        "app", READ, requests=res, limits=res,
        env=[{"name": "CPU_LIMIT", "valueFrom": field("limits.cpu")},
             {"name": "CPU_LIMIT_MILLI", "valueFrom": field("limits.cpu", "1m")},
             {"name": "CPU_REQUEST", "valueFrom": field("requests.cpu")}]))


def _read(env: NodeEnv, ns: str, name: str) -> dict[str, str]:
    running = p.wait_running(env.node, ns, name)
    line: list[str] = []

    def printed() -> bool:
        line[:] = [x for x in env.node.container_log(running, "app").splitlines() if "env=" in x]
        return bool(line)

    env.node.wait(f"{ns}/{name} to print what it reads", printed, 60)
    text = line[-1].split(" ", 3)[-1]  # CRI log line: time stream tag text
    return dict(part.split("=", 1) for part in text.split())


def test_what_the_container_reads_of_its_cpu_limit_is_what_the_warning_says(node_env: NodeEnv) -> None:
    env = node_env
    plain, judged = env.namespace("downward-plain", webhook=False), env.namespace("downward-envelope")
    p.create(env.cluster, _reader("reader", plain, env))
    _, warnings = p.create(env.cluster, _reader("reader", judged, env))
    try:
        written, stripped = _read(env, plain, "reader"), _read(env, judged, "reader")
    finally:
        for ns in (plain, judged):
            p.delete(env.cluster, ns, "reader")
    allocatable = parse_quantity(env.node.node_object()["status"]["allocatable"]["cpu"])
    print(f"downward: with the limit {written}; through Envelope {stripped}; allocatable {allocatable}")

    assert written == {"env": "1", "milli": "1000", "request": "1"}
    assert stripped == {"env": str(math.ceil(allocatable)), "milli": str(int(allocatable * 1000)),
                        "request": "1"}
    said = [w for w in warnings if w.startswith("envelope[downward-cpu-limit]")]
    assert len(said) == 2, warnings  # the two env vars that read limits.cpu
    # The webhook's warnings keep ~120 characters; the rule's whole message, as `envelope
    # check` prints it, says what the container was shown to read.
    manifest = _reader("reader", judged, env)
    full = check_object(default_ruleset(), Subject("", "v1", "Pod", "CREATE", judged, "reader", manifest),
                        StaticView([env.node.node_object()]), Policy())
    messages = sorted(f.message for f in full.findings if f.rule == "downward-cpu-limit")
    assert len(messages) == 2, messages
    for message in messages:
        assert "stripped, it reads the node's allocatable CPU" in message, message
