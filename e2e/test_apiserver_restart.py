"""Restart kube-apiserver under a running webhook: the webhook does not crash, its
readiness reports the lost watches, and recovers when the API server is back.

Marked to run last (e2e/conftest.py): it takes the API server away from every other test."""

from __future__ import annotations

import json
import ssl
import time

import pytest

import harness
from builders import SEED, container, deployment
from harness import Cluster, Webhook

pytestmark = pytest.mark.last  # it takes the session's API server away (e2e/conftest.py)


def readyz(webhook: Webhook) -> tuple[int, str]:
    ctx = ssl.create_default_context(cafile=str(webhook.ca_file))
    try:
        return harness.https_get(f"{webhook.url}/readyz", ctx, timeout=3)
    except OSError as exc:
        return 0, str(exc)


def wait_for(check, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout}s: {what}"
        time.sleep(0.5)


def test_webhook_survives_an_apiserver_restart(cluster: Cluster, webhook: Webhook, namespace: str) -> None:
    assert readyz(webhook)[0] == 200
    [apiserver] = [p for p in cluster.processes if p.name == "kube-apiserver"]
    apiserver.stop(timeout=20)
    # The webhook's watches are gone; past the staleness bound readiness says so.
    wait_for(lambda: readyz(webhook)[0] == 503, 40, "readiness to report lost watches")
    _, body = readyz(webhook)
    assert "watch lost" in body, body
    assert webhook.process.alive()

    restarted = harness.start_process(apiserver.cmd, cluster.workdir / "kube-apiserver.restart.log",
                                      name="kube-apiserver")
    cluster.processes[cluster.processes.index(apiserver)] = restarted
    wait_for(lambda: cluster.get_raw("/readyz")[0] == 200 if _reachable(cluster) else False, 120,
             "kube-apiserver back")
    wait_for(lambda: readyz(webhook)[0] == 200, 90, f"webhook ready again: {readyz(webhook)[1]}")
    assert webhook.process.alive()
    out = cluster.apply(deployment("after-restart", namespace, container(**SEED)))
    assert out.returncode == 0
    stored = json.loads(cluster.kubectl("get", "deployment", "after-restart", "-n", namespace,
                                        "-o", "json").stdout)
    assert "cpu" not in stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def _reachable(cluster: Cluster) -> bool:
    try:
        cluster.get_raw("/readyz", timeout=3)
    except OSError:
        return False
    return True
