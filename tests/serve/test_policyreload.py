"""The policy file reloaded without a restart (app/serve/policyreload.py): swapped as a
ConfigMap volume swaps it (the ``..data`` symlink), a bad file refused with the old
policy kept, the generation, the metrics and /readyz, and the reviews that follow."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from app.core.config import ConfigError, Mode, Policy
from app.serve.policyreload import PolicyReloader, ReloadMetrics
from app.serve.server import InTreeEndpoint, Metrics, create_app
from tests.conftest import RULES, container, workload
from tests.helpers.configmap import ConfigMapVolume

RULE = "memory-request-equals-limit"
ENFORCED = f"rules:\n  {RULE}: enforce\n"
WARNED = (f"rules:\n  {RULE}: warn\nexceptions:\n  - rules: [cpu-limits]\n"
          f"    namespaces: [team-b]\n    reason: live\n")


class Holder:
    policy: Policy | None = None

    def set(self, policy: Policy) -> None:
        self.policy = policy


def reloader_on(tmp_path: Path, text: str = ENFORCED) -> tuple[ConfigMapVolume, PolicyReloader, Holder]:
    volume = ConfigMapVolume(tmp_path, text)
    holder = Holder()
    reloader = PolicyReloader(volume.path, RULES, holder.set, environ={})
    reloader.load_initial()
    return volume, reloader, holder


def test_a_configmap_swap_installs_the_new_policy_as_the_next_generation(tmp_path: Path) -> None:
    volume, reloader, holder = reloader_on(tmp_path)
    assert reloader.generation == 1 and holder.policy is not None
    assert holder.policy.rules[RULE] is Mode.ENFORCE
    assert reloader.check() is False  # nothing changed: nothing read again
    volume.update(WARNED)
    assert reloader.check() is True
    assert reloader.generation == 2
    assert holder.policy.rules[RULE] is Mode.WARN
    assert [e.namespaces for e in holder.policy.exceptions] == [["team-b"]]
    assert reloader.sha256 == hashlib.sha256(WARNED.encode()).hexdigest()
    volume.update(WARNED)  # a new ..data with the same bytes: same policy, no generation
    assert reloader.check() is False and reloader.generation == 2
    volume.update(ENFORCED)  # and back: a new generation, not the first one again
    assert reloader.check() is True and reloader.generation == 3
    assert holder.policy.rules[RULE] is Mode.ENFORCE


@pytest.mark.parametrize(("bad", "said"), [
    ("rules: [unclosed\n", "not valid YAML"),
    (f"rules:\n  {RULE}: enforced\n", f"rules.{RULE}"),
    ("rules:\n  memory-request-equals-limits: warn\n", "unknown rule id"),
    ("- a list\n", "expected a mapping at the top level"),
    ("exceptions:\n  - rules: [cpu-limits]\n", "needs at least one of namespaces"),
])
def test_a_bad_file_is_refused_once_with_the_old_policy_kept(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, bad: str, said: str) -> None:
    volume, reloader, holder = reloader_on(tmp_path)
    serving, digest = holder.policy, reloader.sha256
    volume.update(bad)
    with caplog.at_level(logging.WARNING, logger="envelope"):
        assert reloader.check() is False
        os.utime(volume.path)  # touched, same bad bytes: not said or counted again
        assert reloader.check() is False
    assert holder.policy is serving and reloader.sha256 == digest and reloader.generation == 1
    assert reloader.failures == 1
    lines = [r.getMessage() for r in caplog.records if "reload refused" in r.getMessage()]
    assert len(lines) == 1, lines
    assert str(volume.path) in lines[0] and said in lines[0] and "\n" not in lines[0]
    assert "still serving generation 1" in lines[0]
    volume.update(WARNED)  # fixed: it loads, and the error is gone
    assert reloader.check() is True and reloader.generation == 2 and reloader.last_error == ""


def test_an_edit_that_keeps_the_stat_is_seen_by_the_digest(tmp_path: Path) -> None:
    volume, reloader, holder = reloader_on(tmp_path)
    target = volume.path.resolve()
    before = os.stat(target)
    edited = ENFORCED.replace("enforce", "warn   ")  # same size
    target.write_text(edited)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert reloader.check() is False  # the stat alone says nothing changed
    assert reloader.check(digest_anyway=True) is True
    assert holder.policy is not None and holder.policy.rules[RULE] is Mode.WARN


def test_a_removed_file_keeps_the_policy_and_says_so(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    volume, reloader, holder = reloader_on(tmp_path)
    serving = holder.policy
    (volume.root / "..data").unlink()
    with caplog.at_level(logging.WARNING, logger="envelope"):
        assert reloader.check() is False
        assert reloader.check() is False
    assert holder.policy is serving and reloader.failures == 1
    assert "cannot read" in reloader.last_error


def test_accept_refuses_what_this_start_cannot_serve(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path, ENFORCED)
    holder = Holder()
    reloader = PolicyReloader(volume.path, RULES, holder.set, environ={},
                              accept=lambda p: "no" if p.exceptions else None)
    reloader.load_initial()
    volume.update(WARNED)
    assert reloader.check() is False and reloader.generation == 1
    assert reloader.last_error.endswith(": no")


def test_the_first_load_of_a_bad_file_raises(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path, "rules: {nope: warn}\n")
    with pytest.raises(ConfigError, match="unknown rule id"):
        PolicyReloader(volume.path, RULES, Holder().set, environ={}).load_initial()


def test_environment_overrides_apply_to_every_generation(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path, ENFORCED)
    holder = Holder()
    env = {"ENVELOPE_RULE_CPU_LIMITS": "warn"}
    reloader = PolicyReloader(volume.path, RULES, holder.set, environ=env)
    reloader.load_initial()
    volume.update(WARNED)
    assert reloader.check()
    assert holder.policy is not None and holder.policy.rules["cpu-limits"] is Mode.WARN


def test_the_thread_picks_a_swap_up_and_stops(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path, ENFORCED)
    holder = Holder()
    reloader = PolicyReloader(volume.path, RULES, holder.set, environ={}, interval=0.05)
    reloader.load_initial()
    reloader.start()
    try:
        volume.update(WARNED)
        deadline = time.monotonic() + 10
        while reloader.generation < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert reloader.generation == 2
    finally:
        reloader.stop()
    assert reloader._thread is not None and not reloader._thread.is_alive()


def _review(obj: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "u", "kind": {"group": "apps", "version": "v1",
                                                        "kind": "Deployment"},
                                   "operation": "CREATE", "namespace": "team-a",
                                   "object": obj}})


def test_reviews_metrics_and_readyz_follow_the_generation(tmp_path: Path) -> None:
    volume = ConfigMapVolume(tmp_path, ENFORCED)
    metrics = Metrics()
    reloader = PolicyReloader(volume.path, RULES, lambda p: None, environ={})
    ReloadMetrics(reloader, metrics.registry)
    app = create_app(RULES, Policy(), metrics=metrics, serving=reloader.describe)
    handler = app.state.handler
    reloader.apply = lambda p: setattr(handler, "policy", p)
    reloader.load_initial()
    below = workload("Deployment", [container(requests={"memory": "512Mi"},
                                              limits={"memory": "1Gi"})])

    async def calls() -> list[Any]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            out = []
            r = await client.post("/validate", content=_review(below),
                                  headers={"content-type": "application/json"})
            out.append(r.json()["response"])
            found = intree.endpoint(RULE)  # as the in-tree path's request finds it
            assert not isinstance(found, str)
            out.append(found.service.handler.policy)  # type: ignore[attr-defined]
            out.append((await client.get("/readyz")).text)
            return out

    intree = next(r.endpoint for r in app.router.routes
                  if isinstance(getattr(r, "endpoint", None), InTreeEndpoint))
    plain, in_tree, ready = asyncio.run(calls())
    assert plain["allowed"] is False and RULE in plain["status"]["message"]
    assert in_tree.rules[RULE] is Mode.OFF and not in_tree.exceptions
    assert ready == f"ok (policy generation 1 sha256 {reloader.sha256[:12]})"
    volume.update(WARNED)
    assert reloader.check()
    plain, in_tree, ready = asyncio.run(calls())
    assert plain["allowed"] is True and any(RULE in w for w in plain["warnings"])
    # The in-tree path's endpoints follow the swap too (with their rules still off).
    assert in_tree.rules[RULE] is Mode.OFF and in_tree.exceptions == handler.policy.exceptions
    assert in_tree.exceptions
    assert ready == f"ok (policy generation 2 sha256 {reloader.sha256[:12]})"
    volume.update("rules: [\n")
    reloader.check()
    text = generate_latest(metrics.registry).decode()
    assert "envelope_policy_generation 2.0" in text
    assert "envelope_policy_reload_failures_total 1.0" in text
    assert (f'envelope_policy_info{{file="{volume.path}",sha256="{reloader.sha256[:12]}"}} 1.0'
            in text)


@pytest.mark.parametrize(("text", "watch", "said"), [
    ("exceptions:\n  - rules: [cpu-limits]\n    namespaceSelector: {matchLabels: {team: a}}\n",
     "Namespace", "restart the pods"),
    ("delegatedExceptions: {allowedRules: [cpu-limits], namespaces: ['*']}\n",
     "EnvelopeException", "EnvelopeException watch"),
])
def test_serve_refuses_a_policy_its_live_view_cannot_answer(tmp_path: Path, text: str, watch: str,
                                                            said: str) -> None:
    """``serve`` opens the Namespace watch at start only for a policy that selects
    namespaces by label, and the EnvelopeException watch only for one that delegates
    exceptions: a reload needing either is refused (restart the pods), not served blind."""
    from types import SimpleNamespace

    from app.cli.serve import _policy_reloader

    volume = ConfigMapVolume(tmp_path, ENFORCED)
    args = SimpleNamespace(config=str(volume.path), policy_reload_interval=2.0)

    def informer(kind: str) -> Any:
        return SimpleNamespace(resource=SimpleNamespace(kind=kind))

    for kinds, loads in ((["Node"], False), (["Node", watch], True)):
        if volume.path.read_text() != ENFORCED:
            volume.update(ENFORCED)
        view = SimpleNamespace(informers=[informer(k) for k in kinds])
        reloader = _policy_reloader(args, RULES, view, Metrics())  # type: ignore[arg-type]
        reloader.environ = {}
        reloader.load_initial()
        volume.update(text)
        assert reloader.check() is loads, kinds
        if not loads:
            assert said in reloader.last_error


def test_the_metrics_port_readyz_names_the_generation_too(tmp_path: Path) -> None:
    """With mTLS on the HTTPS port the kubelet probes the metrics port (app/serve/metrics_server.py)."""
    from app.serve.metrics_server import MetricsServer

    volume, reloader, _ = reloader_on(tmp_path)
    server = MetricsServer(Metrics().registry, "127.0.0.1", 0, ready=lambda: [],
                           serving=reloader.describe)
    server.start()
    try:
        volume.update(WARNED)
        reloader.check()
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=5) as r:
            body = r.read().decode()
    finally:
        server.stop()
    assert body == f"ok (policy generation 2 sha256 {reloader.sha256[:12]})"
