"""Raising webhooks to their wanted failurePolicy: only those that answer, only up to
what the chart recorded, nothing when nothing changes."""

from __future__ import annotations

import json
from typing import Any

from app.failurepolicy import ANNOTATION, PolicyRaiser, raised


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
