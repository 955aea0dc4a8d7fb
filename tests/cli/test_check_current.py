"""`envelope check` on current-format (api.ate.dev) ActorTemplates: the same envelope
rules as the CRD era, placed against the WorkerPools of the input in any namespace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "substrate"


def write(tmp_path: Path, *docs: dict[str, Any]) -> Path:
    path = tmp_path / "input.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


def template(limits: Any, cls: str = "SANDBOX_CLASS_MICROVM", name: str = "agent",
             **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"sandboxConfig": {"sandboxClass": cls, "configName": "default"},
                            "resources": {"limits": limits},
                            "containers": [{"name": "main", "image": "registry.example/a@sha256:00"}], **spec}
    return {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplate",
            "metadata": {"atespace": "team-a", "name": name}, "spec": body}


def mem(amount: str) -> list[dict[str, str]]:
    return [{"name": "memory", "quantity": amount}]


def pool(name: str, namespace: str, cls: str, memory: str, labels: dict[str, str] | None = None
         ) -> dict[str, Any]:
    return {"apiVersion": "ate.dev/v1alpha1", "kind": "WorkerPool",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"replicas": 1, "workerImage": "registry.example/w@sha256:00",
                     "sandboxClasses": [{"name": cls}],
                     "template": {"resources": {"limits": {"memory": memory}}}}}


def check(capsys: pytest.CaptureFixture[str], *paths: Path) -> tuple[int, list[dict[str, Any]]]:
    args = ["check", "-o", "json"]
    for p in paths:
        args += ["-f", str(p)]
    code = main(args)
    return code, json.loads(capsys.readouterr().out)["objects"]


def findings(entries: list[dict[str, Any]], name: str) -> list[str]:
    entry = next(e for e in entries if e["name"] == name)
    return [f"{f['severity']} {f['rule']}: {f['message']}" for f in entry["findings"]]


def test_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, entries = check(capsys, EXAMPLES)
    assert code == 1
    assert findings(entries, "coder") == []
    assert findings(entries, "tiny") == [
        "error actor-microvm-memory-floor: microvm limits.memory 200Mi is below the floor of 256Mi "
        "(128Mi VMM reserve + 128Mi guest minimum)"]
    tiny = next(e for e in entries if e["name"] == "tiny")
    assert (tiny["kind"], tiny["apiVersion"], tiny["namespace"]) == (
        "ActorTemplate", "api.ate.dev/v1alpha1", "team-a")


def test_placement_looks_at_pools_of_every_namespace(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, template(mem("4Gi")),
                 pool("vm", "ns-a", "microvm", "1Gi"), pool("vm", "ns-b", "microvm", "2Gi"),
                 pool("big", "ns-a", "gvisor", "64Gi"))
    code, entries = check(capsys, path)
    assert code == 1
    assert findings(entries, "agent") == [
        "error actor-placement: needs 4Gi memory; the largest microvm WorkerPool in any namespace offers 2Gi"]


def test_a_template_that_fits_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, template(mem("1Gi")), pool("vm", "ns-b", "microvm", "2Gi"))
    code, entries = check(capsys, path)
    assert code == 0
    assert all(e["findings"] == [] for e in entries)


def test_a_version_is_placed_with_its_templates_selector(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    parent = template(mem("512Mi"), workerSelector={"matchLabels": {"tier": "gpu"}})
    version = {"apiVersion": "api.ate.dev/v1alpha1", "kind": "ActorTemplateVersion",
               "metadata": {"atespace": "team-a", "name": "agent-v1"}, "actorTemplate": {"name": "agent"},
               "spec": {"sandboxConfig": {"sandboxClass": "SANDBOX_CLASS_MICROVM"},
                        "resources": {"limits": mem("512Mi")}}}
    path = write(tmp_path, parent, version, pool("vm", "ns", "microvm", "2Gi", {"tier": "cpu"}))
    code, entries = check(capsys, path)
    assert code == 1
    assert findings(entries, "agent-v1") == [
        "error actor-placement: workerSelector tier=gpu matches none of the 1 microvm WorkerPools "
        "in any namespace"]


def test_requests_and_malformed_limits_are_refused(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with_requests = template(mem("1Gi"), name="sized")
    with_requests["spec"]["resources"]["requests"] = mem("1Gi")
    path = write(tmp_path, with_requests, template("1Gi", name="bad"), pool("vm", "ns", "microvm", "2Gi"))
    code, entries = check(capsys, path)
    assert code == 1
    assert any("actor-no-requests" in f for f in findings(entries, "sized"))
    assert findings(entries, "bad")[0] == (
        "error actor-limits: spec.resources.limits: expected a list of {name, quantity}, got str")


def test_gvisor_templates_use_gvisor_pools(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, template(mem("8Gi"), cls="SANDBOX_CLASS_GVISOR"),
                 pool("vm", "ns", "microvm", "64Gi"), pool("sandbox", "ns", "gvisor", "4Gi"))
    code, entries = check(capsys, path)
    assert code == 1
    assert findings(entries, "agent") == [
        "error actor-placement: needs 8Gi memory; the largest gvisor WorkerPool in any namespace offers 4Gi"]


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def test_unreadable_limits_follow_actor_limits_warn_mode(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """What the conversion of a current-format template cannot read is an actor-limits
    finding given to the engine: in warn mode it is a warning, and check passes."""
    path = write(tmp_path, template("1Gi", name="bad"), pool("vm", "ns", "microvm", "2Gi"))
    policy = _policy(tmp_path, "rules: {actor-limits: warn}\n")
    code = main(["check", "-o", "json", "--config", str(policy), "-f", str(path)])
    entries = json.loads(capsys.readouterr().out)["objects"]
    assert findings(entries, "bad") == [
        "warning actor-limits: spec.resources.limits: expected a list of {name, quantity}, got str"]
    assert code == 0


def test_unreadable_limits_of_an_exempt_template_are_not_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    annotated = template("1Gi", name="bad")
    annotated["metadata"]["annotations"] = {"envelope.io/exempt": "actor-limits"}
    path = write(tmp_path, annotated, pool("vm", "ns", "microvm", "2Gi"))
    code, entries = check(capsys, path)
    entry = next(e for e in entries if e["name"] == "bad")
    assert entry["findings"] == []
    assert entry["skipped"] == [{"rule": "actor-limits",
                                 "reason": "annotation envelope.io/exempt"}]
    assert code == 0


def test_unreadable_limits_follow_policy_exceptions_and_off(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    labelled = template("1Gi", name="bad")
    labelled["metadata"]["labels"] = {"tier": "experimental"}
    path = write(tmp_path, labelled, pool("vm", "ns", "microvm", "2Gi"))
    excepted = _policy(tmp_path, "exceptions:\n- rules: [actor-limits]\n  kinds: [ActorTemplate]\n"
                                 "  objectSelector: {matchLabels: {tier: experimental}}\n"
                                 "  reason: trial\n")
    code = main(["check", "-o", "json", "--config", str(excepted), "-f", str(path)])
    entry = next(e for e in json.loads(capsys.readouterr().out)["objects"] if e["name"] == "bad")
    assert (code, entry["findings"]) == (0, [])
    assert entry["skipped"][0]["rule"] == "actor-limits"
    off = _policy(tmp_path, "rules: {actor-limits: \"off\"}\n")
    code = main(["check", "-o", "json", "--config", str(off), "-f", str(path)])
    entry = next(e for e in json.loads(capsys.readouterr().out)["objects"] if e["name"] == "bad")
    assert (code, entry["findings"]) == (0, [])
