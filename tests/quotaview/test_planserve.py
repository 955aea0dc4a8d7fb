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


def added(kind: str, name: str, gpu: int, parent: str = "", pool: str = "h100") -> dict[str, Any]:
    return {"op": "add", "kind": kind, "name": name, "pool": pool, "parent": parent,
            "resources": {"gpu": {"guarantee": gpu, "limit": gpu + 8, "overQuotaWeight": 2}}}


def shrink_research() -> list[dict[str, Any]]:
    """8 h100 cards made free: research-train 8 -> 0, research 48 -> 40."""
    return [grow("research-train", 0), dict(grow("research", 40), kind="Department")]


def test_a_department_and_its_project_are_added_after_the_cards_are_given_up(url: str) -> None:
    """The h100 pool is full: a new department of 8 cards is refused naming it; once
    research gives 8 back, the plan lowers research-train, then research, then creates
    the department, then its project (parent before child, giver before receiver)."""
    code, body = post(url + "/api/judge", json.dumps({"edits": [added("Department", "audio", 8)]}).encode())
    judged = json.loads(body)
    assert code == 200 and not judged["ok"]
    first = judged["errors"][0]
    assert (first["kind"], first["name"], first["rule"], first["overReached"]) == \
        ("Department", "audio", "kai-pool-capacity", True)
    assert "departments are guaranteed 104 cards in total (this one 8 cards)" in first["message"]
    assert any(n["name"] == "audio" for p in judged["tree"]["pools"] for n in p["departments"])
    assert judged["values"]["Department/audio/h100"]["gpu"] == {"guarantee": 8, "limit": 16,
                                                                "overQuotaWeight": 2}
    # The project is listed before its department: the page's order does not matter.
    edits = [added("Project", "audio-asr", 8, "audio"), *shrink_research(), added("Department", "audio", 8)]
    code, body = post(url + "/api/export", json.dumps({"edits": edits}).encode())
    assert code == 200, body
    commands = [line for line in body.decode().splitlines() if line.startswith("kubectl ")]
    assert [c.split()[1:4] for c in commands[:2]] == [["patch", "projects.kai.resources", "research-train"],
                                                      ["patch", "departments.kai.resources", "research"]]
    assert commands[2:] == ["kubectl create -f - <<'EOF'"] * 2
    created = [json.loads(part.split("\nEOF")[0]) for part in body.decode().split("<<'EOF'\n")[1:]]
    assert [(o["kind"], o["metadata"]["name"]) for o in created] == [("Department", "audio"),
                                                                    ("Project", "audio-asr")]
    assert created[1]["spec"] == {"parent": "audio", "queues": [{
        "name": "audio-asr-h100", "nodepool": "h100", "resources": {
            "gpu": {"deserved": 8, "limit": 16, "overQuotaWeight": 2},
            "cpu": {"deserved": 0, "limit": -1, "overQuotaWeight": 1},
            "memory": {"deserved": 0, "limit": -1, "overQuotaWeight": 1}}}]}


def test_a_project_over_its_new_department_is_refused_and_export_blocked(url: str) -> None:
    edits = [*shrink_research(), added("Department", "audio", 8), added("Project", "audio-asr", 9, "audio")]
    code, body = post(url + "/api/judge", json.dumps({"edits": edits}).encode())
    judged = json.loads(body)
    assert code == 200 and not judged["ok"] and judged["commands"] == []
    assert [(e["kind"], e["name"], e["rule"]) for e in judged["errors"]] == [
        ("Project", "audio-asr", "kai-guarantee-sum")]
    assert "projects are guaranteed 9 cards in total but the department has 8 cards" in judged["errors"][0][
        "message"]
    code, _ = post(url + "/api/export", json.dumps({"edits": edits}).encode())
    assert code == 409
    # A number edited on the added project brings it back within its department.
    fixed = [*edits, grow("audio-asr", 8)]
    code, body = post(url + "/api/judge", json.dumps({"edits": fixed}).encode())
    assert code == 200 and json.loads(body)["ok"]


BAD_ADDS = [(added("Department", "Audio_1", 0), "lower-case letters"),
            (added("Department", "audio", 0, pool="a100"), "no NodePool 'a100'"),
            (added("Project", "audio-asr", 0, "audio"), "no Department 'audio' to be its parent"),
            (added("Project", "research-train", 0, "vision"), "exists under Department research"),
            (added("Department", "research", 0), "already has a queue on pool h100"),
            (dict(added("Department", "x" * 60, 0)), "at most 63 characters"),
            (dict(added("Queue", "audio", 0)), "the page adds a Department or a Project"),
            ({**added("Department", "audio", 0), "resources": {"gpu": {"guarantee": "eight"}}},
             "'eight' is not a number")]


@pytest.mark.parametrize(("edit", "reason"), BAD_ADDS)
def test_a_bad_addition_is_a_400_naming_what_to_change(url: str, edit: dict[str, Any], reason: str) -> None:
    code, answer = post(url + "/api/judge", json.dumps({"edits": [edit]}).encode())
    assert code == 400 and reason in json.loads(answer)["error"]


def test_a_queue_on_another_pool_joins_the_object() -> None:
    """Adding a department that exists, on a pool it has no queue on, appends the entry."""
    base = demo()
    edited = apply_edits(base, [added("Department", "platform", 0)])
    platform = next(o for o in edited if o["metadata"]["name"] == "platform")
    assert [q["nodepool"] for q in platform["spec"]["queues"]] == ["rtx-pro-6000", "h100"]
    assert len(next(o for o in base if o["metadata"]["name"] == "platform")["spec"]["queues"]) == 1


def test_a_new_object_that_over_reaches_is_named_first(url: str) -> None:
    """A new department on the full h100 pool and a project over it: the over-reachers are
    the two new objects (a new object grew by all of its guarantee), not nlp, the first
    department the pool's sum is also reported on."""
    edits = [added("Department", "audio", 8), added("Project", "audio-asr", 9, "audio")]
    code, body = post(url + "/api/judge", json.dumps({"edits": edits}).encode())
    errors = json.loads(body)["errors"]
    assert code == 200
    assert [(e["name"], e["rule"], e["overReached"]) for e in errors[:2]] == [
        ("audio-asr", "kai-guarantee-sum", True), ("audio", "kai-pool-capacity", False)]


def test_commit_without_a_git_ref_is_a_404(url: str) -> None:
    code, body = post(url + "/api/commit", json.dumps({"edits": [], "branch": "x"}).encode())
    assert code == 404 and b"start the page with --git-ref" in body
    code, body = post(url + "/api/judge", b"{}")
    assert code == 200 and json.loads(body)["git"] is False
