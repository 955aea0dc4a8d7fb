"""The planner's page server without a browser: 127.0.0.1 only, edits judged by the
planner, export refused (409) while an error stands, bad bodies answered 400."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cluster.static import load
from app.core.config import Policy
from app.quotaview.planserve import EditError, Planner, apply_edits, serve
from tests.conftest import RULES

ROOT = Path(__file__).resolve().parents[2]


def demo() -> list[dict[str, Any]]:
    objects = [m.obj for m in load([str(ROOT / "examples/tenancy")]).manifests]
    research = next(o for o in objects if o["kind"] == "Department" and o["metadata"]["name"] == "research")
    research["spec"]["queues"][0]["resources"]["gpu"]["deserved"] = 48
    return objects


@pytest.fixture
def url() -> Iterator[str]:
    server, thread = serve(Planner(demo(), RULES, Policy(), "examples/tenancy", "2026-12-05T12:00:00Z"), 0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def post(url: str, body: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def grow(name: str, value: int) -> dict[str, Any]:
    return {"kind": "Project", "name": name, "pool": "h100", "resource": "gpu", "field": "guarantee",
            "value": value}


def test_edits_are_judged_and_export_waits_for_a_plan_that_fits(url: str) -> None:
    with urllib.request.urlopen(url + "/", timeout=60) as r:
        assert r.status == 200 and b"Envelope quota planner" in r.read()
    code, body = post(url + "/api/judge", json.dumps({"edits": [grow("research-train", 9)]}).encode())
    judged = json.loads(body)
    assert code == 200 and not judged["ok"] and judged["commands"] == []
    assert judged["errors"][0]["name"] == "research-train" and judged["errors"][0]["overReached"]
    assert judged["source"] == "examples/tenancy" and judged["at"] == "2026-12-05T12:00:00Z"
    code, body = post(url + "/api/export", json.dumps({"edits": [grow("research-train", 9)]}).encode())
    assert code == 409 and b"cannot be exported while an error stands" in body
    both = {"edits": [grow("research-train", 9), grow("research-eval", 7)]}
    code, body = post(url + "/api/export", json.dumps(both).encode())
    assert code == 200
    commands = [line for line in body.decode().splitlines() if line.startswith("kubectl")]
    assert [c.split()[3] for c in commands] == ["research-eval", "research-train"]


BAD_EDITS = [dict(grow("research-train", 9), value="x"), dict(grow("research-train", 9), pool="nope"),
             dict(grow("research-train", 9), value="NaN")]


@pytest.mark.parametrize("body", [b"not json", b"[1]", b'{"edits": 3}', b'{"edits": [{"kind": "Project"}]}',
                                  *(json.dumps({"edits": [e]}).encode() for e in BAD_EDITS)])
def test_a_bad_body_is_a_400_with_a_reason(url: str, body: bytes) -> None:
    code, answer = post(url + "/api/judge", body)
    assert code == 400 and json.loads(answer)["error"]


def test_the_server_binds_loopback_only(url: str) -> None:
    assert url.startswith("http://127.0.0.1:")


def test_apply_edits_changes_a_copy() -> None:
    base = demo()
    edited = apply_edits(base, [grow("research-train", 9)])
    train = next(o for o in edited if o["metadata"]["name"] == "research-train")
    assert train["spec"]["queues"][0]["resources"]["gpu"]["deserved"] == 9
    assert next(o for o in base if o["metadata"]["name"] == "research-train")["spec"]["queues"][0][
        "resources"]["gpu"]["deserved"] == 8
    with pytest.raises(EditError):
        apply_edits(base, [dict(grow("research-train", 9), field="priority")])
