"""Raising webhooks to their wanted failurePolicy: only those that answer, only up to
what the chart recorded, nothing when nothing changes."""

from __future__ import annotations

import json
from typing import Any

from app.serve.failurepolicy import ANNOTATION, PolicyRaiser, raised


def config(wanted: dict[str, str] | None, **hooks: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "envelope"}
    if wanted is not None:
        meta["annotations"] = {ANNOTATION: json.dumps(wanted)}
    return {"metadata": meta, "webhooks": [
        {"name": name, "failurePolicy": policy, "clientConfig": {"url": f"https://127.0.0.1/{name}"}}
        for name, policy in hooks.items()]}


def test_only_webhooks_that_answer_are_raised() -> None:
    def probe(client_config: dict[str, Any]) -> str | None:
        return None if client_config["url"].endswith("/a") else "connection refused"

    update, why = raised(config({"a": "Fail", "b": "Fail"}, a="Ignore", b="Ignore"), probe)
    assert update is not None
    assert [(h["name"], h["failurePolicy"]) for h in update["webhooks"]] == [("a", "Fail"), ("b", "Ignore")]
    assert why == ["b stays Ignore: connection refused"]


def test_nothing_to_do_is_no_update() -> None:
    def never(client_config: dict[str, Any]) -> str | None:
        raise AssertionError("no probe when nothing is below its wanted policy")

    assert raised(config({"a": "Fail"}, a="Fail"), never) == (None, [])
    assert raised(config(None, a="Ignore"), never) == (None, [])  # no annotation: not ours to raise
    assert raised(config({"a": "Sometimes"}, a="Ignore"), never) == (None, [])
    broken = config(None, a="Ignore")
    broken["metadata"]["annotations"] = {ANNOTATION: "{not json"}
    assert raised(broken, never)[1] == ["envelope: annotation envelope.io/failure-policies is not JSON"]


class FakeClient:
    def __init__(self, stored: dict[str, Any]) -> None:
        self.stored = stored
        self.puts: list[dict[str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        if method == "PUT":
            self.puts.append(body)
            self.stored = body
        return self.stored


def test_a_replica_that_is_not_ready_raises_nothing() -> None:
    client = FakeClient(config({"a": "Fail"}, a="Ignore"))
    ready = False
    raiser = PolicyRaiser(client, [("validatingwebhookconfigurations", "envelope")],  # type: ignore[arg-type]
                          lambda: ready, probe=lambda c: None)
    raiser.step()
    assert client.puts == []
    ready = True
    raiser.step()
    assert [h["failurePolicy"] for h in client.puts[0]["webhooks"]] == ["Fail"]
    raiser.step()
    assert len(client.puts) == 1  # idempotent: raised once


def test_a_lowering_after_the_raise_is_counted_and_exported() -> None:
    """A re-apply of the rendered Ignore (helm upgrade, a GitOps sync) after the raise:
    counted once per lowering, the gauge 1 while it stays below, raised again."""
    from prometheus_client import CollectorRegistry

    from app.serve.failurepolicy import PolicyMetrics

    registry = CollectorRegistry()
    client = FakeClient(config({"a": "Fail", "b": "Ignore"}, a="Ignore", b="Ignore"))
    answers = True
    raiser = PolicyRaiser(client, [("validatingwebhookconfigurations", "envelope")],  # type: ignore[arg-type]
                          lambda: True, probe=lambda c: None if answers else "refused",
                          metrics=PolicyMetrics(registry))

    def sample(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"configuration": "envelope", **labels})

    raiser.step()  # the first raise after install is not a reset
    assert raiser.resets == 0 and sample("envelope_webhook_failure_policy_resets_total") in (None, 0.0)
    assert sample("envelope_webhook_failure_policy_lowered", webhook="a") == 0.0
    assert sample("envelope_webhook_failure_policy_lowered", webhook="b") == 0.0  # wants Ignore
    client.stored = config({"a": "Fail", "b": "Ignore"}, a="Ignore", b="Ignore")  # re-applied
    answers = False  # and it cannot be raised this time
    raiser.step()
    assert raiser.resets == 1
    assert sample("envelope_webhook_failure_policy_resets_total") == 1.0
    assert sample("envelope_webhook_failure_policy_lowered", webhook="a") == 1.0
    raiser.step()  # still below: the same lowering is not counted twice
    assert sample("envelope_webhook_failure_policy_resets_total") == 1.0
    answers = True
    raiser.step()
    assert client.stored["webhooks"][0]["failurePolicy"] == "Fail"
    assert sample("envelope_webhook_failure_policy_lowered", webhook="a") == 0.0
    client.stored = config({"a": "Fail", "b": "Ignore"}, a="Ignore", b="Ignore")
    raiser.step()
    assert sample("envelope_webhook_failure_policy_resets_total") == 2.0


def test_lowered_names_the_webhooks_below_their_wanted_policy() -> None:
    from app.serve.failurepolicy import lowered

    assert lowered(config({"a": "Fail", "b": "Ignore", "c": "Fail"}, a="Ignore", b="Fail", c="Fail")) \
        == ["a", "b"]
    assert lowered(config(None, a="Ignore")) == []


def test_a_change_seen_by_the_watch_wakes_the_raiser_and_a_403_stops_only_the_watch() -> None:
    import threading
    import time

    from app.cluster.kube import ApiError

    class Stream:
        def __init__(self, gate: threading.Event) -> None:
            self.gate = gate

        def stream(self, size: int, decode_content: bool) -> Any:
            self.gate.wait(5)
            yield b'{"type":"MODIFIED"}\n'
            time.sleep(10)

        def release_conn(self) -> None:
            pass

    gate = threading.Event()

    class Watching(FakeClient):
        def __init__(self, stored: dict[str, Any], forbid: bool) -> None:
            super().__init__(stored)
            self.forbid = forbid
            self.watches = 0

        def get(self, path: str, fields: dict[str, Any], timeout: float, stream: bool) -> Any:
            self.watches += 1
            assert fields["fieldSelector"] == "metadata.name=envelope" and fields["watch"] == "true"
            if self.forbid:
                raise ApiError(403, "forbidden")
            return Stream(gate)

    client = Watching(config({"a": "Fail"}, a="Fail"), forbid=False)
    raiser = PolicyRaiser(client, [("validatingwebhookconfigurations", "envelope")],  # type: ignore[arg-type]
                          lambda: True, probe=lambda c: None, interval=60)
    raiser.start()
    try:
        raiser.step()
        client.stored = config({"a": "Fail"}, a="Ignore")  # a re-apply
        started = time.monotonic()
        gate.set()  # ... which the watch reports
        # The raiser writes the policy, then counts the reset: wait for both (the count
        # lands a moment after the write the loop below sees).
        while client.stored["webhooks"][0]["failurePolicy"] != "Fail" or raiser.resets < 1:
            assert time.monotonic() - started < 5, "the watch did not wake the raiser"
            time.sleep(0.01)
        time.sleep(0.1)
        assert raiser.resets == 1
    finally:
        raiser.stop()
    forbidden = Watching(config({"a": "Fail"}, a="Fail"), forbid=True)
    raiser = PolicyRaiser(forbidden, [("validatingwebhookconfigurations", "envelope")],  # type: ignore[arg-type]
                          lambda: True, probe=lambda c: None, interval=0.05)
    raiser.start()
    time.sleep(0.5)
    raiser.stop()
    assert forbidden.watches == 1  # not retried every interval
